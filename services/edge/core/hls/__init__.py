"""HLS output cores (RFC 8216): the TS segmenter, the live media playlist, the upload URL rule.

Sans-IO: ``HlsSegmenter`` takes TS bytes and answers ``Segment`` objects, ``MediaPlaylist``
takes uploaded segments and renders ``index.m3u8``, ``file_url`` maps a file name to its
upload URL. The trio driver is ``services.edge.engine.kinds.hls_output``; see docs/hls.md.
"""

from .playlist import VERSION, MediaPlaylist, PlaylistEntry, segment_name
from .segmenter import HlsSegmenter, Segment, SegmenterStats
from .target import FILE_PLACEHOLDER, display_url, file_url

__all__ = [
    "FILE_PLACEHOLDER",
    "VERSION",
    "HlsSegmenter",
    "MediaPlaylist",
    "PlaylistEntry",
    "Segment",
    "SegmenterStats",
    "display_url",
    "file_url",
    "segment_name",
]
