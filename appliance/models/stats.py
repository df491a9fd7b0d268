"""The one statistics snapshot model (edge interface section 2).

The control process builds these once per stats tick from the engine workers'
counters merged with the configuration. The same objects feed
``GET /api/v1/stats``, the WebSocket stream and the Prometheus collector.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

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


class Tr101290Stats(_Stats):
    """TR 101 290 counters, cumulative from the flow's first TS packet."""

    ts_packets_analyzed: int = 0
    pat_count: int = 0
    pmt_count: int = 0
    sync_loss_count: int = 0
    sync_byte_errors: int = 0
    cc_errors: int = 0
    pat_errors: int = 0
    pmt_errors: int = 0
    tei_errors: int = 0
    pcr_discontinuity_errors: int = 0
    pcr_accuracy_errors: int = 0
    priority1_ok: bool = True
    priority2_ok: bool = True
    tr07_compliant: bool = False
    jpeg_xs_pid: int | None = None
    # Beyond the interface's fields (docs/analysis.md): the rest of TR 101 290 §5.2.
    pid_errors: int = 0
    crc_errors: int = 0
    pcr_repetition_errors: int = 0
    pts_errors: int = 0
    cat_errors: int = 0
    section_errors: int = 0
    truncated_packets: int = 0


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


class SystemStats(_Stats):
    uptime_secs: int
    total_flows: int
    active_flows: int
    version: str


class StatsSnapshot(_Stats):
    """``data`` of ``GET /api/v1/stats``."""

    system: SystemStats
    flows: list[FlowStats]


class HealthStatus(_Stats):
    """The bare body of ``GET /health``."""

    status: Literal["ok"] = "ok"
    version: str
    uptime_secs: int
    active_flows: int
    total_flows: int
