"""SRT on Debian's libsrt 1.5 (ctypes), under trio. See docs/srt.md.

Layers: ``binding`` (ctypes, one function per C call), ``options`` (SrtLeg → socket
options, the 400 gate), ``aio`` (poller thread, async sockets), ``runner`` (one leg kept
alive: reconnects, viewers, stats, events). The engine uses the names below.
"""

from __future__ import annotations

from .aio import (
    SrtConnectError,
    SrtConnectionLost,
    SrtListener,
    SrtSocket,
    srt_connect,
    srt_listen,
)
from .binding import LibraryInfo, SrtError, SrtLibraryMissing, library_info
from .options import check_supported
from .runner import (
    SrtConnectFailed,
    SrtLegEvent,
    SrtLegRunner,
    SrtLegState,
    SrtPeerConnected,
    SrtPeerDisconnected,
    SrtPeerRefused,
)

__all__ = [
    "LibraryInfo",
    "SrtConnectError",
    "SrtConnectFailed",
    "SrtConnectionLost",
    "SrtError",
    "SrtLegEvent",
    "SrtLegRunner",
    "SrtLegState",
    "SrtLibraryMissing",
    "SrtListener",
    "SrtPeerConnected",
    "SrtPeerDisconnected",
    "SrtPeerRefused",
    "SrtSocket",
    "check_supported",
    "library_info",
    "srt_connect",
    "srt_listen",
]
