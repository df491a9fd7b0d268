"""The stats aggregator: worker counters + configuration → the one ``StatsSnapshot``.

Workers send raw cumulative counters about every 250 ms. This module keeps a
short history per running flow to derive bitrates (over the last second) and
health (over the last 10 s, interop.md 11), and builds the snapshot model that
the JSON routes, the WebSocket stream and the Prometheus collector all read.
Sans-IO apart from nothing: the caller passes ``now`` (monotonic seconds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from appliance.models.config import FlowConfig
from appliance.models.kinds import output_type_label
from appliance.models.stats import (
    HEALTH_P1,
    HEALTH_P2,
    HEALTH_SYNC_LOSS,
    FlowCounters,
    FlowState,
    FlowStats,
    Health,
    InputCounters,
    InputStats,
    MediaAnalysis,
    MediaCounters,
    OutputStats,
    StatsSnapshot,
    SystemStats,
)
from services.edge.lifecycle import FlowLifecycle

BITRATE_WINDOW_S: Final = 1.0
HEALTH_WINDOW_S: Final = 10.0  # interop.md 11: loss and TR 101 290 errors count over the last 10 s
HISTORY_S: Final = HEALTH_WINDOW_S + 2.0


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
class _FlowCounters:
    """The last report of one running flow and the short history behind its rates and health."""

    counters: FlowCounters | None = None
    history: deque[_Sample] = field(default_factory=deque)


class StatsAggregator:
    """Keeps the running flows' counters and builds snapshots; the states come from the lifecycle."""

    def __init__(self, version: str, started_at: float, lifecycle: FlowLifecycle) -> None:
        self.worker_of: Callable[[str], int | None] = lambda flow_id: None
        """The engine worker of a running flow (the service sets the engine's)."""
        self.version = version
        self.started_at = started_at
        self.lifecycle = lifecycle
        self._flows: dict[str, _FlowCounters] = {}
        lifecycle.listeners.append(self._on_transition)

    def _on_transition(self, flow_id: str, old: FlowState, new: FlowState) -> None:
        # A flow that starts, stops or fails begins from zero: its next report is a new baseline.
        self._flows.pop(flow_id, None)

    def forget(self, flow_id: str) -> None:
        self._flows.pop(flow_id, None)

    def on_counters(self, flows: dict[str, FlowCounters], now: float) -> None:
        """Take one worker report (cumulative counters of each of its running flows)."""
        for flow_id, counters in flows.items():
            if self.lifecycle.state(flow_id) is not FlowState.RUNNING:
                continue
            entry = self._flows.get(flow_id)
            if entry is None:
                entry = self._flows[flow_id] = _FlowCounters()
                # A zero baseline at the start, so errors counted before the first report
                # fall inside the health window (a 0.1 s burst of CC errors must not read Healthy).
                status = self.lifecycle.get(flow_id)
                started = status.started_at if status is not None else None
                start = started if started is not None else now
                entry.history.append(
                    _Sample(at=min(start, now), bytes_in=0, lost=0, sync_loss=0, p1=0, p2=0, bytes_out={})
                )
            entry.counters = counters
            tr = counters.analysis.tr101290
            inp = counters.input
            entry.history.append(
                _Sample(
                    at=now,
                    bytes_in=inp.bytes_received,
                    lost=inp.packets_lost,
                    sync_loss=getattr(tr, HEALTH_SYNC_LOSS),
                    p1=sum(getattr(tr, name) for name in HEALTH_P1),
                    p2=sum(getattr(tr, name) for name in HEALTH_P2),
                    bytes_out={o.output_id: o.bytes_sent for o in counters.outputs},
                )
            )
            while entry.history and entry.history[0].at < now - HISTORY_S:
                entry.history.popleft()

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
        state = self.lifecycle.state(flow.id)
        running = state is FlowState.RUNNING
        status = self.lifecycle.get(flow.id)
        started_at = status.started_at if status is not None else None
        uptime = int(now - started_at) if running and started_at is not None else 0
        entry = self._flows.get(flow.id) if running else None
        counters = entry.counters if entry is not None else None
        if counters is None or entry is None:
            # interop.md 11: a flow that is not running reports zeros and null analysis.
            return FlowStats(
                flow_id=flow.id,
                flow_name=flow.name,
                state=state,
                health=_health(state, None, 0),
                uptime_secs=uptime,
                input=InputStats(input_type=flow.input.type, state="starting" if running else "idle"),
                outputs=[
                    OutputStats(output_id=o.id, output_name=o.name, output_type=output_type_label(o.type), state="idle")
                    for o in flow.outputs
                ],
                worker=self.worker_of(flow.id) if running else None,
            )
        history = entry.history
        inp = counters.input
        bitrate_in = _rate(history, lambda s: s.bytes_in)
        input_stats = InputStats(
            input_type=flow.input.type,
            state=inp.state,
            packets_received=inp.packets_received,
            bytes_received=inp.bytes_received,
            bitrate_bps=bitrate_in,
            packets_lost=inp.packets_lost,
            packets_filtered=inp.packets_filtered,
            packets_recovered_fec=inp.packets_recovered_fec,
            redundancy_switches=inp.redundancy_switches,
            srt_stats=inp.srt_stats,
            srt_leg2_stats=inp.srt_leg2_stats,
            peer_addr=inp.peer_addr,
            rtsp_stats=inp.rtsp_stats,
            webrtc_stats=inp.webrtc_stats,
        )
        running_outputs = {o.output_id: o for o in counters.outputs}
        outputs = []
        for output in flow.outputs:
            label = output_type_label(output.type)
            live = running_outputs.get(output.id)
            if live is None:
                outputs.append(OutputStats(output_id=output.id, output_name=output.name, output_type=label))
                continue
            outputs.append(
                OutputStats(
                    output_id=output.id,
                    output_name=output.name,
                    output_type=label,
                    state=live.state,
                    packets_sent=live.packets_sent,
                    bytes_sent=live.bytes_sent,
                    bitrate_bps=_rate(history, lambda s, oid=output.id: s.bytes_out.get(oid, 0)),
                    packets_dropped=live.packets_dropped,
                    fec_packets_sent=live.fec_packets_sent,
                    srt_stats=live.srt_stats,
                    srt_leg2_stats=live.srt_leg2_stats,
                    webrtc_stats=live.webrtc_stats,
                )
            )
        analysis = counters.analysis
        media = analysis.media if flow.media_analysis else None
        return FlowStats(
            flow_id=flow.id,
            flow_name=flow.name,
            state=state,
            health=_health(state, history, bitrate_in),
            uptime_secs=uptime,
            input=input_stats,
            outputs=outputs,
            tr101290=analysis.tr101290,
            media_analysis=_media(flow, media, inp) if media is not None else None,
            iat=analysis.iat,
            pdv_jitter_us=analysis.pdv_jitter_us,
            worker=self.worker_of(flow.id),
        )


def _media(flow: FlowConfig, media: MediaCounters, inp: InputCounters) -> MediaAnalysis:
    fec = getattr(flow.input, "fec_decode", None)
    redundancy = getattr(flow.input, "redundancy", None)
    fec_info = None
    if fec is not None:
        fec_counts = inp.fec.model_dump() if inp.fec is not None else {}
        fec_info = {"standard": "SMPTE 2022-1", "columns": fec.columns, "rows": fec.rows, **fec_counts}
    redundancy_info = None
    if redundancy is not None:
        standard = "SMPTE 2022-7" if flow.input.type == "rtp" else "dual-leg"
        counts = inp.redundancy.model_dump(exclude_none=True) if inp.redundancy is not None else {}
        redundancy_info = {"standard": standard, **counts}
    return MediaAnalysis(
        protocol=flow.input.type,
        payload_format=inp.payload_format,
        fec=fec_info,
        redundancy=redundancy_info,
        **media.model_dump(),
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
