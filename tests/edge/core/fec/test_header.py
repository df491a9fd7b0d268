"""SMPTE 2022-1 FEC header codec: field layout, round trip, garbage."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from services.edge.core.fec.header import FEC_MIN_DATAGRAM, build_fec_header, parse_fec

# A column packet laid out as ffmpeg prompeg_write_fec writes one for L=5, D=10 (hand-built):
# RTP 80 60 0001 00000bb8 00000000 | SNBase 0064, len 0540, E|PT a1, mask 000000, TS 00000bb8,
# N/D/type/index 00, offset 05, NA 0a, ext 00.
FFMPEG_COLUMN = bytes.fromhex("8060000100000bb80000000000640540a100000000000bb800050a00") + b"\xaa" * 4


def test_parses_the_ffmpeg_column_layout() -> None:
    fec = parse_fec(FFMPEG_COLUMN)
    assert fec is not None
    assert (fec.payload_type, fec.sequence, fec.timestamp, fec.ssrc) == (96, 1, 3000, 0)
    assert (fec.snbase, fec.length_recovery, fec.extension_flag, fec.pt_recovery) == (100, 0x540, True, 33)
    assert (fec.mask, fec.ts_recovery, fec.is_row, fec.fec_type, fec.index) == (0, 3000, False, 0, 0)
    assert (fec.offset, fec.na, fec.snbase_ext) == (5, 10, 0)
    assert bytes(fec.payload) == b"\xaa" * 4


def test_build_then_parse_round_trips_a_row_packet() -> None:
    buf = bytearray(FEC_MIN_DATAGRAM + 3)
    build_fec_header(
        buf,
        rtp_bits=0x15,
        marker=True,
        payload_type=96,
        sequence=0xFFFF,
        timestamp=0xDEADBEEF,
        ssrc=0,
        snbase=65535,
        length_recovery=1316,
        pt_recovery=33,
        ts_recovery=7,
        is_row=True,
        offset=1,
        na=20,
    )
    fec = parse_fec(buf)
    assert fec is not None
    assert fec.rtp_byte0 == 0x80 | 0x15 and fec.marker and fec.is_row
    assert (fec.sequence, fec.timestamp, fec.snbase, fec.length_recovery) == (0xFFFF, 0xDEADBEEF, 65535, 1316)
    assert (fec.offset, fec.na, fec.pt_recovery, fec.ts_recovery, fec.extension_flag) == (1, 20, 33, 7, True)
    assert buf[24] == 0x40  # N=0, D=1, type 0, index 0


def test_short_or_wrong_version_is_none() -> None:
    assert parse_fec(FFMPEG_COLUMN[:27]) is None
    assert parse_fec(b"\x40" + FFMPEG_COLUMN[1:]) is None


@given(st.binary(max_size=64))
def test_any_bytes_never_raise(data: bytes) -> None:
    fec = parse_fec(data)
    assert fec is None or len(data) >= FEC_MIN_DATAGRAM


def test_fec_cores_do_no_io() -> None:
    forbidden = {"trio", "socket", "time", "random", "asyncio", "threading", "logging"}
    files = [*sorted(Path("services/edge/core/fec").glob("*.py")), Path("services/edge/core/merge2022_7.py")]
    assert len(files) >= 5
    for path in files:
        tree = ast.parse(path.read_text())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & forbidden, path
