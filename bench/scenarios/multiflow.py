"""Scenarios 3 and 6: many 10 Mbit/s flows on one worker (loss, CPU), and the edge's memory.

Each flow is a real flow of ``mp-edge`` (RTP in, one RTP output) created through the REST API,
fed by its own ``RtpGenerator`` (all of them driven by one trio loop, start times staggered) and
counted by its own sink. Loss is counted as in the rate search: sent minus what reached the sink
socket (read and checked by RTP sequence, or dropped by the kernel on the sink's own socket).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.edge_forward import free_port
from bench.scenarios import profile as profiler
from bench.scenarios.common import (
    TS_BYTES,
    Options,
    ProcessTarget,
    Row,
    create_flow,
    edge,
    have,
    log,
    memory_kib,
    pps_for_ts_mbps,
    sink_child,
    srt_live_transmit_argv,
    udp_sockets,
    wait_udp_bound,
    worker_pid,
)
from bench.tools.procfs import tree_cpu_seconds
from bench.tools.rtpgen import GeneratorReport

FLOW_MBPS = 10.0  # TS bitrate of each flow
FLOW_PPS = pps_for_ts_mbps(FLOW_MBPS)  # ~950 datagrams/s
RSS_GOAL_MB = 30.0


CATCH_UP_CALLS = 16
SWEEP_S = 0.010  # one pass over every generator: ~9 datagrams per flow per sendmmsg at 10 Mbit/s


def send_flows(
    ports: list[int], seconds: float, *, at: tuple[float, Callable[[], None]] | None = None
) -> list[GeneratorReport]:
    """One paced 10 Mbit/s RTP stream to each port for ``seconds`` (bounded); the reports in order.

    One loop sweeps every generator every ``SWEEP_S`` and each sends what is due in one
    ``sendmmsg``. (``RtpGenerator.arun`` per flow under trio wakes once per due datagram: at 50
    flows that is 47,500 timer wake-ups a second, and trio's millisecond epoll timeouts left the
    streams at a third of their rate.) Start times are staggered across one sweep.
    ``at``: (seconds after the start, callback) to sample something mid-run.
    """
    from bench.tools.rtpgen import RtpGenerator

    gens = [RtpGenerator(("127.0.0.1", port), pps=FLOW_PPS, seconds=seconds, batch=16) for port in ports]
    try:
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


def _create_flows(url: str, first: int, count: int, sink_ports: list[int]) -> list[int]:
    inputs = []
    for index in range(first, first + count):
        port = free_port(socket.SOCK_DGRAM)
        create_flow(url, f"mf{index}", port, [sink_ports[index]])
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


def scenario_3(opts: Options) -> list[Row]:
    flows = opts.flows
    with edge(opts, "s3") as (url, pid), sink_child(flows) as sinks:
        inputs = _create_flows(url, 0, flows, sinks.ports)
        log(f"[s3] {flows} flows created; sending {FLOW_MBPS:.0f} Mbit/s each for {opts.multiflow_seconds:.0f} s")
        sinks.command("reset")
        kernel_before = udp_sockets()
        worker = worker_pid(pid)
        cpu_before, worker_before = tree_cpu_seconds(pid), tree_cpu_seconds(worker) if worker else 0.0
        started = time.monotonic()
        generator_cpu = time.process_time()
        holder: dict[str, Any] = {}
        raw = opts.workdir / "py-spy-s3.txt"

        def start_profile() -> None:
            if worker is not None:
                holder["process"] = profiler.start(worker, opts.profile_seconds, raw)

        at = (opts.multiflow_seconds / 3, start_profile) if opts.profile else None
        reports = send_flows(inputs, opts.multiflow_seconds, at=at)
        generator_cpu = time.process_time() - generator_cpu
        wall = time.monotonic() - started
        cpu, worker_cpu = (
            tree_cpu_seconds(pid) - cpu_before,
            (tree_cpu_seconds(worker) - worker_before) if worker else 0,
        )
        settle_started = time.monotonic()
        sink_reports, backlog = _settle(sinks, flows, sinks.ports[:flows], inputs)
        settle_s = time.monotonic() - settle_started
        total_cpu = tree_cpu_seconds(pid) - cpu_before
        kernel_after = udp_sockets()
        for index in range(flows):
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{url}/api/v1/flows/mf{index}", timeout=30)

    if holder.get("process") is not None:
        profile = profiler.finish(holder["process"], raw)
        if profile is not None:
            lines = profile.lines()
            opts.record.setdefault("profiles", {})["s3"] = {"summary": lines, "raw": str(raw)}
            log(f"[s3] py-spy on the engine worker, {flows} flows:")
            for line in lines:
                log("    " + line)

    def drops(port: int) -> int:
        return kernel_after.get(port, (0, 0))[1] - kernel_before.get(port, (0, 0))[1]

    sink_drops = [drops(p) for p in sinks.ports[:flows]]
    input_drops = sum(drops(p) for p in inputs)
    missing = _missing(reports, sink_reports, sink_drops)
    sent = sum(r.sent for r in reports)
    send_s = sum(r.seconds for r in reports) / max(1, len(reports))
    achieved_mbps = sent * TS_BYTES * 8 / 1e6 / max(send_s, 1e-9) / flows
    short = achieved_mbps < 0.9 * FLOW_MBPS  # the generator could not keep 50 paced streams up
    opts.record["scenario_3"] = {
        "flows": flows,
        "seconds": round(wall, 2),
        "sent": sent,
        "missing": missing,
        "input_drops": input_drops,
        "sink_drops": sum(sink_drops),
        "seq_lost": sum(s["lost"] for s in sink_reports),
        "edge_cpu_s": round(cpu, 2),
        "worker_cpu_s": round(worker_cpu, 2),
        "mbps_per_flow": round(achieved_mbps, 2),
        "generator_short": short,
        "settle_s": round(settle_s, 1),
        "generator_cpu_s": round(generator_cpu, 2),
        "input_backlog_bytes_at_limit": backlog,
    }
    log(f"[s3] {opts.record['scenario_3']}")
    ours = (
        f"{flows} x {achieved_mbps:.1f} Mbit/s{' (GENERATOR SHORT)' if short else ''} for {send_s:.0f} s: "
        f"{missing} of {sent:,} lost"
        + (f" (edge inputs still held {backlog:,} bytes after 30 s)" if backlog else "")
        + f", outputs quiet {settle_s:.1f} s after the end; "
        f"CPU {cpu / wall:.0%} of a core while sending (worker {worker_cpu / wall:.0%}), "
        f"{total_cpu / max(sent, 1) * 1e6:.1f} us/pkt incl. the drain"
    )
    met = missing == 0 and not short
    return [Row("3", f"{flows} flows x 10 Mbit/s on one worker", ours, "-", "-", "0 lost at 10 Mbit/s each", met)]


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
