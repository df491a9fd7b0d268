"""TsDemuxer on canned streams: chunking, resync, continuity errors, PMT changes, ADTS splitting."""

from __future__ import annotations

from services.edge.core.mux.ts_demux import MAX_AUDIO_PES, TsDemuxer
from services.edge.core.mux.ts_mux import MuxConfig, TsMuxer, pat_section, pmt_section
from services.edge.core.mux.units import AccessUnit
from services.edge.core.ts.psi import crc32_mpeg2

from .helpers import adts, h264_au, pid_of, split

BASE = 900_000  # 10 s: keeps the PCR (DTS - 700 ms) from wrapping


def sample_stream(frames: int = 20) -> tuple[bytes, list[tuple[int, int, bytes]], list[tuple[int, bytes]]]:
    """(TS bytes, [(pts, dts, video AU)], [(pts, ADTS frame)]) for 25 fps video + 48 kHz AAC."""
    mux = TsMuxer()
    out = bytearray()
    video: list[tuple[int, int, bytes]] = []
    audio: list[tuple[int, bytes]] = []
    for i in range(frames):
        au = h264_au(700 + 97 * i, idr=i % 10 == 0, seed=i)
        dts = BASE + 3600 * i
        video.append((dts + 7200, dts, au))
        out += mux.mux_video(au, dts + 7200, dts)
        frame = adts(200 + i, seed=i)
        audio.append((BASE + 1920 * i, frame))
        out += mux.mux_audio(frame, BASE + 1920 * i)
    return bytes(out), video, audio


def demux_all(data: bytes, chunk: int = 188) -> tuple[TsDemuxer, list[AccessUnit]]:
    d = TsDemuxer()
    units: list[AccessUnit] = []
    for i in range(0, len(data), chunk):
        units += d.feed(data[i : i + chunk])
    units += d.flush()
    return d, units


def test_round_trip_in_any_chunking() -> None:
    data, video, audio = sample_stream()
    for chunk in (1, 7, 188, 1316, 5000, len(data)):
        d, units = demux_all(data, chunk)
        v = [(u.pts, u.dts, u.data) for u in units if u.kind == "video"]
        a = [(u.pts, u.data) for u in units if u.kind == "audio"]
        assert v == video and a == audio, chunk
        assert [u.keyframe for u in units if u.kind == "video"] == [i % 10 == 0 for i in range(20)]
        assert {(u.pid, u.codec) for u in units} == {(0x100, "h264"), (0x101, "aac")}
        assert d.stats.cc_errors == d.stats.dropped_pes == d.stats.bytes_skipped == 0
        assert d.streams == {0x100: ("video", "h264"), 0x101: ("audio", "aac")}


def test_bounded_video_pes_is_emitted_without_waiting_for_the_next() -> None:
    mux = TsMuxer(MuxConfig(audio_codec=None))
    d = TsDemuxer()
    units = d.feed(mux.mux_video(h264_au(5000, idr=True), BASE, BASE))
    assert len(units) == 1 and units[0].keyframe


def test_several_adts_frames_in_one_pes_become_one_unit_each() -> None:
    mux = TsMuxer(MuxConfig(video_codec=None))
    frames = [adts(100 + i, seed=i) for i in range(4)]
    d = TsDemuxer()
    units = d.feed(mux.mux_audio(b"".join(frames), BASE))
    assert [u.data for u in units] == frames
    # 1024 samples at 48 kHz = 1920 ticks each.
    assert [u.pts for u in units] == [BASE + 1920 * i for i in range(4)]
    assert all(u.keyframe and u.dts == u.pts for u in units)


def test_resync_after_garbage_and_a_lost_sync_byte() -> None:
    data, video, _audio = sample_stream()
    pkts = split(data)
    damaged = b"\x47\x00garbage\x47" + b"".join(pkts[:5]) + b"\x12\x34\x56" + b"".join(pkts[5:])
    d, units = demux_all(damaged, 100)
    assert d.stats.sync_losses >= 1 and d.stats.bytes_skipped >= 3
    assert [u.data for u in units if u.kind == "video"] == [v[2] for v in video]


def test_cc_error_drops_the_broken_pes_only() -> None:
    data, video, _ = sample_stream()
    pkts = split(data)
    # Drop the second packet of the 3rd video PES (a middle packet: no PUSI).
    starts = [i for i, p in enumerate(pkts) if pid_of(p) == 0x100 and p[1] & 0x40]
    victim = starts[2] + 1
    assert pid_of(pkts[victim]) == 0x100 and not pkts[victim][1] & 0x40
    d, units = demux_all(b"".join(pkts[:victim] + pkts[victim + 1 :]))
    got = [u.data for u in units if u.kind == "video"]
    assert got == [v[2] for i, v in enumerate(video) if i != 2]
    assert d.stats.cc_errors == 1 and d.stats.dropped_pes == 1


def test_a_duplicate_packet_is_ignored() -> None:
    data, video, _ = sample_stream(5)
    pkts = split(data)
    i = next(i for i, p in enumerate(pkts) if pid_of(p) == 0x100 and not p[1] & 0x40)
    d, units = demux_all(b"".join([*pkts[: i + 1], pkts[i], *pkts[i + 1 :]]))
    assert [u.data for u in units if u.kind == "video"] == [v[2] for v in video]
    assert d.stats.cc_errors == 0


def test_transport_error_drops_the_pes() -> None:
    data, _video, _ = sample_stream(5)
    pkts = split(data)
    i = next(i for i, p in enumerate(pkts) if pid_of(p) == 0x100 and not p[1] & 0x40)
    bad = bytearray(pkts[i])
    bad[1] |= 0x80
    d, units = demux_all(b"".join([*pkts[:i], bytes(bad), *pkts[i + 1 :]]))
    assert len([u for u in units if u.kind == "video"]) == 4
    assert d.stats.transport_errors == 1


def _psi_packet(pid: int, section: bytes, cc: int) -> bytes:
    body = b"\x00" + section
    return bytes((0x47, 0x40 | (pid >> 8), pid & 0xFF, 0x10 | cc)) + body + b"\xff" * (184 - len(body))


def test_unknown_stream_types_are_ignored_and_pmt_changes_remap() -> None:
    d = TsDemuxer()
    d.feed(_psi_packet(0, pat_section(1, 1, 0x1000), 0))
    # MPEG-2 video (0x02) is not ours; AAC on 0x101 is.
    d.feed(_psi_packet(0x1000, pmt_section(1, 0x100, [(0x02, 0x100), (0x0F, 0x101)]), 0))
    assert d.streams == {0x101: ("audio", "aac")}
    video_mux = TsMuxer(MuxConfig(audio_codec=None))
    ts = video_mux.mux_video(h264_au(100, idr=True), BASE, BASE)
    assert d.feed(ts[188 * 2 :]) == []
    # A new version: H.264 on 0x100, audio gone.
    d.feed(_psi_packet(0x1000, pmt_section(1, 0x100, [(0x1B, 0x100)], version=1), 1))
    assert d.streams == {0x100: ("video", "h264")} and d.stats.pmt_changes == 1
    units = d.feed(video_mux.mux_video(h264_au(100, idr=False), BASE + 3600, BASE + 3600))
    assert [u.codec for u in units] == ["h264"]


def test_a_bad_crc_pmt_is_not_used() -> None:
    d = TsDemuxer()
    d.feed(_psi_packet(0, pat_section(1, 1, 0x1000), 0))
    section = bytearray(pmt_section(1, 0x100, [(0x1B, 0x100)]))
    section[-1] ^= 1
    d.feed(_psi_packet(0x1000, bytes(section), 0))
    d.feed(_psi_packet(0x1000, bytes(section), 1))
    assert d.streams == {}
    d.feed(_psi_packet(0x1000, pmt_section(1, 0x100, [(0x1B, 0x100)]), 2))
    d.feed(_psi_packet(0x1FFF, b"", 0))
    assert d.streams == {0x100: ("video", "h264")}


def test_oversize_pes_is_dropped_and_counted() -> None:
    mux = TsMuxer(MuxConfig(video_codec=None))
    d = TsDemuxer()
    d.feed(mux.tables())
    # An unbounded audio PES (length 0) that keeps growing: continuation packets past the cap.
    head = bytes((0x47, 0x41, 0x01, 0x10)) + bytes.fromhex("000001c0000084800521000100" + "01")
    head += b"\xff" * (188 - len(head))
    d.feed(head)
    for k in range(MAX_AUDIO_PES // 184 + 5):
        d.feed(bytes((0x47, 0x01, 0x01, 0x10 | ((k + 1) & 0x0F))) + b"\x00" * 184)
    assert d.stats.oversize_pes == 1
    assert d.flush() == []


def test_a_pes_header_split_across_packets() -> None:
    # The first packet of the PES carries only 4 bytes of it (a 180-byte adaptation field):
    # PES_packet_length is read from the next packet, and the unit still ends on its length.
    d = TsDemuxer()
    d.feed(TsMuxer(MuxConfig(audio_codec=None)).tables())
    frame = adts(50)
    pes = bytes.fromhex("000001c0") + (3 + 5 + len(frame)).to_bytes(2, "big") + bytes.fromhex("848005210001000" + "1")
    pes += frame
    d.feed(_psi_packet(0x1000, pmt_section(1, 0x101, [(0x0F, 0x101)], version=1), 1))
    first = bytes((0x47, 0x41, 0x01, 0x30, 179, 0x00)) + b"\xff" * 178 + pes[:4]
    rest = pes[4:]
    second = bytes((0x47, 0x01, 0x01, 0x31, 183 - len(rest), 0x00)) + b"\xff" * (182 - len(rest)) + rest
    units = d.feed(first + second)
    assert [u.data for u in units] == [frame]
    assert units[0].pts == 0


def test_program_number_picks_the_program() -> None:
    two = bytes.fromhex("00b0110001c10000" + "0001f000" + "0002f100")
    pat = two + crc32_mpeg2(two).to_bytes(4, "big")
    for wanted, pmt_pid in ((None, 0x1000), (2, 0x1100)):
        d = TsDemuxer(program_number=wanted)
        d.feed(_psi_packet(0, pat, 0))
        d.feed(_psi_packet(0x1000, pmt_section(1, 0x100, [(0x1B, 0x100)]), 0))
        d.feed(_psi_packet(0x1100, pmt_section(2, 0x200, [(0x24, 0x200)]), 0))
        d.flush()
        assert d.program_number == (wanted or 1)
        assert d.streams == ({0x100: ("video", "h264")} if pmt_pid == 0x1000 else {0x200: ("video", "hevc")})
