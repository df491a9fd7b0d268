"""Scenarios 3 and 6: many 10 Mbit/s flows on one worker (loss, CPU), and the edge's memory.

Each flow is a real flow of ``mp-edge`` (RTP in, one RTP output) created through the REST API,
fed by its own ``RtpGenerator`` (all of them driven by one trio loop, start times staggered) and
counted by its own sink. Loss is counted as in the rate search: sent minus what reached the sink
socket (read and checked by RTP sequence, or dropped by the kernel on the sink's own socket).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import multiprocessing
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.edge_forward import free_port
from bench.scenarios import profile as profiler
from bench.scenarios.common import (
    Options,
    ProcessTarget,
    Row,
    cores,
    create_flow,
    edge,
    have,
    log,
    machine,
    memory_kib,
    pps_for_ts_mbps,
    sink_child,
    srt_live_transmit_argv,
    ts_mbps,
    udp_sockets,
    wait_udp_bound,
    worker_pid,
    worker_pids,
)
from bench.tools.procfs import tree_cpu_seconds
from bench.tools.rtpgen import GeneratorReport

FLOW_MBPS = 10.0  # TS bitrate of each flow
FLOW_PPS = pps_for_ts_mbps(FLOW_MBPS)  # ~950 datagrams/s
RSS_GOAL_MB = 30.0


CATCH_UP_CALLS = 16
SWEEP_S = 0.010  # one pass over every generator: ~9 datagrams per flow per sendmmsg at 10 Mbit/s
# What one generator process sends without falling behind (measured: one process kept 50 x 950
# pkt/s = 47.5k pkt/s up for 60 s on this 2-core host); above it the flows are spread over processes.
GENERATOR_PPS_PER_PROCESS = 45_000.0
GENERATOR_LEAD_S = 0.3  # forked generator processes all start this long after the fork
SHORT_SHARE = 0.9  # below 90 % of the target rate the generator, not the edge, was the limit


def send_flows(
    ports: list[int],
    seconds: float,
    *,
    at: tuple[float, Callable[[], None]] | None = None,
    pps: float = FLOW_PPS,
    first_sequence: int = 0,
    start_at: float | None = None,
) -> list[GeneratorReport]:
    """One paced RTP stream of ``pps`` (default 10 Mbit/s) to each port for ``seconds`` (bounded);
    the reports in order.

    One loop sweeps every generator every ``SWEEP_S`` and each sends what is due in one
    ``sendmmsg``. (``RtpGenerator.arun`` per flow under trio wakes once per due datagram: at 50
    flows that is 47,500 timer wake-ups a second, and trio's millisecond epoll timeouts left the
    streams at a third of their rate.) Start times are staggered across one sweep.
    ``at``: (seconds after the start, callback) to sample something mid-run. ``start_at``: a
    ``perf_counter`` time to start at (CLOCK_MONOTONIC: the same clock in every process, so
    forked generators start together).
    """
    from bench.tools.rtpgen import MAX_BATCH, RtpGenerator

    # A sweep's worth of datagrams per sendmmsg (at least 16, as at 10 Mbit/s).
    batch = max(16, min(MAX_BATCH, math.ceil(pps * SWEEP_S) + 1))
    gens = [
        RtpGenerator(("127.0.0.1", port), pps=pps, seconds=seconds, batch=batch, first_sequence=first_sequence)
        for port in ports
    ]
    try:
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.perf_counter()))
        start = time.perf_counter()
        for index, gen in enumerate(gens):
            # RtpGenerator.run()/arun() set this themselves; step() is driven here instead.
            gen._start = start + SWEEP_S * index / len(gens)
        reports: dict[int, GeneratorReport] = {}
        pending_callback = at
        deadline = start + seconds + 10  # bounded even if a socket never drains
        while len(reports) < len(gens) and time.perf_counter() < deadline:
            now = time.perf_counter()
            for index, gen in enumerate(gens):
                if index in reports:
                    continue
                delay = gen.step(now)
                for _ in range(CATCH_UP_CALLS):  # behind (the sweep slept long): send the backlog now
                    if delay != 0.0:
                        break
                    delay = gen.step(now)
                if delay is None:
                    elapsed = now - gen._start
                    reports[index] = GeneratorReport(
                        sent=gen.sent,
                        seconds=round(elapsed, 4),
                        pps=round(gen.sent / elapsed, 1) if elapsed > 0 else 0.0,
                        target_pps=gen.pps,
                        send_stalls=gen.send_stalls,
                        first_sequence=gen.first_sequence,
                        ssrc=gen.ssrc,
                    )
            if pending_callback is not None and now - start >= pending_callback[0]:
                pending_callback[1]()
                pending_callback = None
            time.sleep(max(0.0, SWEEP_S - (time.perf_counter() - now)))
        return [reports[i] for i in sorted(reports)]
    finally:
        for gen in gens:
            gen.close()


def generator_processes(flows: int, pps: float) -> int:
    """How many processes send ``flows`` streams of ``pps``: enough that none carries more than
    ``GENERATOR_PPS_PER_PROCESS``, at most one per core (more would only take turns on a core)."""
    wanted = math.ceil(flows * pps / GENERATOR_PPS_PER_PROCESS)
    return max(1, min(wanted, cores(), flows))


def _send_slice(
    ports: list[int], seconds: float, pps: float, first_sequence: int, start_at: float
) -> tuple[list[GeneratorReport], float]:
    """One generator process's share (runs in a forked child): its reports and its CPU seconds."""
    cpu = time.process_time()
    reports = send_flows(ports, seconds, pps=pps, first_sequence=first_sequence, start_at=start_at)
    return reports, time.process_time() - cpu


def send_flows_spread(
    ports: list[int],
    seconds: float,
    *,
    pps: float = FLOW_PPS,
    processes: int | None = None,
    at: tuple[float, Callable[[], None]] | None = None,
    first_sequence: int = 0,
) -> tuple[list[GeneratorReport], float, int]:
    """``send_flows`` with the ports dealt over ``processes`` forked generators (default: sized by
    ``generator_processes``), all starting together; (reports in port order, the generators' CPU
    seconds, the process count). One process runs here, in this process, as before.

    Fork, not spawn: a spawned child imports the bench again (a second per child on a busy host)
    and the parent holds no threads at this point. ``at`` runs in this process.
    """
    count = processes or generator_processes(len(ports), pps)
    if count <= 1:
        cpu = time.process_time()
        reports = send_flows(ports, seconds, at=at, pps=pps, first_sequence=first_sequence)
        return reports, time.process_time() - cpu, 1
    slices = [list(range(k, len(ports), count)) for k in range(count)]  # interleaved: each slice's rates equal
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        start_at = time.perf_counter() + GENERATOR_LEAD_S
        futures = [
            pool.submit(_send_slice, [ports[i] for i in indexes], seconds, pps, first_sequence, start_at)
            for indexes in slices
        ]
        if at is not None:
            time.sleep(max(0.0, start_at + at[0] - time.perf_counter()))
            at[1]()
        # Bounded: send_flows stops by itself 10 s past its seconds.
        results = [future.result(timeout=seconds + GENERATOR_LEAD_S + 30) for future in futures]
    ordered: list[GeneratorReport | None] = [None] * len(ports)
    for indexes, (slice_reports, _cpu) in zip(slices, results, strict=True):
        for index, report in zip(indexes, slice_reports, strict=False):
            ordered[index] = report
    return [r for r in ordered if r is not None], sum(cpu for _reports, cpu in results), count


def _create_flows(url: str, first: int, count: int, sink_ports: list[int], prefix: str = "mf") -> list[int]:
    inputs = []
    for index in range(first, first + count):
        port = free_port(socket.SOCK_DGRAM)
        create_flow(url, f"{prefix}{index}", port, [sink_ports[index]])
        inputs.append(port)
    for port in inputs:
        wait_udp_bound(port, timeout=30)
    return inputs


def _missing(reports: list[GeneratorReport], sink_reports: list[dict[str, Any]], drops: list[int]) -> int:
    return sum(max(0, r.sent - (s["received"] + d)) for r, s, d in zip(reports, sink_reports, drops, strict=False))


def _settle(
    sinks: Any, count: int, sink_ports: list[int], input_ports: list[int], limit_s: float = 30.0
) -> tuple[list[dict[str, Any]], int]:
    """Sink reports once the edge inputs and the sinks hold nothing and the counts stopped moving.

    Also returns the bytes still queued at the edge inputs when ``limit_s`` ran out (0: drained):
    a backlog the edge had not worked off, reported as such.
    """
    started = time.monotonic()
    last, last_change = -1, started
    while True:
        reports: list[dict[str, Any]] = sinks.command("report")["sinks"][:count]
        total = sum(r["received"] for r in reports)
        now = time.monotonic()
        if total != last:
            last, last_change = total, now
        queued = udp_sockets()
        backlog = sum(queued.get(p, (0, 0))[0] for p in input_ports)
        empty = backlog == 0 and all(queued.get(p, (0, 0))[0] == 0 for p in sink_ports)
        if (empty and now - last_change >= 0.3) or now - started > limit_s:
            return reports, backlog
        time.sleep(0.1)


@dataclass
class MultiStep:
    """``flows`` streams of ``pps`` each through the edge for ``seconds``, as scenarios 3 and 7
    measure it. ``cpu_s``: the edge's process tree while sending; ``total_cpu_s``: until the
    outputs were quiet (the drain included); ``worker_cpu_s``: its engine workers while sending."""

    flows: int
    pps: float  # target per flow
    sent: int
    send_s: float  # mean over the generators
    wall_s: float
    missing: int
    input_drops: int
    sink_drops: int
    seq_lost: int
    cpu_s: float
    total_cpu_s: float
    worker_cpu_s: float
    settle_s: float
    backlog: int
    generator_cpu_s: float
    processes: int

    @property
    def achieved_pps(self) -> float:
        """Aggregate datagrams per second the generators sent."""
        return self.sent / max(self.send_s, 1e-9)

    @property
    def short(self) -> bool:
        """The generators fell below ``SHORT_SHARE`` of the target: they were the limit."""
        return self.achieved_pps < SHORT_SHARE * self.flows * self.pps

    @property
    def lossless(self) -> bool:
        return self.sent > 0 and self.missing == 0 and self.backlog == 0

    @property
    def us_per_packet(self) -> float:
        """Edge CPU per datagram including the drain (scenario 3's figure since issue 3)."""
        return self.total_cpu_s / max(self.sent, 1) * 1e6

    def record(self) -> dict[str, Any]:
        return {
            "flows": self.flows,
            "target_pps_per_flow": round(self.pps, 1),
            "achieved_pps": round(self.achieved_pps),
            "mbps_per_flow": round(ts_mbps(self.achieved_pps) / max(self.flows, 1), 2),
            "sent": self.sent,
            "missing": self.missing,
            "input_drops": self.input_drops,
            "sink_drops": self.sink_drops,
            "seq_lost": self.seq_lost,
            "edge_cpu_s": round(self.cpu_s, 2),
            "edge_cpu_s_incl_drain": round(self.total_cpu_s, 2),
            "worker_cpu_s": round(self.worker_cpu_s, 2),
            "us_per_packet": round(self.us_per_packet, 2),
            "seconds": round(self.wall_s, 2),
            "settle_s": round(self.settle_s, 1),
            "input_backlog_bytes_at_limit": self.backlog,
            "generator_cpu_s": round(self.generator_cpu_s, 2),
            "generator_processes": self.processes,
            "generator_short": self.short,
        }


def multi_step(
    pid: int,
    sinks: Any,
    inputs: list[int],
    seconds: float,
    *,
    pps: float = FLOW_PPS,
    at: tuple[float, Callable[[], None]] | None = None,
    first_sequence: int = 0,
    settle_limit_s: float = 30.0,
) -> MultiStep:
    """Send ``seconds`` of ``pps`` to every input (sink i counts input i), wait for the outputs
    to go quiet, and count: loss (sent - read by the sink - dropped on the sink's own socket),
    edge CPU, the generators' rate."""
    flows = len(inputs)
    sink_ports = sinks.ports[:flows]
    sinks.command("reset")
    kernel_before = udp_sockets()
    workers = worker_pids(pid)
    cpu_before = tree_cpu_seconds(pid)
    workers_before = sum(tree_cpu_seconds(w) for w in workers)
    started = time.monotonic()
    reports, generator_cpu, processes = send_flows_spread(
        inputs, seconds, pps=pps, at=at, first_sequence=first_sequence
    )
    wall = time.monotonic() - started
    cpu = tree_cpu_seconds(pid) - cpu_before
    worker_cpu = sum(tree_cpu_seconds(w) for w in workers) - workers_before
    settle_started = time.monotonic()
    sink_reports, backlog = _settle(sinks, flows, sink_ports, inputs, settle_limit_s)
    settle_s = time.monotonic() - settle_started
    total_cpu = tree_cpu_seconds(pid) - cpu_before
    kernel_after = udp_sockets()

    def drops(port: int) -> int:
        return kernel_after.get(port, (0, 0))[1] - kernel_before.get(port, (0, 0))[1]

    sink_drops = [drops(p) for p in sink_ports]
    return MultiStep(
        flows=flows,
        pps=pps,
        sent=sum(r.sent for r in reports),
        send_s=sum(r.seconds for r in reports) / max(1, len(reports)),
        wall_s=wall,
        missing=_missing(reports, sink_reports, sink_drops),
        input_drops=sum(drops(p) for p in inputs),
        sink_drops=sum(sink_drops),
        seq_lost=sum(s["lost"] for s in sink_reports),
        cpu_s=cpu,
        total_cpu_s=total_cpu,
        worker_cpu_s=worker_cpu,
        settle_s=settle_s,
        backlog=backlog,
        generator_cpu_s=generator_cpu,
        processes=processes,
    )


def _s1_cpu_per_packet(opts: Options) -> float | None:
    """Scenario 1's CPU per packet for mediaplane at its best step, when it ran in this run."""
    best = (opts.record.get("scenario_1") or {}).get("mediaplane", {}).get("best") or {}
    value = best.get("cpu_us_per_packet")
    return float(value) if value else None


def scenario_3(opts: Options) -> list[Row]:
    """Every count of ``opts.multiflow_counts`` (50, 100, 200) on one worker, flows added to the
    same edge between counts; one row per count and a summary row."""
    counts = sorted(opts.multiflow_counts)
    steps: dict[int, MultiStep] = {}
    holder: dict[str, Any] = {}
    raw = opts.workdir / "py-spy-s3.txt"
    with edge(opts, "s3") as (url, pid), sink_child(counts[-1]) as sinks:
        inputs: list[int] = []
        for count in counts:
            inputs += _create_flows(url, len(inputs), count - len(inputs), sinks.ports)
            log(
                f"[s3] {count} flows; sending {FLOW_MBPS:.0f} Mbit/s each for {opts.multiflow_seconds:.0f} s"
                f" ({generator_processes(count, FLOW_PPS)} generator process(es); {machine()})"
            )
            worker = worker_pid(pid)

            def start_profile(worker: int | None = worker) -> None:
                if worker is not None:
                    holder["process"] = profiler.start(worker, opts.profile_seconds, raw)

            # py-spy at the count only (the first): one profile per run is what the README reads.
            profile_now = opts.profile and count == counts[0]
            at = (opts.multiflow_seconds / 3, start_profile) if profile_now else None
            steps[count] = multi_step(pid, sinks, inputs, opts.multiflow_seconds, at=at)
            log(f"[s3] {count} flows: {steps[count].record()}")
            if profile_now and holder.get("process") is not None:
                profile = profiler.finish(holder.pop("process"), raw)
                if profile is not None:
                    lines = profile.lines()
                    opts.record.setdefault("profiles", {})["s3"] = {"summary": lines, "raw": str(raw)}
                    log(f"[s3] py-spy on the engine worker, {count} flows:")
                    for line in lines:
                        log("    " + line)
        for index in range(len(inputs)):
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{url}/api/v1/flows/mf{index}", timeout=30)

    reference = _s1_cpu_per_packet(opts)
    first = steps[counts[0]]
    cpu_ratio = first.us_per_packet / reference if reference else None
    held = [c for c in counts if steps[c].lossless and not steps[c].short]
    largest = max(held) if held else 0
    # A count with 0 lost at a short generator rate is not held at 10 Mbit/s, but it is not the
    # edge's loss either: the summary says which counts only the generator kept from the test.
    short_clean = [c for c in counts if steps[c].lossless and steps[c].short]
    opts.record["scenario_3"] = first.record()  # the count, where older runs kept it
    opts.record["scenario_3_counts"] = {
        "counts": {str(c): steps[c].record() for c in counts},
        "largest_zero_loss_count": largest,
        "zero_loss_but_generator_short": short_clean,
        "scenario_1_us_per_packet": reference,
        "cpu_per_packet_ratio_to_scenario_1": round(cpu_ratio, 2) if cpu_ratio else None,
    }
    rows = [_count_row(f"3{chr(ord('a') + k)}", steps[c]) for k, c in enumerate(counts)]
    ratio_text = (
        f"{first.us_per_packet:.1f} / {reference:.1f} us/pkt = {cpu_ratio:.2f}x"
        if cpu_ratio
        else "n/a (scenario 1 did not run)"
    )
    summary = (
        f"largest count held at zero loss: {largest} flows ({ts_mbps(largest * FLOW_PPS):,.0f} Mbit/s)"
        if largest
        else f"no count held at zero loss at the full rate (tried {', '.join(map(str, counts))})"
    )
    if short_clean:
        summary += (
            f"; 0 lost but GENERATOR SHORT at {', '.join(map(str, short_clean))} flows (the edge got "
            + ", ".join(f"{ts_mbps(steps[c].achieved_pps):,.0f}" for c in short_clean)
            + " Mbit/s in all)"
        )
    summary += f"; CPU/pkt at {counts[0]} flows vs scenario 1's single flow: {ratio_text}"
    rows.append(
        Row(
            "3",
            "flows x 10 Mbit/s on one worker: summary",
            summary,
            "-",
            f"{cpu_ratio:.2f}x s1 CPU/pkt" if cpu_ratio else "-",
            f"<= 1.5x scenario 1's CPU/pkt at {counts[0]} flows",
            None if cpu_ratio is None else cpu_ratio <= 1.5,
        )
    )
    return rows


def _count_row(number: str, step: MultiStep) -> Row:
    """One scenario-3 count: loss, generator rate, backlog, CPU."""
    mbps = ts_mbps(step.achieved_pps) / max(step.flows, 1)
    short = " (GENERATOR SHORT)" if step.short else ""
    ours = (
        f"{step.flows} x {mbps:.1f} Mbit/s{short} for {step.send_s:.0f} s"
        f" ({step.processes} generator process{'es' if step.processes > 1 else ''}): "
        f"{step.missing:,} of {step.sent:,} lost"
        + (f" (edge inputs still held {step.backlog:,} bytes after the settle limit)" if step.backlog else "")
        + f", outputs quiet {step.settle_s:.1f} s after the end; "
        f"CPU {step.cpu_s / max(step.wall_s, 1e-9):.0%} of a core while sending "
        f"(worker {step.worker_cpu_s / max(step.wall_s, 1e-9):.0%}), "
        f"{step.us_per_packet:.1f} us/pkt incl. the drain"
    )
    met = step.lossless and not step.short
    return Row(number, f"{step.flows} flows x 10 Mbit/s on one worker", ours, "-", "-", "0 lost at 10 Mbit/s each", met)


def scenario_6(opts: Options) -> list[Row]:
    flows = opts.flows
    traffic_s = 0.5 if opts.quick else 4.0
    samples: dict[str, tuple[int, int]] = {}
    with edge(opts, "s6") as (url, pid), sink_child(flows) as sinks:
        time.sleep(0.5 if opts.quick else 2.0)
        samples["idle"] = memory_kib(pid)

        def sample(key: str) -> tuple[float, Callable[[], None]]:
            return traffic_s * 0.75, lambda: samples.__setitem__(key, memory_kib(pid))

        inputs = _create_flows(url, 0, 1, sinks.ports)
        send_flows(inputs, traffic_s, at=sample("1 flow"))
        inputs += _create_flows(url, 1, flows - 1, sinks.ports)
        send_flows(inputs, traffic_s, at=sample(f"{flows} flows"))
    peer = _srt_memory(opts, traffic_s) if have("srt-live-transmit") else None
    idle, one, many = samples["idle"][0], samples["1 flow"][0], samples[f"{flows} flows"][0]
    per_flow_1 = (one - idle) / 1024
    per_flow_n = (many - idle) / 1024 / flows
    worst = max(per_flow_1, per_flow_n)
    opts.record["scenario_6"] = {
        "rss_kib": {k: v[0] for k, v in samples.items()},
        "pss_kib": {k: v[1] for k, v in samples.items()},
        "srt_live_transmit_rss_kib": peer,
    }
    log(f"[s6] {opts.record['scenario_6']}")
    ours = (
        f"RSS idle {idle / 1024:.0f} MB, 1 flow {one / 1024:.0f} MB, {flows} flows {many / 1024:.0f} MB "
        f"(PSS {samples['idle'][1] / 1024:.0f}/{samples['1 flow'][1] / 1024:.0f}/"
        f"{samples[f'{flows} flows'][1] / 1024:.0f}); per running flow: +{per_flow_1:.1f} MB (1st), "
        f"+{per_flow_n:.2f} MB (mean of {flows})"
    )
    peer_text = f"srt-live-transmit: {peer / 1024:.1f} MB RSS per flow (one process each)" if peer else "-"
    ratio_text = f"vs srt {worst * 1024 / peer:.2f}x per flow" if peer else "-"
    return [
        Row(
            "6",
            "Memory: RSS of mp-edge (all processes)",
            ours,
            peer_text,
            ratio_text,
            "< 30 MB per flow",
            worst < RSS_GOAL_MB,
        )
    ]


def _srt_memory(opts: Options, seconds: float) -> int | None:
    """RSS (KiB) of one srt-live-transmit forwarding a 10 Mbit/s flow: a user's one-process-per-flow peer."""
    target = ProcessTarget("srt-live-transmit-mem", srt_live_transmit_argv, opts.workdir)
    with sink_child(1) as sinks:
        port = target.open(sinks.ports)
        try:
            result: dict[str, int] = {}

            def sample() -> None:
                assert target.process is not None
                result["rss"] = memory_kib(target.process.pid)[0]

            send_flows([port], seconds, at=(seconds * 0.75, sample))
            return result.get("rss")
        finally:
            target.close()
