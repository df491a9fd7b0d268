"""The stats aggregator: worker counters + configuration → the one ``StatsSnapshot``.

Workers send raw cumulative counters about every 250 ms. This module keeps a
short history per running flow to derive bitrates (over the last second) and
health (over the last 10 s, interop.md 11), and builds the snapshot model that
the JSON routes, the WebSocket stream and the Prometheus collector all read.
Sans-IO apart from nothing: the caller passes ``now`` (monotonic seconds).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

from appliance.models.config import FlowConfig
from appliance.models.stats import (
    FlowState,
    FlowStats,
    Health,
    IatStats,
    InputStats,
    MediaAnalysis,
    OutputStats,
    StatsSnapshot,
    SystemStats,
    Tr101290Stats,
)

BITRATE_WINDOW_S: Final = 1.0
HEALTH_WINDOW_S: Final = 10.0  # interop.md 11: loss and TR 101 290 errors count over the last 10 s
HISTORY_S: Final = HEALTH_WINDOW_S + 2.0
# TR 101 290 §5.2.1 priority 1 and §5.2.2 priority 2 counters that health watches.
P1_COUNTERS: Final = ("sync_byte_errors", "pat_errors", "cc_errors", "pmt_errors")
P2_COUNTERS: Final = ("tei_errors", "pcr_discontinuity_errors", "pcr_accuracy_errors")


def output_type_label(kind: str) -> str:
    """interop.md 11: rtp and udp outputs both report ``udp``."""
    return "udp" if kind in ("rtp", "udp") else kind


@dataclass
class _Sample:
    at: float
    bytes_in: int
    lost: int
    sync_loss: int
    p1: int
    p2: int
    bytes_out: dict[str, int]


@dataclass
class FlowRuntimeState:
    """What the control process knows about one flow's lifecycle."""

    state: FlowState = FlowState.IDLE
    started_at: float | None = None
    error: str | None = None
    counters: dict[str, Any] | None = None
    history: deque[_Sample] = field(default_factory=deque)

    def reset_counters(self) -> None:
        self.counters = None
        self.history.clear()


class StatsAggregator:
    """Owns every flow's runtime state and builds snapshots from it."""

    def __init__(self, version: str, started_at: float) -> None:
        self.version = version
        self.started_at = started_at
        self.flows: dict[str, FlowRuntimeState] = {}

    def runtime(self, flow_id: str) -> FlowRuntimeState:
        state = self.flows.get(flow_id)
        if state is None:
            state = self.flows[flow_id] = FlowRuntimeState()
        return state

    def forget(self, flow_id: str) -> None:
        self.flows.pop(flow_id, None)

    def on_counters(self, flows: dict[str, dict[str, Any]], now: float) -> None:
        """Take one worker report (cumulative counters of each of its running flows)."""
        for flow_id, counters in flows.items():
            runtime = self.flows.get(flow_id)
            if runtime is None or runtime.state is not FlowState.RUNNING:
                continue
            if not runtime.history:
                # A zero baseline at the start, so errors counted before the first report
                # fall inside the health window (a 0.1 s burst of CC errors must not read Healthy).
                start = runtime.started_at if runtime.started_at is not None else now
                runtime.history.append(
                    _Sample(at=min(start, now), bytes_in=0, lost=0, sync_loss=0, p1=0, p2=0, bytes_out={})
                )
            runtime.counters = counters
            tr = (counters.get("analysis") or {}).get("tr101290") or {}
            inp = counters.get("input") or {}
            runtime.history.append(
                _Sample(
                    at=now,
                    bytes_in=int(inp.get("bytes_received", 0)),
                    lost=int(inp.get("packets_lost", 0)),
                    sync_loss=int(tr.get("sync_loss_count", 0)),
                    p1=sum(int(tr.get(name, 0)) for name in P1_COUNTERS),
                    p2=sum(int(tr.get(name, 0)) for name in P2_COUNTERS),
                    bytes_out={
                        str(o.get("output_id")): int(o.get("bytes_sent", 0)) for o in counters.get("outputs", [])
                    },
                )
            )
            while runtime.history and runtime.history[0].at < now - HISTORY_S:
                runtime.history.popleft()

    # ------------------------------------------------------------------ building

    def build(self, flows: list[FlowConfig], now: float) -> StatsSnapshot:
        """The snapshot of every configured flow, in configuration order."""
        flow_stats = [self.flow_stats(flow, now) for flow in flows]
        active = sum(1 for f in flow_stats if f.state is FlowState.RUNNING)
        system = SystemStats(
            uptime_secs=int(now - self.started_at), total_flows=len(flows), active_flows=active, version=self.version
        )
        return StatsSnapshot(system=system, flows=flow_stats)

    def flow_stats(self, flow: FlowConfig, now: float) -> FlowStats:
        runtime = self.flows.get(flow.id) or FlowRuntimeState()
        running = runtime.state is FlowState.RUNNING
        counters = runtime.counters if running else None
        history = runtime.history
        if counters is None:
            # interop.md 11: a flow that is not running reports zeros and null analysis.
            return FlowStats(
                flow_id=flow.id,
                flow_name=flow.name,
                state=runtime.state,
                health=_health(runtime.state, None, 0),
                uptime_secs=int(now - runtime.started_at) if running and runtime.started_at is not None else 0,
                input=InputStats(input_type=flow.input.type, state="starting" if running else "idle"),
                outputs=[
                    OutputStats(output_id=o.id, output_name=o.name, output_type=output_type_label(o.type), state="idle")
                    for o in flow.outputs
                ],
            )
        inp = counters.get("input", {})
        bitrate_in = _rate(history, lambda s: s.bytes_in)
        input_stats = InputStats(
            input_type=flow.input.type,
            state=str(inp.get("state", "receiving")),
            packets_received=int(inp.get("packets_received", 0)),
            bytes_received=int(inp.get("bytes_received", 0)),
            bitrate_bps=bitrate_in,
            packets_lost=int(inp.get("packets_lost", 0)),
            packets_filtered=int(inp.get("packets_filtered", 0)),
            packets_recovered_fec=int(inp.get("packets_recovered_fec", 0)),
            redundancy_switches=int(inp.get("redundancy_switches", 0)),
            srt_stats=inp.get("srt_stats"),
            srt_leg2_stats=inp.get("srt_leg2_stats"),
        )
        running_outputs = {str(o.get("output_id")): o for o in counters.get("outputs", [])}
        outputs = []
        for output in flow.outputs:
            live = running_outputs.get(output.id)
            if live is None:
                outputs.append(
                    OutputStats(
                        output_id=output.id, output_name=output.name, output_type=output_type_label(output.type)
                    )
                )
                continue
            outputs.append(
                OutputStats(
                    output_id=output.id,
                    output_name=output.name,
                    output_type=output_type_label(output.type),
                    state=str(live.get("state", "active")),
                    packets_sent=int(live.get("packets_sent", 0)),
                    bytes_sent=int(live.get("bytes_sent", 0)),
                    bitrate_bps=_rate(history, lambda s, oid=output.id: s.bytes_out.get(oid, 0)),
                    packets_dropped=int(live.get("packets_dropped", 0)),
                    fec_packets_sent=int(live.get("fec_packets_sent", 0)),
                    srt_stats=live.get("srt_stats"),
                    srt_leg2_stats=live.get("srt_leg2_stats"),
                )
            )
        analysis = counters.get("analysis") or {}
        tr = analysis.get("tr101290")
        media = analysis.get("media") if flow.media_analysis else None
        iat = analysis.get("iat")
        return FlowStats(
            flow_id=flow.id,
            flow_name=flow.name,
            state=runtime.state,
            health=_health(runtime.state, history, bitrate_in),
            uptime_secs=int(now - runtime.started_at) if runtime.started_at is not None else 0,
            input=input_stats,
            outputs=outputs,
            tr101290=Tr101290Stats(**tr) if tr is not None else None,
            media_analysis=_media(flow, media, inp) if media is not None else None,
            iat=IatStats(**iat) if iat is not None else None,
            pdv_jitter_us=analysis.get("pdv_jitter_us"),
        )


def _media(flow: FlowConfig, media: dict[str, Any], inp: dict[str, Any]) -> MediaAnalysis:
    fec = getattr(flow.input, "fec_decode", None)
    redundancy = getattr(flow.input, "redundancy", None)
    fec_info = None
    if fec is not None:
        fec_info = {"standard": "SMPTE 2022-1", "columns": fec.columns, "rows": fec.rows, **(inp.get("fec") or {})}
    redundancy_info = None
    if redundancy is not None:
        standard = "SMPTE 2022-7" if flow.input.type == "rtp" else "dual-leg"
        redundancy_info = {"standard": standard, **(inp.get("redundancy") or {})}
    return MediaAnalysis(
        protocol=flow.input.type,
        payload_format=str(inp.get("payload_format") or ("rtp_ts" if flow.input.type == "rtp" else "raw_ts")),
        fec=fec_info,
        redundancy=redundancy_info,
        **media,
    )


def _rate(history: deque[_Sample], value: Any) -> int:
    """Bits per second over the last ``BITRATE_WINDOW_S`` of samples."""
    if len(history) < 2:
        return 0
    newest = history[-1]
    oldest = history[0]
    for sample in reversed(history):
        oldest = sample
        if newest.at - sample.at >= BITRATE_WINDOW_S:
            break
    elapsed = newest.at - oldest.at
    if elapsed <= 0:
        return 0
    return max(0, int((value(newest) - value(oldest)) * 8 / elapsed))


def _window_delta(history: deque[_Sample], value: Any) -> int:
    if not history:
        return 0
    newest = history[-1]
    base = history[0]
    for sample in history:
        if newest.at - sample.at <= HEALTH_WINDOW_S:
            base = sample
            break
    return int(value(newest) - value(base))


def _health(state: FlowState, history: deque[_Sample] | None, bitrate_in: int) -> Health:
    """interop.md 11: the first matching rule wins."""
    if state is FlowState.ERROR:
        return Health.CRITICAL
    if state is not FlowState.RUNNING or history is None:
        return Health.HEALTHY
    if _window_delta(history, lambda s: s.sync_loss) > 0:
        return Health.CRITICAL
    if _window_delta(history, lambda s: s.p1) > 0:
        return Health.ERROR
    if bitrate_in == 0:
        return Health.CRITICAL
    lost = _window_delta(history, lambda s: s.lost)
    if lost > 100:
        return Health.ERROR
    if _window_delta(history, lambda s: s.p2) > 0:
        return Health.WARNING
    if lost > 0:
        return Health.WARNING
    return Health.HEALTHY
