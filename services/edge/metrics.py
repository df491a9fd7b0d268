"""Prometheus exposition of the edge: a custom collector over the stats snapshot.

The collector reads the same ``StatsSnapshot`` as the JSON routes at scrape
time; nothing in the data plane touches prometheus-client. The interface's per-flow series
(edge interface §4, GET /metrics) appear only for running flows; the two one-hot series of
flow state and health are there for every configured flow, so a flow that fails or stops can
be seen and alerted on (docs/edge.md, Metrics). Tunnels (beyond the interface): a 0/1
``tunnel_connected`` and a one-hot ``tunnel_state`` for every configured tunnel, and the
tunnel worker's counters for every tunnel that is not ``Stopped``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from appliance.models.stats import (
    TR101290_INDICATORS,
    TR101290_METRICS,
    FlowState,
    Health,
    StatsSnapshot,
    TunnelState,
    WebrtcStats,
)
from services.edge.core.ts.tr101290 import DEFAULT_WINDOW_S

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
P = "mediaplane_edge_"
# The interface names these counters without the `_total` suffix. prometheus-client
# always writes `<name>_total` on a counter's HELP/TYPE lines, so `render` puts the
# exact names back on those lines (the sample lines already carry them).
_UNSUFFIXED_COUNTERS: Final = (
    P + "flow_input_packets_lost",
    P + "flow_input_packets_filtered",
    P + "flow_output_packets_dropped",
)


def _counter(name: str, doc: str, labels: list[str]) -> tuple[Metric, Callable[[list[str], float], None]]:
    metric = Metric(name.removesuffix("_total"), doc, "counter")

    def add(values: list[str], value: float) -> None:
        metric.add_sample(name, dict(zip(labels, values, strict=True)), value)

    return metric, add


def _tr101290_help(field: str) -> str:
    if field in TR101290_INDICATORS:
        priority, label = TR101290_INDICATORS[field]
        return f"TR 101 290 priority {priority} indicator: {label} count"
    return f"TR 101 290 {field}"


WorkerLoads = Callable[[], list[dict[str, Any]]]


class EdgeCollector(Collector):
    """Builds every ``mediaplane_edge_*`` family from a fresh snapshot at scrape time."""

    def __init__(self, snapshot: Callable[[], StatsSnapshot], workers: WorkerLoads | None = None) -> None:
        self._snapshot = snapshot
        self._workers = workers

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        system = snap.system
        info = InfoMetricFamily(P[:-1], "Edge build information", labels=["version"])
        info.add_metric([system.version], {})
        # InfoMetricFamily appends `_info`; the interface names it mediaplane_edge_info.
        yield info
        yield GaugeMetricFamily(P + "uptime_seconds", "Seconds since the edge started", value=system.uptime_secs)
        yield GaugeMetricFamily(P + "flows_total", "Flows defined in the configuration", value=system.total_flows)
        yield GaugeMetricFamily(P + "flows_active", "Flows currently running", value=system.active_flows)
        # One-hot (1 = the current value, 0 = every other value) for every configured flow.
        flow_state = GaugeMetricFamily(
            P + "flow_state", "Flow state: 1 for the current state, 0 for the others", labels=["flow_id", "state"]
        )
        flow_health = GaugeMetricFamily(
            P + "flow_health", "Flow health: 1 for the current level, 0 for the others", labels=["flow_id", "health"]
        )
        for flow in snap.flows:
            for state in FlowState:
                flow_state.add_metric([flow.flow_id, state.value], 1.0 if flow.state is state else 0.0)
            for level in Health:
                flow_health.add_metric([flow.flow_id, level.value], 1.0 if flow.health is level else 0.0)
        yield flow_state
        yield flow_health

        flow_l, out_l = ["flow_id"], ["flow_id", "output_id"]
        families: list[Metric] = []

        def counter(name: str, doc: str, labels: list[str]) -> Callable[[list[str], float], None]:
            metric, add = _counter(P + name, doc, labels)
            families.append(metric)
            return add

        def gauge(name: str, doc: str, labels: list[str]) -> Callable[[list[str], float], None]:
            metric = GaugeMetricFamily(P + name, doc, labels=labels)
            families.append(metric)
            return lambda values, value: metric.add_metric(values, value)

        in_packets = counter("flow_input_packets_total", "Datagrams received on the input", flow_l)
        in_bytes = counter("flow_input_bytes_total", "Bytes received on the input", flow_l)
        in_bitrate = gauge("flow_input_bitrate_bps", "Input bitrate over the last second", flow_l)
        in_lost = counter("flow_input_packets_lost", "RTP packets lost after FEC and 2022-7", flow_l)
        in_fec = counter("flow_input_fec_recovered_total", "Packets rebuilt by FEC", flow_l)
        in_switch = counter("flow_input_redundancy_switches_total", "Changes of the supplying leg", flow_l)
        in_filtered = counter("flow_input_packets_filtered", "Datagrams dropped by input filters", flow_l)
        pdv = gauge("flow_pdv_jitter_us", "Packet delay variation (microseconds)", flow_l)
        iat_avg = gauge("flow_iat_avg_us", "Mean inter-arrival time (microseconds)", flow_l)
        out_packets = counter("flow_output_packets_total", "Datagrams sent by the output", out_l)
        out_bytes = counter("flow_output_bytes_total", "Bytes sent by the output", out_l)
        out_bitrate = gauge("flow_output_bitrate_bps", "Output bitrate over the last second", out_l)
        out_dropped = counter("flow_output_packets_dropped", "Packets dropped on a full output queue", out_l)
        out_fec = counter("flow_output_fec_sent_total", "FEC packets sent", out_l)
        srt_rtt = gauge("srt_rtt_ms", "SRT round-trip time (ms)", ["flow_id", "output_id", "leg"])
        srt_loss = counter("srt_loss_total", "SRT packets lost", ["flow_id", "output_id", "leg"])
        webrtc_sessions = gauge(
            "webrtc_sessions", "Connected WebRTC sessions (publisher, viewers, client)", ["flow_id", "output_id"]
        )
        tr_adders = [
            (counter("tr101290_" + metric, _tr101290_help(field), flow_l), field)
            for field, metric in TR101290_METRICS.items()
        ]
        window = f"{DEFAULT_WINDOW_S:g} s"
        p1_ok = gauge("tr101290_priority1_ok", f"1 while no TR 101 290 priority 1 error in the last {window}", flow_l)
        p2_ok = gauge("tr101290_priority2_ok", f"1 while no TR 101 290 priority 2 error in the last {window}", flow_l)
        video_info = InfoMetricFamily(
            P + "media_video", "Video stream", labels=["flow_id", "pid", "codec", "resolution", "profile", "level"]
        )
        audio_info = InfoMetricFamily(
            P + "media_audio", "Audio stream", labels=["flow_id", "pid", "codec", "sample_rate", "channels", "language"]
        )
        framerate = gauge("media_video_framerate", "Video frame rate (fps)", ["flow_id", "pid"])
        pid_bitrate = gauge("media_pid_bitrate_bps", "Elementary stream bitrate", ["flow_id", "pid", "type"])
        total_bitrate = gauge("media_total_bitrate_bps", "Total TS bitrate", flow_l)

        for flow in snap.flows:
            if flow.state is not FlowState.RUNNING:
                continue
            fid = [flow.flow_id]
            inp = flow.input
            in_packets(fid, inp.packets_received)
            in_bytes(fid, inp.bytes_received)
            in_bitrate(fid, inp.bitrate_bps)
            in_lost(fid, inp.packets_lost)
            in_fec(fid, inp.packets_recovered_fec)
            in_switch(fid, inp.redundancy_switches)
            in_filtered(fid, inp.packets_filtered)
            if flow.pdv_jitter_us is not None:
                pdv(fid, flow.pdv_jitter_us)
            if flow.iat is not None:
                iat_avg(fid, flow.iat.avg_us)
            for leg_name, leg in (("1", inp.srt_stats), ("2", inp.srt_leg2_stats)):
                if leg is not None:
                    srt_rtt([flow.flow_id, "", leg_name], leg.rtt_ms)
                    srt_loss([flow.flow_id, "", leg_name], leg.pkt_loss_total)
            if inp.webrtc_stats is not None:
                webrtc_sessions([flow.flow_id, ""], _connected(inp.webrtc_stats))
            for out in flow.outputs:
                oid = [flow.flow_id, out.output_id]
                out_packets(oid, out.packets_sent)
                out_bytes(oid, out.bytes_sent)
                out_bitrate(oid, out.bitrate_bps)
                out_dropped(oid, out.packets_dropped)
                out_fec(oid, out.fec_packets_sent)
                for leg_name, leg in (("1", out.srt_stats), ("2", out.srt_leg2_stats)):
                    if leg is not None:
                        srt_rtt([flow.flow_id, out.output_id, leg_name], leg.rtt_ms)
                        srt_loss([flow.flow_id, out.output_id, leg_name], leg.pkt_loss_total)
                if out.webrtc_stats is not None:
                    webrtc_sessions(oid, _connected(out.webrtc_stats))
            if flow.tr101290 is not None:
                values = flow.tr101290.model_dump()
                for add, field in tr_adders:
                    add(fid, values[field])
                p1_ok(fid, 1.0 if flow.tr101290.priority1_ok else 0.0)
                p2_ok(fid, 1.0 if flow.tr101290.priority2_ok else 0.0)
            media = flow.media_analysis
            if media is not None:
                total_bitrate(fid, media.total_bitrate_bps)
                for video in media.video_streams:
                    pid = str(video.pid)
                    video_info.add_metric(
                        [
                            flow.flow_id,
                            pid,
                            video.codec,
                            video.resolution or "",
                            video.profile or "",
                            video.level or "",
                        ],
                        {},
                    )
                    if video.frame_rate is not None:
                        framerate([flow.flow_id, pid], video.frame_rate)
                    pid_bitrate([flow.flow_id, pid, "video"], video.bitrate_bps)
                for audio in media.audio_streams:
                    pid = str(audio.pid)
                    audio_info.add_metric(
                        [
                            flow.flow_id,
                            pid,
                            audio.codec,
                            str(audio.sample_rate_hz or ""),
                            str(audio.channels or ""),
                            audio.language or "",
                        ],
                        {},
                    )
                    pid_bitrate([flow.flow_id, pid, "audio"], audio.bitrate_bps)
        yield from families
        yield video_info
        yield audio_info
        yield from _tunnel_families(snap)
        if self._workers is not None:
            yield from _worker_families(self._workers())


# (counter field of TunnelCounters, metric name after ``tunnel_``, help)
_TUNNEL_COUNTERS: Final = (
    ("bytes_sent", "bytes_sent_total", "Payload bytes sent into the tunnel"),
    ("bytes_received", "bytes_received_total", "Payload bytes received from the tunnel"),
    ("datagrams_sent", "datagrams_sent_total", "Datagrams sent into the tunnel"),
    ("datagrams_received", "datagrams_received_total", "Datagrams received from the tunnel"),
    ("replayed", "replayed_total", "Received datagrams dropped as replays (interop.md 10)"),
    ("decrypt_errors", "decrypt_errors_total", "Received datagrams that failed to decrypt (interop.md 10)"),
    ("dropped", "dropped_total", "Datagrams dropped on a full queue"),
    ("tcp_streams_total", "tcp_streams_total", "TCP connections carried"),
)


def _connected(stats: WebrtcStats) -> int:
    return sum(1 for session in stats.sessions if session.state == "connected")


def _tunnel_families(snap: StatsSnapshot) -> Iterable[Metric]:
    """Per-tunnel series: state for every configured tunnel, counters while not ``Stopped``."""
    label = ["tunnel_id"]
    connected = GaugeMetricFamily(P + "tunnel_connected", "1 while the tunnel is Connected, else 0", labels=label)
    state = GaugeMetricFamily(
        P + "tunnel_state", "Tunnel state: 1 for the current state, 0 for the others", labels=["tunnel_id", "state"]
    )
    active = GaugeMetricFamily(P + "tunnel_tcp_streams_active", "TCP connections open now", labels=label)
    counters = [(field, *_counter(P + "tunnel_" + name, doc, label)) for field, name, doc in _TUNNEL_COUNTERS]
    for tunnel in snap.tunnels:
        connected.add_metric([tunnel.id], 1.0 if tunnel.state is TunnelState.CONNECTED else 0.0)
        for value in TunnelState:
            state.add_metric([tunnel.id, value.value], 1.0 if tunnel.state is value else 0.0)
        if tunnel.state is TunnelState.STOPPED:
            continue
        values = tunnel.stats.model_dump()
        for field, _, add in counters:
            add([tunnel.id], values[field])
        active.add_metric([tunnel.id], tunnel.stats.tcp_streams_active)
    yield connected
    yield state
    yield active
    for _, metric, _ in counters:
        yield metric


def _worker_families(loads: list[dict[str, Any]]) -> Iterable[Metric]:
    """Each engine worker's load as its last report gave it (issue 23: flows are placed by it)."""
    label = ["worker"]
    cpu = GaugeMetricFamily(
        P + "engine_worker_cpu_ratio",
        "CPU of the engine worker over its last report, a share of one core",
        labels=label,
    )
    pps = GaugeMetricFamily(
        P + "engine_worker_input_packets_per_second", "Input datagrams a second on the engine worker", labels=label
    )
    flows = GaugeMetricFamily(P + "engine_worker_flows", "Flows running on the engine worker", labels=label)
    for load in loads:
        worker = [str(load["index"])]
        cpu.add_metric(worker, float(load["cpu"]))
        pps.add_metric(worker, float(load["pps"]))
        flows.add_metric(worker, float(load["flows"]))
    yield cpu
    yield pps
    yield flows


class EdgeMetrics:
    """A registry of its own (not the process-global one) holding the edge collector."""

    def __init__(self, snapshot: Callable[[], StatsSnapshot], workers: WorkerLoads | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EdgeCollector(snapshot, workers))

    def render(self) -> bytes:
        """The text exposition format 0.0.4."""
        text = generate_latest(self.registry).decode()
        for name in _UNSUFFIXED_COUNTERS:
            text = text.replace(f"# HELP {name}_total ", f"# HELP {name} ").replace(
                f"# TYPE {name}_total counter", f"# TYPE {name} counter"
            )
        return text.encode()
