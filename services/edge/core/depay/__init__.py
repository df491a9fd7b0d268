"""The sans-IO media side of an RTSP (RTP/RTCP) input: depacketisers, RTCP, ``MediaSession``.

* :mod:`.video`: RFC 6184 H.264 and RFC 7798 H.265 depacketisers (Annex B out).
* :mod:`.audio`: RFC 3640 ``mpeg4-generic`` AAC-hbr/lbr and RFC 6416 ``MP4A-LATM`` (ADTS out).
* :mod:`.factory`: ``make_depacketizer(encoding, clock_rate, channels, fmtp)``.
* :mod:`.rtcp`: RFC 3550 reception statistics, RTCP parsing, receiver reports.
* :mod:`.session`: ``MediaSession``, everything between the RTSP driver's sockets and the TS
  datagrams: track choice, depacketising, timing (RTP -> 90 kHz, lip sync through RTCP SRs,
  DTS for B-frames), and :class:`~..mux.from_units.UnitsToTs` for the program and interleaving.

Nothing here does I/O: arrival times, SSRCs and the RTP/RTCP bytes are passed in.
"""

from .audio import AacHbrDepacketizer, LatmDepacketizer
from .common import MAX_UNIT_BYTES, Depacketizer, DepayStats, Frame
from .factory import SUPPORTED_ENCODINGS, make_depacketizer
from .rtcp import ReceptionStats, ReportBlock, SenderReport, build_receiver_report, parse_rtcp
from .session import MediaSession, SessionStats, TrackSpec
from .video import H264Depacketizer, HevcDepacketizer

__all__ = [
    "MAX_UNIT_BYTES",
    "SUPPORTED_ENCODINGS",
    "AacHbrDepacketizer",
    "Depacketizer",
    "DepayStats",
    "Frame",
    "H264Depacketizer",
    "HevcDepacketizer",
    "LatmDepacketizer",
    "MediaSession",
    "ReceptionStats",
    "ReportBlock",
    "SenderReport",
    "SessionStats",
    "TrackSpec",
    "build_receiver_report",
    "make_depacketizer",
    "parse_rtcp",
]
