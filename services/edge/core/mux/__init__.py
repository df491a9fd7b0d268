"""Access units <-> MPEG-TS for the non-TS ingest kinds (RTMP, RTSP, WebRTC, HLS). Sans-IO.

See docs/mux.md. ``TsMuxer`` writes one program (H.264/HEVC + AAC) as TS packets,
``TsDemuxer`` reads access units back, ``codec`` converts between AVCC/HVCC/ASC and the
Annex B / ADTS framings that MPEG-TS carries.
"""

from .codec import (
    AacConfig,
    AvcConfig,
    HevcConfig,
    ParameterSetInserter,
    ParameterSets,
    build_adts_frame,
    build_asc,
    build_avcc,
    build_hvcc,
    parse_adts,
    parse_asc,
    parse_avcc,
    parse_hvcc,
)
from .ts_demux import DemuxStats, TsDemuxer
from .ts_mux import DatagramPacker, MuxConfig, MuxStats, TsMuxer, chunk_datagrams
from .units import AccessUnit

__all__ = [
    "AacConfig",
    "AccessUnit",
    "AvcConfig",
    "DatagramPacker",
    "DemuxStats",
    "HevcConfig",
    "MuxConfig",
    "MuxStats",
    "ParameterSetInserter",
    "ParameterSets",
    "TsDemuxer",
    "TsMuxer",
    "build_adts_frame",
    "build_asc",
    "build_avcc",
    "build_hvcc",
    "chunk_datagrams",
    "parse_adts",
    "parse_asc",
    "parse_avcc",
    "parse_hvcc",
]

from .from_units import UnitsToTs, UnitsToTsStats  # appended: the live-source front of TsMuxer

__all__ += ["UnitsToTs", "UnitsToTsStats"]
