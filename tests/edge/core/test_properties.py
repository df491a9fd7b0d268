"""Property tests (style §4): every parser takes any bytes without raising, round trips hold,
and the Python and numpy paths of the TR 101 290 analyser count the same."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core import analysis as analysis_mod
from services.edge.core.analysis import FlowAnalysis
from services.edge.core.media import analyser as media_mod
from services.edge.core.media import audio, h264, hevc, mpeg2video
from services.edge.core.media.analyser import MediaAnalyser
from services.edge.core.ts import packet
from services.edge.core.ts.psi import (
    SectionAssembler,
    crc32_mpeg2,
    parse_pat,
    parse_pmt,
    section_crc_ok,
)
from services.edge.core.ts.tr101290 import Tr101290Analyzer

from .tsbuild import Mux, draw_packets, lang_descriptor, pat_section, pmt_section, psi_packet, ts_packet

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

any_bytes = st.binary(max_size=600)


@FAST
@given(any_bytes)
def test_psi_parsers_never_raise(data: bytes) -> None:
    parse_pat(data)
    parse_pmt(data)
    section_crc_ok(data)
    # The same bytes with a right CRC reach the table parsers' bodies.
    if len(data) >= 8:
        fixed = data[:-4] + crc32_mpeg2(data[:-4]).to_bytes(4, "big")
        assert section_crc_ok(fixed)
        parse_pat(bytes([0]) + fixed[1:])
        parse_pmt(bytes([2]) + fixed[1:])


@FAST
@given(st.lists(st.tuples(st.binary(max_size=184), st.booleans()), max_size=30))
def test_section_assembler_never_raises_and_sections_are_bounded(chunks: list[tuple[bytes, bool]]) -> None:
    asm = SectionAssembler()
    for payload, pusi in chunks:
        for section in asm.feed(payload, pusi):
            assert 3 <= len(section) <= 4096
            assert len(section) == 3 + (((section[1] & 0x0F) << 8) | section[2])
        if pusi and len(chunks) % 3 == 0:
            asm.reset()
    assert asm.malformed >= 0


@FAST
@given(st.binary(min_size=188, max_size=188))
def test_packet_field_readers_never_raise(data: bytes) -> None:
    packet.packet_pid(data, 0)
    packet.packet_pcr(data, 0)
    packet.discontinuity_indicator(data, 0)
    start = packet.payload_offset(data, 0)
    if start is not None:
        assert 4 <= start < 188
        packet.pes_pts(data, start, 188)
        packet.pes_payload_start(data, start, 188)


@FAST
@given(any_bytes)
def test_es_header_parsers_never_raise(data: bytes) -> None:
    for nal_head in (b"\x67", b"\x27"):
        h264.parse_sps(nal_head + data)
    hevc.parse_sps(b"\x42\x01" + data)
    for fn in (h264.find_sps, hevc.find_sps, mpeg2video.find_sequence):
        fn(data)
        fn(b"\x00\x00\x01\xb3" + data)
        fn(b"\x00\x00\x01\x67" + data)
        fn(b"\x00\x00\x01\x42\x01" + data)
    for afn in (audio.find_adts, audio.find_latm, audio.find_mpeg_audio, audio.find_ac3):
        found = afn(data)
        if found is not None:
            assert found.sample_rate_hz > 0 and found.channels > 0
        afn(b"\xff\xf1" + data)
        afn(b"\x56\xe0" + data)
        afn(b"\x0b\x77" + data)
    media_mod.pes_payload_start(data)


@FAST
@given(st.lists(st.tuples(st.integers(0, 0x1FFF), st.booleans(), st.binary(max_size=184)), max_size=40))
def test_media_analyser_takes_any_payload(items: list[tuple[int, bool, bytes]]) -> None:
    ma = MediaAnalyser()
    mux = Mux()
    tr = Tr101290Analyzer(sink=ma)
    ma.attach(tr)
    tr.feed_packets(mux.pat() + mux.pmt(), 2, 0.0, 0)  # learn PIDs 0x101 (H.264) and 0x102 (AAC)
    for pid, pusi, data in items:
        ma.on_pes(0x101 if pid & 1 else 0x102, pusi, data, None, 0.0)
    ma.snapshot(0.0, tr.pid_packet_counts(), 0.0)


@st.composite
def damaged_streams(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    pkts = draw_packets(draw)
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=20))
    return pkts, sizes


def _datagrams(pkts: list[bytes], sizes: list[int]) -> list[bytes]:
    out = []
    i = 0
    k = 0
    while i < len(pkts):
        n = sizes[k % len(sizes)]
        out.append(b"".join(pkts[i : i + n]))
        i += n
        k += 1
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_streams(), st.integers(1, 16))
def test_python_and_numpy_paths_count_the_same(stream: tuple[list[bytes], list[int]], batch: int) -> None:
    _compare_paths(*stream, batch)


def _compare_paths(pkts: list[bytes], sizes: list[int], batch: int) -> None:
    grams = _datagrams(pkts, sizes)
    times = [i * 0.001 for i in range(len(grams))]
    py = FlowAnalysis(media_analysis=True)
    for d, t in zip(grams, times, strict=True):
        py.on_datagram(memoryview(d), t, None)
    saved = analysis_mod.NUMPY_MIN_PACKETS
    analysis_mod.NUMPY_MIN_PACKETS = 0
    try:
        nb = FlowAnalysis(media_analysis=True)
        for i in range(0, len(grams), batch):
            nb.on_batch([memoryview(d) for d in grams[i : i + batch]], times[i : i + batch], [None] * batch)
    finally:
        analysis_mod.NUMPY_MIN_PACKETS = saved
    assert py.internal_errors == 0 and nb.internal_errors == 0, (py.last_internal_error, nb.last_internal_error)
    now = times[-1]
    a, b = py.snapshot(now), nb.snapshot(now)
    assert a["tr101290"] == b["tr101290"]
    media_a, media_b = a["media"], b["media"]
    assert isinstance(media_a, dict) and isinstance(media_b, dict)
    assert media_a["program_count"] == media_b["program_count"]
    tr = a["tr101290"]
    assert isinstance(tr, dict)
    assert tr["ts_packets_analyzed"] == len(pkts)
    assert tr["sync_byte_errors"] == sum(1 for p in pkts if p[0] != 0x47)


@FAST
@given(st.lists(st.binary(min_size=0, max_size=1400), min_size=1, max_size=20))
def test_flow_analysis_never_raises_on_random_datagrams(datagrams: list[bytes]) -> None:
    for threshold in (0, 1 << 30):
        saved = analysis_mod.NUMPY_MIN_PACKETS
        analysis_mod.NUMPY_MIN_PACKETS = threshold
        try:
            fa = FlowAnalysis(media_analysis=True)
            fa.on_batch(
                [memoryview(d) for d in datagrams], [0.001 * i for i in range(len(datagrams))], [7] * len(datagrams)
            )
            for i, d in enumerate(datagrams):
                fa.on_datagram(memoryview(d), 1.0 + i, None)
            snap = fa.snapshot(10.0)
        finally:
            analysis_mod.NUMPY_MIN_PACKETS = saved
        assert fa.internal_errors == 0, fa.last_internal_error
        tr = snap["tr101290"]
        assert isinstance(tr, dict)
        assert tr["ts_packets_analyzed"] == 2 * sum(len(d) // 188 for d in datagrams)
        assert tr["truncated_packets"] == 2 * sum(1 for d in datagrams if len(d) % 188)


@FAST
@given(
    st.dictionaries(st.integers(1, 0xFFFF), st.integers(0x10, 0x1FFE), min_size=1, max_size=40),
    st.integers(0, 31),
)
def test_pat_round_trip(programs: dict[int, int], version: int) -> None:
    sec = pat_section(programs, version=version)
    assert section_crc_ok(sec)
    assert dict(parse_pat(sec) or []) == programs


@FAST
@given(
    st.integers(0x10, 0x1FFE),
    st.lists(
        st.tuples(st.integers(0, 255), st.integers(0x10, 0x1FFE), st.sampled_from([None, "eng", "fra", "deu"])),
        max_size=20,
    ),
)
def test_pmt_round_trip(pcr_pid: int, streams: list[tuple[int, int, str | None]]) -> None:
    sec = pmt_section(1, pcr_pid, [(t, p, lang_descriptor(lang) if lang else b"") for t, p, lang in streams])
    pmt = parse_pmt(sec)
    assert pmt is not None and pmt.pcr_pid == pcr_pid
    assert [(e.stream_type, e.pid, e.language) for e in pmt.streams] == streams


@FAST
@given(st.integers(0, packet.PCR_WRAP - 1))
def test_pcr_round_trip(pcr: int) -> None:
    assert packet.packet_pcr(ts_packet(0x100, pcr=pcr), 0) == pcr


@FAST
@given(st.integers(0, (1 << 33) - 1))
def test_pts_round_trip(pts: int) -> None:
    from .tsbuild import pes_packet

    pkt = pes_packet(0x100, 0, pts=pts)
    start = packet.payload_offset(pkt, 0)
    assert start is not None
    assert packet.pes_pts(pkt, start, 188) == pts


@FAST
@given(st.binary(max_size=300))
def test_a_section_split_across_packets_reassembles(body: bytes) -> None:
    sec = pat_section({1: 0x100})[:8] + body
    length = len(sec) + 4 - 3
    sec = sec[:1] + bytes([0xB0 | (length >> 8), length & 0xFF]) + sec[3:]
    sec += crc32_mpeg2(sec).to_bytes(4, "big")
    pkts = [psi_packet(0, sec[:183], 0)] if len(sec) <= 183 else []
    if not pkts:
        stream = b"\x00" + sec
        first = stream[:184]
        pkts = [ts_packet(0, 0, first, pusi=True)]
        rest = stream[184:]
        cc = 1
        while rest:
            pkts.append(ts_packet(0, cc, rest[:184] + b"\xff" * max(0, 184 - len(rest[:184]))))
            rest = rest[184:]
            cc += 1
    asm = SectionAssembler()
    out = []
    for p in pkts:
        start = packet.payload_offset(p, 0)
        assert start is not None
        out += asm.feed(p[start:], bool(p[1] & 0x40))
    assert out == [sec]
    assert asm.malformed == 0


def test_a_property_test_can_fail() -> None:
    """Guard: the equivalence property notices a path that miscounts (style §4: break it once)."""
    original = Tr101290Analyzer.feed_array

    def broken(self: Tr101290Analyzer, packets, arrivals, index):  # type: ignore[no-untyped-def]
        original(self, packets, arrivals, index)
        self.cc_errors += 1

    Tr101290Analyzer.feed_array = broken  # type: ignore[method-assign]
    try:
        mux = Mux()
        pkts = [mux.pat(), mux.pmt()] + [mux.video() for _ in range(20)]
        with pytest.raises(AssertionError):
            _compare_paths(pkts, [7], 4)
    finally:
        Tr101290Analyzer.feed_array = original  # type: ignore[method-assign]


def test_a_pmt_whose_es_info_runs_past_the_section_is_refused() -> None:
    """ES_info_length past the section's end, under a valid CRC (found by the HLS segmenter's
    fuzz test: the descriptor walk read past the buffer and raised IndexError)."""
    from services.edge.core.mux.ts_mux import _long_section

    body = bytes((0xE1, 0x00, 0xF0, 0x00))  # PCR PID 0x100, program_info_length 0
    body += bytes((0x1B, 0xE1, 0x00, 0xF0, 200))  # H.264 on 0x100, ES_info_length 200 (5 follow)
    body += bytes((0x0A, 3)) + b"eng"  # one ISO 639 descriptor, then the section ends
    section = _long_section(0x02, 1, body)
    assert section_crc_ok(section)
    assert parse_pmt(section) is None
