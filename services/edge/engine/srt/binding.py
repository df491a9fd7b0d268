"""ctypes binding to libsrt 1.5 (Debian's ``libsrt1.5-openssl``).

Why ctypes and not a PyPI package: no maintained binding exists, and one published
binding declares a truncated ``SRT_TRACEBSTATS`` that ``srt_bstats`` overruns. Every
struct and constant here is checked against ``/usr/include/srt/srt.h`` by
``tests/edge/engine/srt/test_layout.py``, which compiles a C program with gcc.

Thin on purpose: one Python function per C call used, each checking the return
value and raising :class:`SrtError` with libsrt's own text. No trio here (see ``aio``).

ctypes (``CDLL``) releases the GIL around every foreign call, so the poller thread
blocked in ``srt_epoll_uwait`` never stalls the trio thread.

libsrt keeps the last error per thread: each wrapper reads it on the same thread
right after the failing call.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Final

# --------------------------------------------------------------------------- constants (srt.h)

SRTSOCKET = ctypes.c_int32
SRT_INVALID_SOCK: Final = -1
SRT_ERROR: Final = -1

# enum SRT_SOCKSTATUS
SRTS_INIT: Final = 1
SRTS_OPENED: Final = 2
SRTS_LISTENING: Final = 3
SRTS_CONNECTING: Final = 4
SRTS_CONNECTED: Final = 5
SRTS_BROKEN: Final = 6
SRTS_CLOSING: Final = 7
SRTS_CLOSED: Final = 8
SRTS_NONEXIST: Final = 9

# enum SRT_SOCKOPT (the options this package uses; values fixed by the ABI)
SRTO_MSS: Final = 0
SRTO_SNDSYN: Final = 1
SRTO_RCVSYN: Final = 2
SRTO_FC: Final = 4
SRTO_SNDBUF: Final = 5
SRTO_RCVBUF: Final = 6
SRTO_RENDEZVOUS: Final = 12
SRTO_REUSEADDR: Final = 15
SRTO_MAXBW: Final = 16
SRTO_STATE: Final = 17
SRTO_LATENCY: Final = 23
SRTO_INPUTBW: Final = 24
SRTO_OHEADBW: Final = 25
SRTO_PASSPHRASE: Final = 26
SRTO_PBKEYLEN: Final = 27
SRTO_KMSTATE: Final = 28
SRTO_IPTTL: Final = 29
SRTO_IPTOS: Final = 30
SRTO_TLPKTDROP: Final = 31
SRTO_SNDDROPDELAY: Final = 32
SRTO_VERSION: Final = 34
SRTO_PEERVERSION: Final = 35
SRTO_CONNTIMEO: Final = 36
SRTO_SNDKMSTATE: Final = 40
SRTO_RCVKMSTATE: Final = 41
SRTO_LOSSMAXTTL: Final = 42
SRTO_RCVLATENCY: Final = 43
SRTO_PEERLATENCY: Final = 44
SRTO_STREAMID: Final = 46
SRTO_PAYLOADSIZE: Final = 49
SRTO_TRANSTYPE: Final = 50
SRTO_KMREFRESHRATE: Final = 51
SRTO_KMPREANNOUNCE: Final = 52
SRTO_ENFORCEDENCRYPTION: Final = 53
SRTO_PEERIDLETIMEO: Final = 55
SRTO_PACKETFILTER: Final = 60
SRTO_RETRANSMITALGO: Final = 61
# Not in 1.5.1's srt.h: 1.5.2+ built with ENABLE_AEAD_API_PREVIEW / ENABLE_MAXREXMITBW.
# Only ever probed (``option_supported``), never assumed.
SRTO_CRYPTOMODE: Final = 62
SRTO_MAXREXMITBW: Final = 63

SRTT_LIVE: Final = 0

# enum SRT_KM_STATE
SRT_KM_S_UNSECURED: Final = 0
SRT_KM_S_SECURING: Final = 1
SRT_KM_S_SECURED: Final = 2
SRT_KM_S_NOSECRET: Final = 3
SRT_KM_S_BADSECRET: Final = 4

# enum SRT_EPOLL_OPT and SRT_EPOLL_FLAGS
SRT_EPOLL_IN: Final = 0x1
SRT_EPOLL_OUT: Final = 0x4
SRT_EPOLL_ERR: Final = 0x8
SRT_EPOLL_UPDATE: Final = 0x10
SRT_EPOLL_ET: Final = -(1 << 31)  # 1u << 31 as the C int the API takes
SRT_EPOLL_ENABLE_EMPTY: Final = 1

# enum SRT_ERRNO (the codes this package tests for)
SRT_EUNKNOWN: Final = -1
SRT_ECONNSETUP: Final = 1000
SRT_ENOSERVER: Final = 1001
SRT_ECONNREJ: Final = 1002
SRT_ESECFAIL: Final = 1004
SRT_ECONNLOST: Final = 2001
SRT_ENOCONN: Final = 2002
SRT_EINVPARAM: Final = 5003
SRT_EINVSOCK: Final = 5004
SRT_EBINDCONFLICT: Final = 5015
SRT_EASYNCSND: Final = 6001
SRT_EASYNCRCV: Final = 6002
SRT_ETIMEOUT: Final = 6003

# enum SRT_REJECT_REASON
SRT_REJ_UNKNOWN: Final = 0
SRT_REJ_PEER: Final = 2
SRT_REJ_BADSECRET: Final = 10
SRT_REJ_UNSECURE: Final = 11
SRT_REJ_TIMEOUT: Final = 16

SRT_LIVE_MAX_PLSIZE: Final = 1456

# logging_api.h / syslog levels accepted by srt_setloglevel
LOG_CRIT: Final = 2
LOG_ERR: Final = 3
LOG_WARNING: Final = 4

# --------------------------------------------------------------------------- structs (srt.h)


class SRT_TRACEBSTATS(ctypes.Structure):
    """``struct CBytePerfMon`` in full, every field in header order (srt 1.5.x)."""

    _fields_ = [
        # global measurements
        ("msTimeStamp", ctypes.c_int64),
        ("pktSentTotal", ctypes.c_int64),
        ("pktRecvTotal", ctypes.c_int64),
        ("pktSndLossTotal", ctypes.c_int),
        ("pktRcvLossTotal", ctypes.c_int),
        ("pktRetransTotal", ctypes.c_int),
        ("pktSentACKTotal", ctypes.c_int),
        ("pktRecvACKTotal", ctypes.c_int),
        ("pktSentNAKTotal", ctypes.c_int),
        ("pktRecvNAKTotal", ctypes.c_int),
        ("usSndDurationTotal", ctypes.c_int64),
        ("pktSndDropTotal", ctypes.c_int),
        ("pktRcvDropTotal", ctypes.c_int),
        ("pktRcvUndecryptTotal", ctypes.c_int),
        ("byteSentTotal", ctypes.c_uint64),
        ("byteRecvTotal", ctypes.c_uint64),
        ("byteRcvLossTotal", ctypes.c_uint64),
        ("byteRetransTotal", ctypes.c_uint64),
        ("byteSndDropTotal", ctypes.c_uint64),
        ("byteRcvDropTotal", ctypes.c_uint64),
        ("byteRcvUndecryptTotal", ctypes.c_uint64),
        # local measurements
        ("pktSent", ctypes.c_int64),
        ("pktRecv", ctypes.c_int64),
        ("pktSndLoss", ctypes.c_int),
        ("pktRcvLoss", ctypes.c_int),
        ("pktRetrans", ctypes.c_int),
        ("pktRcvRetrans", ctypes.c_int),
        ("pktSentACK", ctypes.c_int),
        ("pktRecvACK", ctypes.c_int),
        ("pktSentNAK", ctypes.c_int),
        ("pktRecvNAK", ctypes.c_int),
        ("mbpsSendRate", ctypes.c_double),
        ("mbpsRecvRate", ctypes.c_double),
        ("usSndDuration", ctypes.c_int64),
        ("pktReorderDistance", ctypes.c_int),
        ("pktRcvAvgBelatedTime", ctypes.c_double),
        ("pktRcvBelated", ctypes.c_int64),
        ("pktSndDrop", ctypes.c_int),
        ("pktRcvDrop", ctypes.c_int),
        ("pktRcvUndecrypt", ctypes.c_int),
        ("byteSent", ctypes.c_uint64),
        ("byteRecv", ctypes.c_uint64),
        ("byteRcvLoss", ctypes.c_uint64),
        ("byteRetrans", ctypes.c_uint64),
        ("byteSndDrop", ctypes.c_uint64),
        ("byteRcvDrop", ctypes.c_uint64),
        ("byteRcvUndecrypt", ctypes.c_uint64),
        # instant measurements
        ("usPktSndPeriod", ctypes.c_double),
        ("pktFlowWindow", ctypes.c_int),
        ("pktCongestionWindow", ctypes.c_int),
        ("pktFlightSize", ctypes.c_int),
        ("msRTT", ctypes.c_double),
        ("mbpsBandwidth", ctypes.c_double),
        ("byteAvailSndBuf", ctypes.c_int),
        ("byteAvailRcvBuf", ctypes.c_int),
        ("mbpsMaxBW", ctypes.c_double),
        ("byteMSS", ctypes.c_int),
        ("pktSndBuf", ctypes.c_int),
        ("byteSndBuf", ctypes.c_int),
        ("msSndBuf", ctypes.c_int),
        ("msSndTsbPdDelay", ctypes.c_int),
        ("pktRcvBuf", ctypes.c_int),
        ("byteRcvBuf", ctypes.c_int),
        ("msRcvBuf", ctypes.c_int),
        ("msRcvTsbPdDelay", ctypes.c_int),
        ("pktSndFilterExtraTotal", ctypes.c_int),
        ("pktRcvFilterExtraTotal", ctypes.c_int),
        ("pktRcvFilterSupplyTotal", ctypes.c_int),
        ("pktRcvFilterLossTotal", ctypes.c_int),
        ("pktSndFilterExtra", ctypes.c_int),
        ("pktRcvFilterExtra", ctypes.c_int),
        ("pktRcvFilterSupply", ctypes.c_int),
        ("pktRcvFilterLoss", ctypes.c_int),
        ("pktReorderTolerance", ctypes.c_int),
        # new in 1.5.0
        ("pktSentUniqueTotal", ctypes.c_int64),
        ("pktRecvUniqueTotal", ctypes.c_int64),
        ("byteSentUniqueTotal", ctypes.c_uint64),
        ("byteRecvUniqueTotal", ctypes.c_uint64),
        ("pktSentUnique", ctypes.c_int64),
        ("pktRecvUnique", ctypes.c_int64),
        ("byteSentUnique", ctypes.c_uint64),
        ("byteRecvUnique", ctypes.c_uint64),
    ]


class SRT_MSGCTRL(ctypes.Structure):
    """``SRT_MSGCTRL``: per-message control for ``srt_sendmsg2`` / ``srt_recvmsg2``."""

    _fields_ = [
        ("flags", ctypes.c_int),
        ("msgttl", ctypes.c_int),
        ("inorder", ctypes.c_int),
        ("boundary", ctypes.c_int),
        ("srctime", ctypes.c_int64),
        ("pktseq", ctypes.c_int32),
        ("msgno", ctypes.c_int32),
        ("grpdata", ctypes.c_void_p),
        ("grpdata_size", ctypes.c_size_t),
    ]


class SRT_EPOLL_EVENT(ctypes.Structure):
    """``SRT_EPOLL_EVENT``: one entry of ``srt_epoll_uwait``'s output array."""

    _fields_ = [("fd", SRTSOCKET), ("events", ctypes.c_int)]


# --------------------------------------------------------------------------- errors


class SrtError(Exception):
    """A libsrt call failed. ``code`` is libsrt's SRT_ERRNO; the message is libsrt's text."""

    def __init__(self, message: str, code: int = SRT_EUNKNOWN) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class SrtLibraryMissing(SrtError):
    """libsrt could not be loaded (package ``libsrt1.5-openssl`` missing)."""


# --------------------------------------------------------------------------- loading

# Debian's OpenSSL build first (libsrt1.5-openssl), then the GnuTLS one (libsrt1.5-gnutls).
_CANDIDATES: Final = ("libsrt.so.1.5", "libsrt-gnutls.so.1.5", "libsrt.so")

_lib: ctypes.CDLL | None = None
_lib_name: str | None = None
_load_lock = threading.Lock()
_started = False

_c_int = ctypes.c_int
_c_int_p = ctypes.POINTER(ctypes.c_int)


def _declare(lib: ctypes.CDLL) -> None:
    def fn(name: str, restype: object, *argtypes: object) -> None:
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = argtypes

    vp = ctypes.c_void_p
    fn("srt_startup", _c_int)
    fn("srt_cleanup", _c_int)
    fn("srt_getversion", ctypes.c_uint32)
    fn("srt_setloglevel", None, _c_int)
    fn("srt_create_socket", SRTSOCKET)
    fn("srt_bind", _c_int, SRTSOCKET, vp, _c_int)
    fn("srt_listen", _c_int, SRTSOCKET, _c_int)
    fn("srt_accept", SRTSOCKET, SRTSOCKET, vp, _c_int_p)
    fn("srt_connect", _c_int, SRTSOCKET, vp, _c_int)
    fn("srt_rendezvous", _c_int, SRTSOCKET, vp, _c_int, vp, _c_int)
    fn("srt_close", _c_int, SRTSOCKET)
    fn("srt_getpeername", _c_int, SRTSOCKET, vp, _c_int_p)
    fn("srt_getsockname", _c_int, SRTSOCKET, vp, _c_int_p)
    fn("srt_getsockflag", _c_int, SRTSOCKET, _c_int, vp, _c_int_p)
    fn("srt_setsockflag", _c_int, SRTSOCKET, _c_int, vp, _c_int)
    fn("srt_sendmsg2", _c_int, SRTSOCKET, vp, _c_int, ctypes.POINTER(SRT_MSGCTRL))
    fn("srt_recvmsg2", _c_int, SRTSOCKET, vp, _c_int, ctypes.POINTER(SRT_MSGCTRL))
    fn("srt_getlasterror_str", ctypes.c_char_p)
    fn("srt_getlasterror", _c_int, _c_int_p)
    fn("srt_clearlasterror", None)
    fn("srt_bstats", _c_int, SRTSOCKET, ctypes.POINTER(SRT_TRACEBSTATS), _c_int)
    fn("srt_bistats", _c_int, SRTSOCKET, ctypes.POINTER(SRT_TRACEBSTATS), _c_int, _c_int)
    fn("srt_getsockstate", _c_int, SRTSOCKET)
    fn("srt_getrejectreason", _c_int, SRTSOCKET)
    fn("srt_rejectreason_str", ctypes.c_char_p, _c_int)
    fn("srt_time_now", ctypes.c_int64)
    fn("srt_connection_time", ctypes.c_int64, SRTSOCKET)
    fn("srt_epoll_create", _c_int)
    fn("srt_epoll_add_usock", _c_int, _c_int, SRTSOCKET, _c_int_p)
    fn("srt_epoll_update_usock", _c_int, _c_int, SRTSOCKET, _c_int_p)
    fn("srt_epoll_remove_usock", _c_int, _c_int, SRTSOCKET)
    fn("srt_epoll_uwait", _c_int, _c_int, ctypes.POINTER(SRT_EPOLL_EVENT), _c_int, ctypes.c_int64)
    fn("srt_epoll_set", ctypes.c_int32, _c_int, ctypes.c_int32)
    fn("srt_epoll_release", _c_int, _c_int)


def lib() -> ctypes.CDLL:
    """The loaded libsrt, after ``srt_startup`` (once per process; never cleaned up early).

    ``MEDIAPLANE_LIBSRT`` names a library file to use instead of the search list.
    Raises :class:`SrtLibraryMissing` when none loads.
    """
    global _lib, _lib_name, _started
    if _lib is not None and _started:
        return _lib
    with _load_lock:
        if _lib is None:
            names = [os.environ["MEDIAPLANE_LIBSRT"]] if os.environ.get("MEDIAPLANE_LIBSRT") else list(_CANDIDATES)
            errors = []
            for name in names:
                try:
                    candidate = ctypes.CDLL(name, use_errno=True)
                except OSError as exc:
                    errors.append(f"{name}: {exc}")
                    continue
                _declare(candidate)
                _lib, _lib_name = candidate, name
                break
            else:
                raise SrtLibraryMissing("cannot load libsrt (install libsrt1.5-openssl): " + "; ".join(errors))
        if not _started:
            if _lib.srt_startup() < 0:
                raise SrtError("srt_startup failed: " + _last_error_text(_lib))
            _started = True
    return _lib


def library_name() -> str:
    """The file name libsrt was loaded from, e.g. ``libsrt.so.1.5``."""
    lib()
    assert _lib_name is not None
    return _lib_name


def version() -> tuple[int, int, int]:
    """libsrt's run-time version, e.g. ``(1, 5, 1)``."""
    v = int(lib().srt_getversion())
    return (v >> 16) & 0xFF, (v >> 8) & 0xFF, v & 0xFF


def set_log_level(level: int) -> None:
    """libsrt's own stderr logging threshold (syslog levels: ``LOG_CRIT``, ``LOG_ERR``...)."""
    lib().srt_setloglevel(level)


def _last_error_text(library: ctypes.CDLL) -> str:
    raw = library.srt_getlasterror_str()
    return raw.decode(errors="replace") if raw else "unknown libsrt error"


def last_error() -> tuple[int, str]:
    """This thread's last libsrt error: ``(SRT_ERRNO, text)``."""
    library = lib()
    code = int(library.srt_getlasterror(None))
    return code, _last_error_text(library)


def _raise(what: str) -> SrtError:
    code, text = last_error()
    return SrtError(f"{what}: {text}", code)


# --------------------------------------------------------------------------- addresses


def sockaddr(host: str, port: int) -> ctypes.Array[ctypes.c_char]:
    """A ``sockaddr_in`` or ``sockaddr_in6`` for an IP literal."""
    ip = ipaddress.ip_address(host)
    if ip.version == 4:
        raw = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + ip.packed + b"\0" * 8
    else:
        raw = struct.pack("=H", socket.AF_INET6) + struct.pack("!HI", port, 0) + ip.packed + struct.pack("=I", 0)
    return ctypes.create_string_buffer(raw, len(raw))


def _parse_sockaddr(raw: bytes) -> tuple[str, int]:
    family = struct.unpack_from("=H", raw)[0]
    (port,) = struct.unpack_from("!H", raw, 2)
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(raw[4:8])), port
    if family == socket.AF_INET6:
        return str(ipaddress.IPv6Address(raw[8:24])), port
    raise SrtError(f"unexpected address family {family}")


# --------------------------------------------------------------------------- sockets


def create_socket() -> int:
    sock = int(lib().srt_create_socket())
    if sock == SRT_INVALID_SOCK:
        raise _raise("srt_create_socket")
    return sock


def close(sock: int) -> None:
    """Close; never raises (a socket libsrt already reaped is simply gone)."""
    lib().srt_close(sock)


def bind(sock: int, host: str, port: int) -> None:
    addr = sockaddr(host, port)
    if lib().srt_bind(sock, addr, len(addr)) == SRT_ERROR:
        raise _raise(f"cannot bind {host}:{port}")


def listen(sock: int, backlog: int) -> None:
    if lib().srt_listen(sock, backlog) == SRT_ERROR:
        raise _raise("srt_listen")


def accept(sock: int) -> tuple[int, tuple[str, int]] | None:
    """One pending connection, or None when none is pending (non-blocking listener)."""
    buf = ctypes.create_string_buffer(128)
    size = ctypes.c_int(128)
    library = lib()
    new = int(library.srt_accept(sock, buf, ctypes.byref(size)))
    if new == SRT_INVALID_SOCK:
        code, text = last_error()
        if code == SRT_EASYNCRCV:
            return None
        raise SrtError(f"srt_accept: {text}", code)
    return new, _parse_sockaddr(buf.raw[: size.value])


def connect(sock: int, host: str, port: int) -> None:
    """Start (non-blocking socket) or complete (blocking) a caller connection."""
    addr = sockaddr(host, port)
    if lib().srt_connect(sock, addr, len(addr)) == SRT_ERROR:
        raise _raise(f"cannot connect to {host}:{port}")


def rendezvous(sock: int, local: tuple[str, int], remote: tuple[str, int]) -> None:
    la, ra = sockaddr(*local), sockaddr(*remote)
    if lib().srt_rendezvous(sock, la, len(la), ra, len(ra)) == SRT_ERROR:
        raise _raise(f"rendezvous {local[0]}:{local[1]} <-> {remote[0]}:{remote[1]}")


def getsockname(sock: int) -> tuple[str, int]:
    buf = ctypes.create_string_buffer(128)
    size = ctypes.c_int(128)
    if lib().srt_getsockname(sock, buf, ctypes.byref(size)) == SRT_ERROR:
        raise _raise("srt_getsockname")
    return _parse_sockaddr(buf.raw[: size.value])


def getpeername(sock: int) -> tuple[str, int]:
    buf = ctypes.create_string_buffer(128)
    size = ctypes.c_int(128)
    if lib().srt_getpeername(sock, buf, ctypes.byref(size)) == SRT_ERROR:
        raise _raise("srt_getpeername")
    return _parse_sockaddr(buf.raw[: size.value])


def getsockstate(sock: int) -> int:
    return int(lib().srt_getsockstate(sock))


def getrejectreason(sock: int) -> tuple[int, str]:
    library = lib()
    code = int(library.srt_getrejectreason(sock))
    raw = library.srt_rejectreason_str(code)
    return code, raw.decode(errors="replace") if raw else f"reject reason {code}"


def connection_age_ms(sock: int) -> int:
    """Milliseconds since the connection was established (0 when it never was)."""
    library = lib()
    start = int(library.srt_connection_time(sock))
    if start <= 0:
        return 0
    return max(0, (int(library.srt_time_now()) - start) // 1000)


# --------------------------------------------------------------------------- options

# How each option's value is passed: the C type libsrt's setter checks the length of.
_OPT_INT64: Final = frozenset({SRTO_MAXBW, SRTO_INPUTBW, SRTO_MAXREXMITBW})
_OPT_BOOL: Final = frozenset(
    {SRTO_SNDSYN, SRTO_RCVSYN, SRTO_RENDEZVOUS, SRTO_REUSEADDR, SRTO_TLPKTDROP, SRTO_ENFORCEDENCRYPTION}
)
_OPT_STRING: Final = frozenset({SRTO_PASSPHRASE, SRTO_STREAMID, SRTO_PACKETFILTER})
OptionValue = int | bool | str


def setsockflag(sock: int, opt: int, value: OptionValue) -> None:
    """Set one option. Strings are UTF-8; ints are ``int`` or ``int64_t`` as libsrt expects."""
    buf: ctypes._SimpleCData[int] | ctypes.Array[ctypes.c_char]
    if opt in _OPT_STRING:
        assert isinstance(value, str)
        raw = value.encode()
        buf = ctypes.create_string_buffer(raw, len(raw) or 1)
        size = len(raw)
    elif opt in _OPT_INT64:
        buf = ctypes.c_int64(int(value))
        size = 8
    elif opt in _OPT_BOOL:
        buf = ctypes.c_int(1 if value else 0)
        size = ctypes.sizeof(ctypes.c_int)
    else:
        buf = ctypes.c_int(int(value))
        size = ctypes.sizeof(ctypes.c_int)
    if lib().srt_setsockflag(sock, opt, ctypes.byref(buf), size) == SRT_ERROR:
        raise _raise(f"option {opt}")


def getsockflag(sock: int, opt: int) -> OptionValue:
    """Read one option back (passphrases are write-only in libsrt: they read as empty)."""
    library = lib()
    if opt in _OPT_STRING:
        sbuf = ctypes.create_string_buffer(1024)
        size = ctypes.c_int(1024)
        if library.srt_getsockflag(sock, opt, sbuf, ctypes.byref(size)) == SRT_ERROR:
            raise _raise(f"get option {opt}")
        return sbuf.raw[: size.value].decode(errors="replace")
    if opt in _OPT_INT64:
        v64 = ctypes.c_int64(0)
        size = ctypes.c_int(8)
        if library.srt_getsockflag(sock, opt, ctypes.byref(v64), ctypes.byref(size)) == SRT_ERROR:
            raise _raise(f"get option {opt}")
        return int(v64.value)
    # bools come back as a C++ bool (1 byte) in a zeroed int: read as int either way
    v = ctypes.c_int(0)
    size = ctypes.c_int(ctypes.sizeof(ctypes.c_int))
    if library.srt_getsockflag(sock, opt, ctypes.byref(v), ctypes.byref(size)) == SRT_ERROR:
        raise _raise(f"get option {opt}")
    if opt in _OPT_BOOL:
        return bool(v.value & 0xFF if size.value == 1 else v.value)
    return int(v.value)


_probe_cache: dict[tuple[int, int], bool] = {}


def option_supported(opt: int, probe_value: int) -> bool:
    """Whether this libsrt accepts ``opt`` set to ``probe_value`` (probed once on a scratch socket)."""
    key = (opt, probe_value)
    if key not in _probe_cache:
        sock = create_socket()
        try:
            setsockflag(sock, opt, probe_value)
            _probe_cache[key] = True
        except SrtError:
            _probe_cache[key] = False
        finally:
            close(sock)
    return _probe_cache[key]


# --------------------------------------------------------------------------- data


def _c_buffer(data: bytes | bytearray | memoryview) -> tuple[object, int]:
    if isinstance(data, bytes):
        return data, len(data)
    if isinstance(data, memoryview) and data.readonly:
        raw = data.tobytes()
        return raw, len(raw)
    arr = (ctypes.c_char * len(data)).from_buffer(data)
    return arr, len(data)


def sendmsg(sock: int, data: bytes | bytearray | memoryview) -> int:
    """One live-mode message. Returns its size, or 0 when the send buffer is full
    (``SRT_EASYNCSND`` on a non-blocking socket). Raises SrtError otherwise."""
    library = lib()
    buf, size = _c_buffer(data)
    n = int(library.srt_sendmsg2(sock, buf, size, None))
    if n == SRT_ERROR:
        code, text = last_error()
        if code == SRT_EASYNCSND:
            return 0
        raise SrtError(f"send: {text}", code)
    return n


def c_buffer(buf: bytearray | memoryview) -> ctypes.Array[ctypes.c_char]:
    """A ctypes view of a writable buffer, for ``recvmsg`` (making one costs ~2 µs: reuse it)."""
    return (ctypes.c_char * len(buf)).from_buffer(buf)


def recvmsg(sock: int, buf: bytearray | memoryview | ctypes.Array[ctypes.c_char]) -> int:
    """One message into ``buf`` (or a ``c_buffer`` made once for it). Returns its size,
    or 0 when none is ready (``SRT_EASYNCRCV`` on a non-blocking socket). Raises SrtError
    otherwise."""
    library = lib()
    arr = buf if isinstance(buf, ctypes.Array) else c_buffer(buf)
    n = int(library.srt_recvmsg2(sock, arr, len(arr), None))
    if n == SRT_ERROR:
        code, text = last_error()
        if code == SRT_EASYNCRCV:
            return 0
        raise SrtError(f"receive: {text}", code)
    return n


def bistats(sock: int, clear: bool) -> SRT_TRACEBSTATS:
    """``srt_bistats`` (instantaneous buffer figures). Fails once the socket is gone."""
    perf = SRT_TRACEBSTATS()
    if lib().srt_bistats(sock, ctypes.byref(perf), 1 if clear else 0, 1) == SRT_ERROR:
        raise _raise("srt_bistats")
    return perf


def bstats(sock: int, clear: bool) -> SRT_TRACEBSTATS:
    """``srt_bstats`` (moving-average buffer figures)."""
    perf = SRT_TRACEBSTATS()
    if lib().srt_bstats(sock, ctypes.byref(perf), 1 if clear else 0) == SRT_ERROR:
        raise _raise("srt_bstats")
    return perf


# --------------------------------------------------------------------------- epoll


def epoll_create() -> int:
    eid = int(lib().srt_epoll_create())
    if eid < 0:
        raise _raise("srt_epoll_create")
    return eid


def epoll_set_flags(eid: int, flags: int) -> int:
    """``srt_epoll_set``: returns the previous flags."""
    old = int(lib().srt_epoll_set(eid, flags))
    if old < 0:
        raise _raise("srt_epoll_set")
    return old


def epoll_add(eid: int, sock: int, events: int) -> None:
    ev = ctypes.c_int(events)
    if lib().srt_epoll_add_usock(eid, sock, ctypes.byref(ev)) == SRT_ERROR:
        raise _raise("srt_epoll_add_usock")


def epoll_update(eid: int, sock: int, events: int) -> None:
    """Change the watched events, keeping libsrt's readiness state (0 would unsubscribe)."""
    ev = ctypes.c_int(events)
    if lib().srt_epoll_update_usock(eid, sock, ctypes.byref(ev)) == SRT_ERROR:
        raise _raise("srt_epoll_update_usock")


def epoll_remove(eid: int, sock: int) -> None:
    lib().srt_epoll_remove_usock(eid, sock)


def epoll_uwait(eid: int, events: ctypes.Array[SRT_EPOLL_EVENT], timeout_ms: int) -> int:
    """Block (GIL released) up to ``timeout_ms``; returns how many entries of ``events`` are set."""
    n = int(lib().srt_epoll_uwait(eid, events, len(events), timeout_ms))
    if n < 0:
        raise _raise("srt_epoll_uwait")
    return n


def epoll_release(eid: int) -> None:
    lib().srt_epoll_release(eid)


@dataclass(frozen=True, slots=True)
class LibraryInfo:
    """What the loaded libsrt is and supports."""

    name: str
    version: tuple[int, int, int]
    aes_gcm: bool
    max_rexmit_bw: bool


def library_info() -> LibraryInfo:
    """The loaded libsrt's file, version and optional features (probed, not assumed)."""
    return LibraryInfo(
        name=library_name(),
        version=version(),
        aes_gcm=option_supported(SRTO_CRYPTOMODE, 2),  # SRT_CRYPTOMODE_AES_GCM = 2
        max_rexmit_bw=option_supported(SRTO_MAXREXMITBW, -1),
    )
