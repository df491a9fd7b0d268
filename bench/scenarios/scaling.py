"""Scenario 7: scaling over workers. K flows of equal rate on ``mp-edge --workers W``, W = 1, 2,
... up to the CPUs this process may use; for each W the highest aggregate zero-loss rate.

Per W: a fresh edge with W workers, K flows created through the API (one RTP output each, its
own sink), then a search over the per-flow rate: double from a start until a step loses (or
leaves a backlog), then bisect, every step ``STEP_S`` long, at most ``MAX_STEPS`` steps and
``BUDGET_S`` seconds per W. The generator is ``multiflow.send_flows_spread``: the flows dealt over
as many forked processes as the rate needs, at most one per core; each step records what it
achieved, and a step below 90 % of its target ends the climb (the generator, not the edge, was
the limit; the row says so). Loss is counted as in scenario 3. Per W the row gives the aggregate
rate, its ratio to W = 1, the edge's CPU at that step, and how many flows each worker got and
how busy it was (``GET /api/v1/system/diagnostics`` -> ``engine.workers``, sampled mid-step; "n/a"
while the edge does not report it).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.scenarios.common import (
    Options,
    Row,
    cores,
    edge,
    engine_workers,
    fmt_pps,
    log,
    machine,
    sink_child,
    ts_mbps,
)
from bench.scenarios.multiflow import MultiStep, _create_flows, multi_step

MAX_WORKERS = 8  # bounded however many CPUs the host has
FLOWS_PER_WORKER = 4  # K = 4 x the largest W: every worker gets several flows to place
START_AGGREGATE_PPS = 20_000.0
MAX_AGGREGATE_PPS = 400_000.0
RESOLUTION = 0.10  # bisection stops when the bracket is this narrow (relative)
STEP_S, MAX_STEPS, BUDGET_S = 2.0, 7, 75.0
QUICK_STEP_S, QUICK_MAX_STEPS, QUICK_BUDGET_S = 0.5, 1, 5.0
SETTLE_LIMIT_S = 8.0  # a step that leaves more backlog than this drains is a loss anyway


@dataclass
class WorkerRun:
    """The search for one W: every step, the best clean one, and the diagnostics sampled during it."""

    workers: int
    steps: list[MultiStep] = field(default_factory=list)
    best: MultiStep | None = None
    loads: list[dict[str, Any]] | None = None  # engine.workers during the best step
    flows_per_worker: str = "n/a"

    @property
    def aggregate_pps(self) -> float:
        """The best clean step's rate (0 when none was clean)."""
        return _rate(self.best) if self.best is not None else 0.0

    @property
    def generator_short(self) -> bool:
        return bool(self.best and self.best.short)


def _rate(step: MultiStep) -> float:
    """A clean step's aggregate rate: its target (steps share one grid, so W's compare exactly),
    or what the generator achieved when it fell short of the target."""
    return step.achieved_pps if step.short else step.flows * step.pps


def _worker_counts(url: str, flow_ids: list[str], loads: list[dict[str, Any]] | None) -> str:
    """Flows per worker: from ``engine.workers`` when present, else from each flow's stats
    (``data.worker``); "n/a" when neither says."""
    if loads:
        return "/".join(str(w.get("flows", "?")) for w in loads)
    counts: dict[int, int] = {}
    for flow_id in flow_ids:
        with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
            data = httpx.get(f"{url}/api/v1/stats/{flow_id}", timeout=10).json()
            worker = (data.get("data") or data).get("worker")
            if isinstance(worker, int):
                counts[worker] = counts.get(worker, 0) + 1
    return "/".join(str(counts[k]) for k in sorted(counts)) if counts else "n/a"


def _busy(loads: list[dict[str, Any]] | None) -> str:
    """Each worker's share of a core spent draining (``busy``, or ``cpu`` as first shipped)."""
    if not loads:
        return "n/a"
    shares = []
    for worker in loads:
        value = worker.get("busy", worker.get("cpu"))
        shares.append(f"{float(value):.0%}" if isinstance(value, int | float) else "n/a")
    return "/".join(shares)


def _search(workers: int, flows: int, opts: Options) -> WorkerRun:
    """Double-then-bisect over the per-flow rate on a fresh ``mp-edge --workers W``."""
    step_s, max_steps, budget_s = (
        (QUICK_STEP_S, QUICK_MAX_STEPS, QUICK_BUDGET_S) if opts.quick else (STEP_S, MAX_STEPS, BUDGET_S)
    )
    run = WorkerRun(workers)
    flow_ids = [f"sc{k}" for k in range(flows)]
    with edge(opts, f"s7-w{workers}", workers=workers) as (url, pid), sink_child(flows) as sinks:
        inputs = _create_flows(url, 0, flows, sinks.ports, prefix="sc")
        deadline = time.monotonic() + budget_s
        low, high = 0.0, None
        aggregate = START_AGGREGATE_PPS if not opts.quick else opts.start_pps
        sequence = 0
        for _ in range(max_steps):
            if time.monotonic() > deadline:
                log(f"[s7] W={workers}: time budget spent after {len(run.steps)} steps")
                break
            sampled: dict[str, Any] = {}

            def sample(sampled: dict[str, Any] = sampled) -> None:
                sampled["loads"] = engine_workers(url)  # mid-step: the workers' load while they carry it

            at = (step_s * 0.6, sample)
            step = multi_step(
                pid,
                sinks,
                inputs,
                step_s,
                pps=aggregate / flows,
                at=at,
                first_sequence=sequence,
                settle_limit_s=SETTLE_LIMIT_S,
            )
            sequence = (sequence + step.sent // flows + 1000) & 0xFFFF  # one continuing stream per flow
            run.steps.append(step)
            clean = step.lossless
            log(
                f"[s7] W={workers} target {fmt_pps(aggregate)} sent {fmt_pps(step.achieved_pps)}"
                f" ({step.processes} gen proc) missing {step.missing} backlog {step.backlog}"
                f" edge CPU {step.cpu_s / max(step.wall_s, 1e-9):.2f} cores"
                f" workers busy {_busy(sampled.get('loads'))}"
                f" {'clean' if clean else 'LOSS'}{' GENERATOR SHORT' if step.short else ''}"
            )
            if clean:
                previous = run.aggregate_pps
                if run.best is None or _rate(step) > previous:
                    run.best, run.loads = step, sampled.get("loads")
                low = max(low, aggregate)
                # A short step alone does not end the climb (a load spike on a shared host can
                # starve the generator for one step); a short step that sent no more than the best
                # before it does: beyond it the generator, not the edge, is the limit.
                if step.short and step.achieved_pps <= 1.05 * previous:
                    break
            else:
                high = aggregate if high is None else min(high, aggregate)
            if high is None:
                if aggregate >= MAX_AGGREGATE_PPS:
                    break
                aggregate = min(aggregate * 2, MAX_AGGREGATE_PPS)
            else:
                if high - low <= RESOLUTION * max(low, 1.0) or (low and high - low <= 2000):
                    break
                aggregate = (low + high) / 2 if low else high / 2
        run.flows_per_worker = _worker_counts(url, flow_ids, run.loads or engine_workers(url))
        for flow_id in flow_ids:
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{url}/api/v1/flows/{flow_id}", timeout=30)
    return run


def scenario_7(opts: Options) -> list[Row]:
    """One row per W, and the ratio of each to W = 1."""
    top = min(cores(), MAX_WORKERS)
    counts = list(range(1, top + 1)) if not opts.quick else sorted({1, min(2, top)})
    flows = FLOWS_PER_WORKER * top if not opts.quick else 2 * top
    log(f"[s7] {flows} flows over W = {counts} workers ({machine()})")
    runs: list[WorkerRun] = []
    for workers in counts:
        runs.append(_search(workers, flows, opts))
    base = runs[0].aggregate_pps
    rows: list[Row] = []
    record: dict[str, Any] = {"flows": flows, "cores": cores(), "workers": {}}
    for run in runs:
        best = run.best
        cpu_cores = best.cpu_s / max(best.wall_s, 1e-9) if best else 0.0
        gen = f"{best.processes} gen proc" if best else "-"
        short = " (GENERATOR SHORT)" if run.generator_short else ""
        if best is None:
            lowest = min((s.flows * s.pps for s in run.steps), default=0.0)
            ours = f"W={run.workers}: no step clean ({len(run.steps)} steps, the lowest at {fmt_pps(lowest)})"
        else:
            ours = (
                f"W={run.workers}: {ts_mbps(run.aggregate_pps):,.0f} Mbit/s = {fmt_pps(run.aggregate_pps)} at zero loss"
                f"{short} ({flows} x {ts_mbps(run.aggregate_pps) / flows:.1f} Mbit/s, {gen}); "
                f"edge CPU {cpu_cores:.2f} cores, {best.us_per_packet:.1f} us/pkt; "
                f"flows per worker {run.flows_per_worker}, busy {_busy(run.loads)}"
            )
        scale = run.aggregate_pps / base if base else 0.0
        record["workers"][str(run.workers)] = {
            "aggregate_pps": round(run.aggregate_pps),
            "aggregate_mbps": round(ts_mbps(run.aggregate_pps), 1),
            "ratio_to_w1": round(scale, 2) if base else None,
            "generator_short": run.generator_short,
            "edge_cpu_cores": round(cpu_cores, 2),
            "flows_per_worker": run.flows_per_worker,
            "loads": run.loads,
            "best": best.record() if best else None,
            "steps": [s.record() for s in run.steps],
        }
        rows.append(
            Row(
                f"7{chr(ord('a') + run.workers - 1)}",  # 7a: W=1, 7b: W=2, ...
                f"scaling: {flows} flows on {run.workers} worker(s)",
                ours,
                "-",
                f"{scale:.2f}x W=1" if base and run.workers > 1 else "-",
                "-",
                None,
            )
        )
    opts.record["scenario_7"] = record
    return rows
