"""RTP header parsing and building (RFC 3550 §5.1) with canned bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.edge.core.rtp import build_rtp_header, parse_rtp, seq_delta


def test_parses_the_fixed_header() -> None:
    datagram = struct.pack("!BBHII", 0x80, 0x80 | 33, 65535, 123456, 0xCAFEBABE) + b"\x47" * 188
    header = parse_rtp(datagram)
    assert header is not None
    assert (header.marker, header.payload_type, header.sequence, header.timestamp, header.ssrc) == (
        True,
        33,
        65535,
        123456,
        0xCAFEBABE,
    )
    assert (header.payload_offset, header.payload_end) == (12, 200)


def test_csrc_extension_and_padding() -> None:
    csrcs = struct.pack("!II", 1, 2)
    extension = struct.pack("!HH", 0xBEDE, 1) + b"\x00" * 4
    payload = b"\x47" * 188
    padding = b"\x00\x00\x03"
    datagram = struct.pack("!BBHII", 0x80 | 0x20 | 0x10 | 2, 33, 1, 2, 3) + csrcs + extension + payload + padding
    header = parse_rtp(datagram)
    assert header is not None
    assert datagram[header.payload_offset : header.payload_end] == payload


@pytest.mark.parametrize(
    "datagram",
    [
        b"",
        b"\x80" * 11,  # shorter than the fixed header
        struct.pack("!BBHII", 0x40, 33, 1, 2, 3) + b"x",  # version 1
        struct.pack("!BBHII", 0x8F, 33, 1, 2, 3) + b"x" * 8,  # 15 CSRCs announced, 2 present
        struct.pack("!BBHII", 0x90, 33, 1, 2, 3) + b"\xbe\xde",  # extension header cut short
        struct.pack("!BBHII", 0xA0, 33, 1, 2, 3) + b"ab\x00",  # padding count 0
        struct.pack("!BBHII", 0xA0, 33, 1, 2, 3) + b"ab\x09",  # more padding than payload
    ],
)
def test_invalid_datagrams_are_none(datagram: bytes) -> None:
    assert parse_rtp(datagram) is None


@given(st.binary(max_size=64))
def test_any_bytes_never_raise(data: bytes) -> None:
    header = parse_rtp(data)
    if header is not None:
        assert 12 <= header.payload_offset <= header.payload_end <= len(data)


@given(
    st.integers(0, 127), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF), st.booleans()
)
def test_build_then_parse_round_trips(pt: int, seq: int, ts: int, ssrc: int, marker: bool) -> None:
    buffer = bytearray(12 + 188)
    build_rtp_header(buffer, payload_type=pt, sequence=seq, timestamp=ts, ssrc=ssrc, marker=marker)
    header = parse_rtp(buffer)
    assert header is not None
    assert (header.payload_type, header.sequence, header.timestamp, header.ssrc, header.marker) == (
        pt,
        seq,
        ts,
        ssrc,
        marker,
    )


@pytest.mark.parametrize(
    ("new", "old", "delta"), [(1, 0, 1), (0, 65535, 1), (65535, 0, -1), (100, 200, -100), (32767, 0, 32767)]
)
def test_seq_delta_wraps(new: int, old: int, delta: int) -> None:
    assert seq_delta(new, old) == delta
