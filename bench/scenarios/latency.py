"""Scenario 4: latency added by the forwarder, at 50 % of scenario 1's peak rate.

The generator writes its send time (CLOCK_REALTIME, ns) into the last TS packet of every
datagram; the sink subtracts it from the kernel receive timestamp (SO_TIMESTAMPNS, same clock).
That path includes the generator's own batching, so the same stream is also sent straight to
the sink (no forwarder) in the same run: added latency = forwarder path - direct path, per
percentile (a difference of percentiles, not the percentile of per-packet differences, which
one clock and one stream cannot give).
"""

from __future__ import annotations

from bench.scenarios.common import (
    DirectTarget,
    EdgeTarget,
    Options,
    ProcessTarget,
    Row,
    Sequence,
    Step,
    Target,
    edge,
    fmt_pps,
    have,
    log,
    opened,
    run_step,
    sink_child,
    srt_live_transmit_argv,
    step_line,
    step_record,
)

FALLBACK_PPS = 20000.0  # when scenario 1 did not run in this invocation
P99_GOAL_MS = 1.0


def scenario_4(opts: Options) -> list[Row]:
    peak = opts.shared.get("s1_peak_pps")
    pps = 0.5 * peak if peak else (2000.0 if opts.quick else FALLBACK_PPS)
    basis = "50% of scenario 1's peak" if peak else "fixed rate: scenario 1 not run"
    steps: dict[str, Step] = {}
    with edge(opts, "s4") as (url, pid), sink_child(1) as sinks:
        targets: list[Target] = [DirectTarget(), EdgeTarget(url, pid, "s4", "mediaplane")]
        if have("srt-live-transmit"):
            targets.append(ProcessTarget("srt-live-transmit", srt_live_transmit_argv, opts.workdir))
        sequence = Sequence()
        for target in targets:
            with opened(target, sinks.ports) as port:
                step = run_step(target, sinks, port, pps, opts.latency_seconds, sequence)
            log(step_line(target.label, step))
            steps[target.label] = step
    opts.record["scenario_4"] = {"pps": round(pps), "basis": basis} | {k: step_record(v) for k, v in steps.items()}
    direct = steps["direct (no forwarder)"].latency_ms

    def added(label: str) -> tuple[float, float]:
        lat = steps[label].latency_ms
        return lat.get("p50", float("nan")) - direct.get("p50", 0.0), lat.get("p99", float("nan")) - direct.get(
            "p99", 0.0
        )

    ours50, ours99 = added("mediaplane")
    ours_step = steps["mediaplane"]
    ours = (
        f"+{ours50:.2f} ms p50, +{ours99:.2f} ms p99 at {fmt_pps(pps)} ({basis}); "
        f"direct path p50 {direct.get('p50', float('nan')):.2f} / p99 {direct.get('p99', float('nan')):.2f} ms"
        + ("" if ours_step.lossless else f"; {ours_step.missing} lost")
    )
    peers, ratio_text = "-", "-"
    if "srt-live-transmit" in steps:
        srt50, srt99 = added("srt-live-transmit")
        peers = f"srt-live-transmit: +{srt50:.2f} ms p50, +{srt99:.2f} ms p99"
        ratio_text = f"p99 vs srt {ours99 / srt99:.2f}x" if srt99 > 0 else "p99 vs srt n/a"
    return [
        Row(
            "4",
            "Added latency, input to output datagram",
            ours,
            peers,
            ratio_text,
            "p99 added < 1 ms",
            ours99 < P99_GOAL_MS,
        )
    ]
