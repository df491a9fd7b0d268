"""TsMuxer on canned bytes: PSI, PES headers, timestamps, PCR, continuity, stuffing, CBR."""

from __future__ import annotations

import itertools

import pytest

from services.edge.core.mux.ts_mux import (
    NULL_PACKET,
    DatagramPacker,
    MuxConfig,
    TsMuxer,
    chunk_datagrams,
    encode_pcr,
    encode_timestamp,
    pat_section,
    pes_header,
    pmt_section,
)
from services.edge.core.ts.packet import packet_pcr, pes_pts
from services.edge.core.ts.psi import crc32_mpeg2, parse_pat, parse_pmt, section_crc_ok

from .helpers import adts, h264_au, has_payload, pcr_of, pid_of, split

# ffmpeg 5.1's PAT and PMT for one H.264 + AAC program with its default PIDs (the same layout
# as our defaults), CRC_32 included: the muxer must write the same bytes.
FFMPEG_PAT = bytes.fromhex("00b00d0001c100000001f0002ab104b2")
FFMPEG_PMT = bytes.fromhex("02b0170001c10000e100f0001be100f0000fe101f0002f44b99b")


def test_pat_pmt_bytes_and_crc_match_ffmpeg() -> None:
    assert pat_section(1, 1, 0x1000) == FFMPEG_PAT
    assert pmt_section(1, 0x100, [(0x1B, 0x100), (0x0F, 0x101)]) == FFMPEG_PMT
    assert crc32_mpeg2(FFMPEG_PAT[:-4]) == 0x2AB104B2
    mux = TsMuxer()
    assert (mux.pat, mux.pmt) == (FFMPEG_PAT, FFMPEG_PMT)
    pmt = parse_pmt(pmt_section(7, 0x200, [(0x24, 0x200)], version=3))
    assert pmt is not None and (pmt.program_number, pmt.version, pmt.pcr_pid) == (7, 3, 0x200)
    assert pmt.streams[0].stream_type == 0x24


def test_tables_come_first_in_their_own_packets() -> None:
    pkts = split(TsMuxer().mux_video(h264_au(100, idr=True), 9000, 9000))
    pat, pmt = pkts[0], pkts[1]
    assert pat[:5] == bytes((0x47, 0x40, 0x00, 0x10, 0x00))
    assert pat[5 : 5 + len(FFMPEG_PAT)] == FFMPEG_PAT and set(pat[5 + len(FFMPEG_PAT) :]) == {0xFF}
    assert pmt[:5] == bytes((0x47, 0x50, 0x00, 0x10, 0x00))
    assert parse_pat(pat[5 : 5 + len(FFMPEG_PAT)]) == [(1, 0x1000)]
    assert section_crc_ok(pmt[5 : 5 + len(FFMPEG_PMT)])


def test_timestamp_fields() -> None:
    # §2.4.3.7: '0010' PTS[32..30] 1, PTS[29..15] 1, PTS[14..0] 1
    assert encode_timestamp(0b0010, 0) == bytes.fromhex("2100010001")
    assert encode_timestamp(0b0010, 0x1_FFFF_FFFF) == bytes.fromhex("2fffffffff")
    assert encode_timestamp(0b0011, 126000) == bytes.fromhex("310007d861")
    assert encode_timestamp(0b0001, 1 << 33) == encode_timestamp(0b0001, 0)  # wraps at 2^33
    assert encode_pcr(0) == bytes.fromhex("000000007e00")
    assert encode_pcr(300 * 90000 + 299) == bytes.fromhex("0000afc8" + "7f2b")


def test_pes_header_bytes() -> None:
    h = pes_header(0xE0, 1000, 126000, 122400, bounded=True)
    assert h == bytes.fromhex("000001e003f584c00a" + "310007d861" + "110007bc41")
    assert pes_pts(h + b"\x00" * 8, 0, len(h) + 8) == 126000
    a = pes_header(0xC0, 200, 90000, None, bounded=True)
    assert a == bytes.fromhex("000001c000d0" + "848005" + "210005bf21")
    assert pes_header(0xE0, 70000, 0, None, bounded=True)[4:6] == b"\x00\x00"  # video may say 0
    assert pes_header(0xE0, 10, 0, None, bounded=False)[4:6] == b"\x00\x00"
    with pytest.raises(ValueError):
        pes_header(0xC0, 70000, 0, None, bounded=True)


def test_dts_only_when_it_differs() -> None:
    mux = TsMuxer()
    pkts = split(mux.mux_video(h264_au(50, idr=True), 3600, 3600))
    first = pkts[2]
    es = first[4 + 1 + first[4] :]  # after the adaptation field
    assert es[:4] == b"\x00\x00\x01\xe0" and es[7] == 0x80 and es[8] == 5
    pkts = split(mux.mux_video(h264_au(50, idr=False), 10800, 7200))
    es = pkts[0][4 + 1 + pkts[0][4] :] if pkts[0][3] & 0x20 else pkts[0][4:]
    assert es[7] == 0xC0 and es[8] == 10


def test_keyframe_packet_has_rai_and_pcr_and_pcr_stays_below_dts() -> None:
    cfg = MuxConfig(pcr_offset=9000)
    pkts = split(TsMuxer(cfg).mux_video(h264_au(500, idr=True), 99000, 90000))
    video = [p for p in pkts if pid_of(p) == 0x100]
    first = video[0]
    assert first[1] & 0x40 and first[3] & 0x20
    assert first[5] & 0x40  # random_access_indicator
    assert pcr_of(first) == packet_pcr(first, 0) == (90000 - 9000) * 300


def test_stuffing_in_the_last_packet_and_cc_continuity() -> None:
    mux = TsMuxer()
    out = bytearray()
    for i in range(40):
        out += mux.mux_video(h264_au(37 * i + 1, idr=i % 10 == 0, seed=i), 3000 * i + 6000, 3000 * i)
        out += mux.mux_audio(adts(150 + i), 3000 * i + 6000)
    last_cc: dict[int, int] = {}
    for p in split(out):
        assert p[0] == 0x47
        if p[3] & 0x20:
            assert p[4] <= 183 and (p[4] == 183) == (not has_payload(p))
        pid = pid_of(p)
        if has_payload(p):
            if pid in last_cc:
                assert p[3] & 0x0F == (last_cc[pid] + 1) & 0x0F, hex(pid)
            last_cc[pid] = p[3] & 0x0F
    assert set(last_cc) == {0, 0x1000, 0x100, 0x101}
    assert mux.stats.null_packets == 0


def test_stuffing_of_one_byte_uses_an_empty_adaptation_field() -> None:
    # PES header (9 + 5) + 169 bytes = 183 bytes: one packet, adaptation_field_length 0.
    pkts = split(TsMuxer().mux_audio(b"\xff" * 169, 0))
    audio = [p for p in pkts if pid_of(p) == 0x101]
    assert len(audio) == 1 and audio[0][3] & 0x30 == 0x30 and audio[0][4] == 0 and audio[0][5:9] == b"\x00\x00\x01\xc0"


def test_pcr_spacing_at_most_40_ms_and_monotonic() -> None:
    mux = TsMuxer()
    out = bytearray()
    # 25 fps video and 48 kHz AAC (1920 ticks per frame), interleaved in DTS order.
    events = [(3600 * i, "v", i) for i in range(100)] + [(1920 * k, "a", k) for k in range(180)]
    base = 10 * 90000  # a PCR 700 ms before DTS 0 would wrap: start later
    for t, kind, i in sorted(events):
        t += base
        if kind == "v":
            out += mux.mux_video(h264_au(3000, idr=i % 25 == 0, seed=i), t + 3600, t)
        else:
            out += mux.mux_audio(adts(300), t)
    pcrs = [pcr_of(p) for p in split(out) if pid_of(p) == 0x100]
    values = [v for v in pcrs if v is not None]
    assert len(values) > 90
    gaps = [b - a for a, b in itertools.pairwise(values)]
    assert min(gaps) >= 0
    assert max(gaps) <= 40 * 27_000
    # PCR <= DTS of the unit it travels with (§2.4.3.5, PCR = DTS - pcr_offset).
    for p in split(out):
        pcr = pcr_of(p)
        if pcr is not None and p[1] & 0x40 and pid_of(p) == 0x100:
            es = p[5 + p[4] :]
            dts_field = es[14:19] if es[7] & 0xC0 == 0xC0 else es[9:14]
            dts = ((dts_field[0] >> 1) & 7) << 30 | dts_field[1] << 22 | (dts_field[2] >> 1) << 15
            dts |= dts_field[3] << 7 | dts_field[4] >> 1
            assert pcr // 300 <= dts


def test_psi_repeats_at_least_every_100_ms_of_dts_and_before_keyframes() -> None:
    mux = TsMuxer(MuxConfig(audio_codec=None))
    positions: list[tuple[int, int]] = []  # (dts, PAT count so far)
    pats = 0
    for i in range(50):
        pkts = split(mux.mux_video(h264_au(100, idr=i in (0, 7, 30), seed=i), 3600 * i, 3600 * i))
        if any(pid_of(p) == 0 for p in pkts):
            pats += 1
            positions.append((3600 * i, pats))
    times = [t for t, _ in positions]
    assert 3600 * 7 in times and 3600 * 30 in times
    assert max(b - a for a, b in itertools.pairwise(times)) <= 9000 + 3600


def test_pts_wraps_at_2_33() -> None:
    mux = TsMuxer(MuxConfig(audio_codec=None))
    near = (1 << 33) - 1800
    a = split(mux.mux_video(h264_au(10, idr=True), near, near))
    b = split(mux.mux_video(h264_au(10, idr=False), near + 3600, near + 3600))
    pa = next(p for p in a if pid_of(p) == 0x100)
    pb = b[0]
    off_a = 5 + pa[4]
    off_b = 5 + pb[4] if pb[3] & 0x20 else 4
    assert pes_pts(pa, off_a, 188) == near
    assert pes_pts(pb, off_b, 188) == 1800
    assert mux.stats.clock_jumps == 0
    # The PCR wrapped with the DTS: base 1800 - 63000 + 2^33 ... then onwards.
    pcrs = [v for v in (pcr_of(p) for p in a + b) if v is not None]
    assert pcrs[0] == (near - 63000) * 300


def test_a_clock_jump_flags_a_discontinuity() -> None:
    mux = TsMuxer(MuxConfig(audio_codec=None))
    mux.mux_video(h264_au(10, idr=True), 0, 0)
    pkts = split(mux.mux_video(h264_au(10, idr=True), 900000, 900000))
    first = next(p for p in pkts if pid_of(p) == 0x100)
    assert first[5] & 0x80 and first[5] & 0x10
    assert mux.stats.clock_jumps == 1


def test_cbr_pads_with_null_packets_to_the_mux_rate() -> None:
    rate = 2_000_000
    mux = TsMuxer(MuxConfig(mux_rate=rate))
    out = bytearray()
    for i in range(50):  # 2 s of 25 fps
        out += mux.mux_video(h264_au(2000, idr=i % 25 == 0, seed=i), 3600 * i + 93600, 3600 * i + 90000)
    pkts = split(out)
    nulls = [p for p in pkts if pid_of(p) == 0x1FFF]
    assert nulls and all(p == NULL_PACKET for p in nulls)
    assert mux.stats.late_units == 0
    # 49 frame intervals at 2 Mbit/s, within one unit's worth of packets.
    expected = 49 * 0.04 * rate / (188 * 8)
    assert abs(len(pkts) - expected) < 20
    # PCRs follow packet positions exactly: (pcr_b - pcr_a) == packets between x 188 x 8 / rate.
    with_pcr = [(i, pcr_of(p)) for i, p in enumerate(pkts) if pcr_of(p) is not None]
    (i0, p0), (i1, p1) = with_pcr[1], with_pcr[-1]
    assert p0 is not None and p1 is not None
    assert abs((p1 - p0) - (i1 - i0) * 188 * 8 * 27_000_000 // rate) <= 1
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(with_pcr) if a[1] and b[1]]
    assert max(gaps) <= 40 * 27_000


def test_cbr_too_low_a_rate_is_counted() -> None:
    mux = TsMuxer(MuxConfig(mux_rate=100_000, audio_codec=None))
    for i in range(10):
        mux.mux_video(h264_au(5000, idr=i == 0, seed=i), 3600 * i, 3600 * i)
    assert mux.stats.late_units > 0


def test_audio_only_program_puts_the_pcr_on_audio() -> None:
    mux = TsMuxer(MuxConfig(video_codec=None))
    pkts = split(mux.mux_audio(adts(100), 90000))
    assert parse_pmt(mux.pmt) is not None and parse_pmt(mux.pmt).pcr_pid == 0x101  # type: ignore[union-attr]
    assert pcr_of(next(p for p in pkts if pid_of(p) == 0x101)) == (90000 - 63000) * 300


def test_bad_configs_raise() -> None:
    with pytest.raises(ValueError):
        MuxConfig(video_codec=None, audio_codec=None)
    with pytest.raises(ValueError):
        MuxConfig(video_pid=0x101)
    with pytest.raises(ValueError):
        MuxConfig(pmt_pid=0x1FFF)
    with pytest.raises(ValueError):
        TsMuxer(MuxConfig(video_codec=None)).mux_video(b"", 0)


def test_datagram_helpers() -> None:
    packets = bytes(188 * 16)
    assert [len(d) for d in chunk_datagrams(packets)] == [1316, 1316, 376]
    packer = DatagramPacker()
    assert packer.push(packets[: 188 * 5]) == []
    assert [len(d) for d in packer.push(packets[188 * 5 :])] == [1316, 1316]
    assert [len(d) for d in packer.flush()] == [376]
    assert packer.flush() == []
