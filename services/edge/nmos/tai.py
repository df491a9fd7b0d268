"""TAI timestamps for NMOS (IS-04 "Versions"; IS-05 activation times): ``<seconds>:<nanoseconds>``.

interop.md 5 fixes TAI = UTC + 37 s (the leap seconds since 1972 as of 2017; none since).
Sans-IO: the caller passes the UTC time in nanoseconds (``time.time_ns()``).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["TAI_OFFSET_S", "format_tai", "parse_tai", "tai_ns"]

TAI_OFFSET_S: Final = 37
_NS: Final = 1_000_000_000
_TAI_RE: Final = re.compile(r"^([0-9]+):([0-9]+)$")  # IS-05 activation-schema.json pattern


def tai_ns(utc_ns: int) -> int:
    """UTC nanoseconds since the epoch → TAI nanoseconds since the epoch."""
    return utc_ns + TAI_OFFSET_S * _NS


def format_tai(tai_nanoseconds: int) -> str:
    """``"<seconds>:<nanoseconds>"`` (nanoseconds below 10^9, no padding), as NMOS writes it."""
    seconds, nanos = divmod(tai_nanoseconds, _NS)
    return f"{seconds}:{nanos}"


def parse_tai(text: str) -> int:
    """TAI nanoseconds of ``"<seconds>:<nanoseconds>"``; ``ValueError`` when malformed or the
    nanoseconds are not below 10^9."""
    match = _TAI_RE.match(text)
    if match is None:
        raise ValueError("not a TAI timestamp <seconds>:<nanoseconds>")
    seconds, nanos = int(match.group(1)), int(match.group(2))
    if nanos >= _NS:
        raise ValueError("nanoseconds must be below 1000000000")
    return seconds * _NS + nanos
