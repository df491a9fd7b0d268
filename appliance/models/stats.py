"""The one statistics snapshot model (edge interface section 2).

The control process builds these once per stats tick from the engine workers'
counters merged with the configuration. The same objects feed
``GET /api/v1/stats``, the WebSocket stream and the Prometheus collector.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field


class FlowState(StrEnum):
    """Flow runtime states (interop.md 11)."""

    IDLE = "Idle"
    STARTING = "Starting"
    RUNNING = "Running"
    ERROR = "Error"
    STOPPED = "Stopped"


class Health(StrEnum):
    HEALTHY = "Healthy"
    WARNING = "Warning"
    ERROR = "Error"
    CRITICAL = "Critical"


class _Stats(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SrtLegStats(_Stats):
    state: str = "connecting"
    rtt_ms: float = 0.0
    send_rate_mbps: float = 0.0
    recv_rate_mbps: float = 0.0
    pkt_loss_total: int = 0
    pkt_retransmit_total: int = 0
    uptime_ms: int = 0


class RtspStats(_Stats):
    """An ``rtsp`` input's session, beside the TS counters (the camera side of the flow)."""

    transport: str = "tcp"  # what the session runs over: ``tcp`` (interleaved) or ``udp``
    video_codec: str | None = None  # ``h264``/``hevc`` of the chosen video track
    audio_codec: str | None = None  # ``aac`` of the chosen audio track
    rtp_packets: int = 0  # RTP packets received from the camera (every session)
    rtp_lost: int = 0  # RTP sequence gaps (also in the input's ``packets_lost``)
    units_dropped: int = 0  # access units dropped because a packet of them was lost
    connections: int = 0  # sessions that reached PLAY
    last_error: str | None = None  # why the last session ended or failed (no credentials in it)


class WebrtcSession(_Stats):
    """One WebRTC peer connection of a ``webrtc``/``whep`` input or a ``webrtc`` output."""

    session_id: str
    role: str  # ``publisher`` (WHIP in), ``viewer`` (WHEP out), ``whip_client``, ``whep_client``
    state: str  # the peer connection's: ``connecting``, ``connected``, ``failed``, ``closed``...
    peer: str | None = None  # the remote address of the selected ICE pair (``host:port``)
    bytes: int = 0  # sent and received on the session's transport (media, RTCP, DTLS)
    bitrate_bps: int = 0
    connected_secs: int = 0
    units_dropped: int = 0  # access units a slow viewer fell behind on, skipped to the next keyframe


class WebrtcStats(_Stats):
    """The WebRTC side of an input or output: its sessions, as the webrtc worker reports them."""

    sessions: list[WebrtcSession] = Field(default_factory=list)
    worker_connected: bool = True  # false while the webrtc worker is down (being restarted)


class InputStats(_Stats):
    input_type: str
    state: str = "idle"
    packets_received: int = 0
    bytes_received: int = 0
    bitrate_bps: int = 0
    packets_lost: int = 0
    packets_filtered: int = 0
    packets_recovered_fec: int = 0
    redundancy_switches: int = 0
    srt_stats: SrtLegStats | None = None
    srt_leg2_stats: SrtLegStats | None = None
    peer_addr: str | None = None  # an rtmp input's active publisher, an rtsp input's server (``host:port``)
    rtsp_stats: RtspStats | None = None  # an rtsp input's session
    webrtc_stats: WebrtcStats | None = None  # a webrtc (WHIP) or whep input's sessions


class OutputStats(_Stats):
    output_id: str
    output_name: str
    output_type: str
    state: str = "idle"
    packets_sent: int = 0
    bytes_sent: int = 0
    bitrate_bps: int = 0
    packets_dropped: int = 0
    fec_packets_sent: int = 0
    srt_stats: SrtLegStats | None = None
    srt_leg2_stats: SrtLegStats | None = None
    webrtc_stats: WebrtcStats | None = None  # a webrtc output's sessions (viewers, its WHIP session)


def _indicator(priority: int | None = None, metric: str | None = None, label: str | None = None) -> Any:
    """A TR 101 290 counter field: its priority (ETSI TR 101 290 §5.2.1 = 1, §5.2.2 = 2; None for
    the counts that are not indicators), its Prometheus name (``mediaplane_edge_tr101290_<metric>``;
    None: not exported) and the indicator's name in events."""
    extra: dict[str, Any] = {}
    if priority is not None:
        extra["priority"] = priority
    if metric is not None:
        extra["metric"] = metric
    if label is not None:
        extra["label"] = label
    return Field(default=0, json_schema_extra=extra or None)


class Tr101290Stats(_Stats):
    """TR 101 290 counters, cumulative from the flow's first TS packet.

    The one list of the TR 101 290 fields: the worker's analyser fills it, and the health
    rules, the alarm events and the metrics read the priorities and metric names declared
    on the fields (``TR101290_INDICATORS``, ``TR101290_METRICS``).
    """

    ts_packets_analyzed: int = _indicator(metric="ts_packets_total")
    pat_count: int = 0
    pmt_count: int = 0
    sync_loss_count: int = _indicator(priority=1, metric="sync_loss_total", label="TS sync loss")
    sync_byte_errors: int = _indicator(priority=1, metric="sync_byte_errors_total", label="sync byte error")
    cc_errors: int = _indicator(priority=1, metric="cc_errors_total", label="continuity count error")
    pat_errors: int = _indicator(priority=1, metric="pat_errors_total", label="PAT error")
    pmt_errors: int = _indicator(priority=1, metric="pmt_errors_total", label="PMT error")
    tei_errors: int = _indicator(priority=2, metric="tei_errors_total", label="transport error")
    pcr_discontinuity_errors: int = _indicator(
        priority=2, metric="pcr_discontinuity_errors_total", label="PCR discontinuity"
    )
    pcr_accuracy_errors: int = _indicator(priority=2, metric="pcr_accuracy_errors_total", label="PCR accuracy error")
    priority1_ok: bool = True
    priority2_ok: bool = True
    tr07_compliant: bool = False
    jpeg_xs_pid: int | None = None
    # Beyond the interface's fields (docs/analysis.md): the rest of TR 101 290 §5.2.
    # Each is exported as a counter too, under a name of ours (docs/edge.md, Metrics).
    pid_errors: int = _indicator(priority=1, metric="pid_errors_total", label="PID error")
    crc_errors: int = _indicator(priority=2, metric="crc_errors_total", label="CRC error")
    pcr_repetition_errors: int = _indicator(
        priority=2, metric="pcr_repetition_errors_total", label="PCR repetition error"
    )
    pts_errors: int = _indicator(priority=2, metric="pts_errors_total", label="PTS error")
    cat_errors: int = _indicator(priority=2, metric="cat_errors_total", label="CAT error")
    section_errors: int = 0
    truncated_packets: int = 0


def _field_extra(name: str) -> dict[str, Any]:
    extra = Tr101290Stats.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


TR101290_INDICATORS: Final[dict[str, tuple[int, str]]] = {
    name: (int(_field_extra(name)["priority"]), str(_field_extra(name)["label"]))
    for name in Tr101290Stats.model_fields
    if "priority" in _field_extra(name)
}
"""field -> (priority, label) of every TR 101 290 indicator the edge counts."""
TR101290_METRICS: Final[dict[str, str]] = {
    name: str(_field_extra(name)["metric"]) for name in Tr101290Stats.model_fields if "metric" in _field_extra(name)
}
"""field -> metric name suffix (``mediaplane_edge_tr101290_<suffix>``): the edge interface §4 names,
and one counter for each indicator beyond them (sync loss, PID, CRC, PCR repetition, PTS, CAT)."""
# The interface's health rules (interop.md 11) name exactly these: sync loss (Critical),
# priority 1 = sync byte, PAT, CC, PMT (Error), priority 2 = TEI, PCR discontinuity, PCR accuracy
# (Warning). The other §5.2 indicators raise alarm events but do not change health.
HEALTH_SYNC_LOSS: Final = "sync_loss_count"
HEALTH_P1: Final = ("sync_byte_errors", "pat_errors", "cc_errors", "pmt_errors")
HEALTH_P2: Final = ("tei_errors", "pcr_discontinuity_errors", "pcr_accuracy_errors")


class VideoStream(_Stats):
    pid: int
    stream_type: int
    codec: str
    resolution: str | None = None
    profile: str | None = None
    level: str | None = None
    frame_rate: float | None = None
    bitrate_bps: int = 0


class AudioStream(_Stats):
    pid: int
    stream_type: int
    codec: str
    sample_rate_hz: int | None = None
    channels: int | None = None
    bitrate_bps: int = 0
    language: str | None = None


class MediaAnalysis(_Stats):
    protocol: str
    payload_format: str = "raw_ts"
    fec: dict[str, object] | None = None
    redundancy: dict[str, object] | None = None
    program_count: int = 0
    video_streams: list[VideoStream] = Field(default_factory=list)
    audio_streams: list[AudioStream] = Field(default_factory=list)
    total_bitrate_bps: int = 0


class IatStats(_Stats):
    min_us: float
    max_us: float
    avg_us: float


# --------------------------------------------------------------------------- the worker's report
# What an engine worker sends for each running flow every ``STATS_INTERVAL_S`` (the IPC's
# ``stats`` message): built with these models in the worker, validated with them in the
# control process, so a field renamed on one side fails at once (tests/edge/test_counters.py)
# and an unknown field is a rejected report (logged and counted), never a 500 on GET stats.


class FecCounters(_Stats):
    recovered: int = 0
    unrecoverable: int = 0
    fec_received: int = 0
    fec_malformed: int = 0


class LegCounters(_Stats):
    leg: int
    received: int = 0
    lost: int = 0


class PayloadMergeCounters(_Stats):
    received: list[int] = Field(default_factory=list)
    redundant: int = 0


class RedundancyCounters(_Stats):
    legs: list[LegCounters] = Field(default_factory=list)
    switches: int = 0
    lost_on_both: int = 0
    payload_merge: PayloadMergeCounters | None = None


class InputCounters(_Stats):
    """The input of a running flow, as its driver and the flow's common path count it."""

    state: str
    packets_received: int = 0
    bytes_received: int = 0
    packets_lost: int = 0
    packets_filtered: int = 0
    packets_recovered_fec: int = 0
    redundancy_switches: int = 0
    payload_format: Literal["rtp_ts", "raw_ts"] = "raw_ts"
    fec: FecCounters | None = None
    redundancy: RedundancyCounters | None = None
    srt_stats: SrtLegStats | None = None
    srt_leg2_stats: SrtLegStats | None = None
    peer_addr: str | None = None  # an rtmp input's active publisher, an rtsp input's server (host:port)
    rtsp_stats: RtspStats | None = None  # an rtsp input's session
    webrtc_stats: WebrtcStats | None = None


class OutputCounters(_Stats):
    """One running output, as its driver counts it."""

    output_id: str
    state: str
    packets_sent: int = 0
    bytes_sent: int = 0
    packets_dropped: int = 0
    fec_packets_sent: int = 0
    srt_stats: SrtLegStats | None = None
    srt_leg2_stats: SrtLegStats | None = None
    webrtc_stats: WebrtcStats | None = None


class MediaCounters(_Stats):
    program_count: int = 0
    video_streams: list[VideoStream] = Field(default_factory=list)
    audio_streams: list[AudioStream] = Field(default_factory=list)
    total_bitrate_bps: int = 0


class AnalysisCounters(_Stats):
    tr101290: Tr101290Stats
    media: MediaCounters | None = None
    iat: IatStats | None = None
    pdv_jitter_us: float | None = None


class FlowCounters(_Stats):
    """Everything a worker reports about one running flow."""

    input: InputCounters
    outputs: list[OutputCounters] = Field(default_factory=list)
    analysis: AnalysisCounters


class FlowStats(_Stats):
    flow_id: str
    flow_name: str
    state: FlowState
    health: Health
    uptime_secs: int = 0
    input: InputStats
    outputs: list[OutputStats] = Field(default_factory=list)
    tr101290: Tr101290Stats | None = None
    media_analysis: MediaAnalysis | None = None
    iat: IatStats | None = None
    pdv_jitter_us: float | None = None
    worker: int | None = None
    """The engine worker running the flow (an extension, issue 23: the placement is by load);
    None while the flow is not running."""


class SystemStats(_Stats):
    uptime_secs: int
    total_flows: int
    active_flows: int
    version: str


class TunnelState(StrEnum):
    """Tunnel states (interop.md 2.6): ``Stopped`` is a disabled (or not started) tunnel."""

    STOPPED = "Stopped"
    CONNECTING = "Connecting"
    WAITING = "Waiting"  # bound at the relay, the peer absent
    CONNECTED = "Connected"
    FAILED = "Failed"


class TunnelCounters(_Stats):
    """One tunnel's counters, as the tunnel worker reports them (zeros while not running)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0
    replayed: int = 0
    decrypt_errors: int = 0
    tcp_streams_total: int = 0
    tcp_streams_active: int = 0
    dropped: int = 0


class TunnelSummary(_Stats):
    """The tunnel summary of the edge interface (``GET /api/v1/tunnels``, the manager ``stats``
    payload's ``tunnels``): id, name, protocol, mode, direction, state, local_addr, relay_addr
    (null in direct mode); ``enabled``, ``transport`` and ``stats`` are beyond the interface.
    Never a secret."""

    id: str
    name: str
    enabled: bool
    protocol: str
    mode: str
    direction: str
    transport: str
    state: TunnelState
    local_addr: str
    relay_addr: str | None
    stats: TunnelCounters = Field(default_factory=TunnelCounters)


class StatsSnapshot(_Stats):
    """``data`` of ``GET /api/v1/stats``.

    ``tunnels`` rides along for the manager ``stats`` payload and Prometheus but is left out
    of every dump, so the route's ``data`` stays ``{system, flows}`` as the interface says
    (``GET /api/v1/tunnels`` serves the summaries)."""

    system: SystemStats
    flows: list[FlowStats]
    tunnels: list[TunnelSummary] = Field(default_factory=list, exclude=True)


class HealthStatus(_Stats):
    """The bare body of ``GET /health``."""

    status: Literal["ok"] = "ok"
    version: str
    uptime_secs: int
    active_flows: int
    total_flows: int
