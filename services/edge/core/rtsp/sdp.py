"""SDP (RFC 8866) as cameras send it in a DESCRIBE answer, and control URL resolution (RFC 2326 §C.1.1).

:func:`parse_sdp` keeps what an RTSP client needs: session- and media-level ``a=control``, the
``m=`` lines with their ``a=rtpmap`` / ``a=fmtp`` / ``b=`` lines, and every attribute as raw text.
It is tolerant of camera quirks: no ``v=`` or ``o=`` line, unknown or malformed lines (skipped),
CRLF or LF, blank lines, duplicate attributes (the first wins), a trailing ``;`` in ``a=fmtp``, and
static payload types without ``a=rtpmap`` (filled from RFC 3551 §6 tables 4 and 5). It raises
:class:`SdpError` only when no usable ``m=`` section is left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit, urlunsplit


class SdpError(ValueError):
    """The session description has no usable media section."""


@dataclass(frozen=True, slots=True)
class RtpMap:
    """``a=rtpmap:<pt> <encoding>/<clock rate>[/<channels>]`` (RFC 8866 §6.6)."""

    payload_type: int
    encoding: str  # as written; see MediaDescription.encoding_of for the upper-cased name
    clock_rate: int
    channels: int | None = None


@dataclass(frozen=True, slots=True)
class MediaDescription:
    """One ``m=`` section (RFC 8866 §5.14) and the attributes an RTSP client uses."""

    media: str  # "video", "audio", "application", ...
    port: int
    proto: str  # "RTP/AVP", "RTP/AVPF", ...
    formats: tuple[str, ...]  # payload types as written (normally decimal)
    rtpmaps: dict[int, RtpMap] = field(default_factory=dict)  # explicit or from RFC 3551
    fmtps: dict[int, dict[str, str]] = field(default_factory=dict)  # keys lower-cased, values raw
    control: str | None = None  # a=control (RFC 2326 §C.1.1)
    bandwidth: dict[str, int] = field(default_factory=dict)  # b=<type>:<kbit/s> (RFC 8866 §5.8)
    attributes: tuple[tuple[str, str | None], ...] = ()  # every a= line, in order

    @property
    def payload_types(self) -> list[int]:
        """The formats that are RTP payload type numbers (0..127), in order."""
        return [int(f) for f in self.formats if f.isascii() and f.isdigit() and int(f) <= 127]

    def attribute(self, name: str) -> str | None:
        """The value of the first ``a=<name>`` (a flag attribute gives ""), or None."""
        for key, value in self.attributes:
            if key == name:
                return "" if value is None else value
        return None


@dataclass(frozen=True, slots=True)
class SessionDescription:
    """A parsed session description (RFC 8866 §5)."""

    media: tuple[MediaDescription, ...]
    control: str | None = None  # session-level a=control: the aggregate URL
    session_name: str | None = None  # s=
    origin: str | None = None  # o= as written
    bandwidth: dict[str, int] = field(default_factory=dict)
    attributes: tuple[tuple[str, str | None], ...] = ()  # session-level a= lines

    def attribute(self, name: str) -> str | None:
        """The value of the first session-level ``a=<name>`` (a flag gives ""), or None."""
        for key, value in self.attributes:
            if key == name:
                return "" if value is None else value
        return None


# RFC 3551 §6, tables 4 (audio) and 5 (video): payload type -> (encoding, clock rate, channels).
STATIC_PAYLOAD_TYPES: Final[dict[int, tuple[str, int, int | None]]] = {
    0: ("PCMU", 8000, 1),
    3: ("GSM", 8000, 1),
    4: ("G723", 8000, 1),
    5: ("DVI4", 8000, 1),
    6: ("DVI4", 16000, 1),
    7: ("LPC", 8000, 1),
    8: ("PCMA", 8000, 1),
    9: ("G722", 8000, 1),
    10: ("L16", 44100, 2),
    11: ("L16", 44100, 1),
    12: ("QCELP", 8000, 1),
    13: ("CN", 8000, 1),
    14: ("MPA", 90000, None),
    15: ("G728", 8000, 1),
    16: ("DVI4", 11025, 1),
    17: ("DVI4", 22050, 1),
    18: ("G729", 8000, 1),
    25: ("CelB", 90000, None),
    26: ("JPEG", 90000, None),
    28: ("nv", 90000, None),
    31: ("H261", 90000, None),
    32: ("MPV", 90000, None),
    33: ("MP2T", 90000, None),
    34: ("H263", 90000, None),
}

MAX_SDP_LINES: Final = 4096
_LINE: Final = re.compile(r"([a-zA-Z])[ \t]*=(.*)")
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def _small_int(text: str, limit: int) -> int | None:
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        return None
    value = int(text)
    return value if value <= limit else None


@dataclass(slots=True)
class _MediaBuilder:
    media: str
    port: int
    proto: str
    formats: tuple[str, ...]
    rtpmaps: dict[int, RtpMap] = field(default_factory=dict)
    fmtps: dict[int, dict[str, str]] = field(default_factory=dict)
    control: str | None = None
    bandwidth: dict[str, int] = field(default_factory=dict)
    attributes: list[tuple[str, str | None]] = field(default_factory=list)

    def build(self) -> MediaDescription:
        rtpmaps = dict(self.rtpmaps)
        for f in self.formats:
            pt = _small_int(f, 127)
            if pt is not None and pt not in rtpmaps and pt in STATIC_PAYLOAD_TYPES:
                encoding, clock, channels = STATIC_PAYLOAD_TYPES[pt]
                rtpmaps[pt] = RtpMap(pt, encoding, clock, channels)
        return MediaDescription(
            self.media,
            self.port,
            self.proto,
            self.formats,
            rtpmaps,
            self.fmtps,
            self.control,
            self.bandwidth,
            tuple(self.attributes),
        )


def _parse_media_line(value: str) -> _MediaBuilder | None:
    """``m=<media> <port>[/<number of ports>] <proto> <fmt> ...`` (RFC 8866 §5.14)."""
    parts = value.split()
    if len(parts) < 4:
        return None
    port = _small_int(parts[1].partition("/")[0], 65535)
    if port is None:
        return None
    return _MediaBuilder(parts[0].lower(), port, parts[2], tuple(parts[3:]))


def _parse_rtpmap(value: str) -> RtpMap | None:
    """``<pt> <encoding>/<clock rate>[/<channels>]`` (RFC 8866 §6.6)."""
    pt_text, _, rest = value.strip().partition(" ")
    pt = _small_int(pt_text, 127)
    pieces = rest.strip().split("/")
    if pt is None or len(pieces) < 2 or not pieces[0].strip():
        return None
    clock = _small_int(pieces[1], 10_000_000)
    if clock is None:
        return None
    channels = _small_int(pieces[2], 255) if len(pieces) > 2 else None
    return RtpMap(pt, pieces[0].strip(), clock, channels)


def _parse_fmtp(value: str) -> tuple[int, dict[str, str]] | None:
    """``<pt> k=v; k=v`` (RFC 8866 §6.15): keys lower-cased, values raw (whitespace stripped)."""
    pt_text, _, rest = value.strip().partition(" ")
    pt = _small_int(pt_text, 127)
    if pt is None:
        return None
    params: dict[str, str] = {}
    for item in rest.split(";"):
        key, _, val = item.partition("=")
        key = key.strip().lower()
        if key and key not in params:  # first wins
            params[key] = val.strip()
    return pt, params


def parse_sdp(text: str) -> SessionDescription:
    """Parse a session description; :class:`SdpError` when it has no usable ``m=`` section.

    A usable section has a valid ``m=`` line with at least one format. Malformed lines and
    attributes are skipped, never fatal; a malformed ``m=`` line drops its whole section.
    """
    session_control: str | None = None
    session_name: str | None = None
    origin: str | None = None
    session_bandwidth: dict[str, int] = {}
    session_attributes: list[tuple[str, str | None]] = []
    sections: list[_MediaBuilder] = []
    current: _MediaBuilder | None = None
    in_media = False  # after any m= line, valid or not
    for count, raw in enumerate(text.splitlines()):
        if count >= MAX_SDP_LINES:
            break
        m = _LINE.fullmatch(raw.strip())
        if m is None:
            continue
        kind, value = m.group(1).lower(), m.group(2).strip()
        if kind == "m":
            in_media = True
            current = _parse_media_line(value)
            if current is not None:
                sections.append(current)
            continue
        if in_media and current is None:
            continue  # attributes of a dropped section
        if kind == "b":
            btype, _, bvalue = value.partition(":")
            kbps = _small_int(bvalue, 100_000_000)
            target = current.bandwidth if current is not None else session_bandwidth
            if btype.strip() and kbps is not None and btype.strip() not in target:
                target[btype.strip()] = kbps
        elif kind == "s" and current is None and session_name is None:
            session_name = value
        elif kind == "o" and current is None and origin is None:
            origin = value
        elif kind == "a":
            name, colon, avalue = value.partition(":")
            name = name.strip()
            if not name:
                continue
            attr_value = avalue.strip() if colon else None
            if current is None:
                session_attributes.append((name, attr_value))
                if name.lower() == "control" and session_control is None and attr_value:
                    session_control = attr_value
                continue
            current.attributes.append((name, attr_value))
            lname = name.lower()
            if lname == "control" and current.control is None and attr_value:
                current.control = attr_value
            elif lname == "rtpmap" and attr_value is not None:
                rtpmap = _parse_rtpmap(attr_value)
                if rtpmap is not None and rtpmap.payload_type not in current.rtpmaps:
                    current.rtpmaps[rtpmap.payload_type] = rtpmap
            elif lname == "fmtp" and attr_value is not None:
                fmtp = _parse_fmtp(attr_value)
                if fmtp is not None and fmtp[0] not in current.fmtps:
                    current.fmtps[fmtp[0]] = fmtp[1]
    if not sections:
        raise SdpError("no usable media section (m=) in the session description")
    return SessionDescription(
        tuple(s.build() for s in sections),
        session_control,
        session_name,
        origin,
        session_bandwidth,
        tuple(session_attributes),
    )


def is_absolute_url(url: str) -> bool:
    """True for ``scheme://...`` URLs (RFC 3986 §4.3)."""
    return _SCHEME.match(url) is not None


def resolve_control(base_url: str, control: str | None) -> str:
    """The URL of a control attribute (RFC 2326 §C.1.1).

    An absolute control URL wins; ``*``, empty or missing means the base itself; a relative one
    is appended to the base with one ``/`` between, whether or not the base ends in ``/`` and even
    when it has a query (``rtsp://h/stream`` + ``trackID=1`` -> ``rtsp://h/stream/trackID=1``), as
    FFmpeg and live555 do and cameras expect: strict RFC 3986 resolution would drop the base's
    last path segment. ``base_url`` is the Content-Base, else Content-Location, else the DESCRIBE
    request URL (the caller picks it).
    """
    if control is None:
        return base_url
    control = control.strip()
    if not control or control == "*":
        return base_url
    if is_absolute_url(control):
        return control
    if base_url.endswith("/") and control.startswith("/"):
        return base_url + control[1:]
    if base_url.endswith("/") or control.startswith("/"):
        return base_url + control
    return f"{base_url}/{control}"


def url_path(url: str) -> str:
    """The path and query of ``url`` (for lenient URL matching), "" when it cannot be split."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    return urlunsplit(("", "", parts.path, parts.query, ""))


__all__ = [
    "STATIC_PAYLOAD_TYPES",
    "MediaDescription",
    "RtpMap",
    "SdpError",
    "SessionDescription",
    "is_absolute_url",
    "parse_sdp",
    "resolve_control",
    "url_path",
]
