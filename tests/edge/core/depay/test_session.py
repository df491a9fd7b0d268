"""MediaSession end to end on real encoder output: ffmpeg-made H.264/HEVC + AAC, packetised as a
camera would, through MediaSession, judged by ffprobe/ffmpeg and our TS demuxer."""

from __future__ import annotations

import itertools
import json
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core.depay import MediaSession, TrackSpec
from services.edge.core.mux import TsDemuxer
from services.edge.core.mux.units import AccessUnit
from tests.helpers.tools import need_tool

from .rtpgen import Packet, Source, Stream, encode, h264_payloads

DATAGRAM = 1316


@pytest.fixture(scope="module")
def h264(tmp_path_factory: pytest.TempPathFactory) -> Source:
    return encode(tmp_path_factory.mktemp("depay"), "h264")


@pytest.fixture(scope="module")
def hevc(tmp_path_factory: pytest.TempPathFactory) -> Source:
    return encode(tmp_path_factory.mktemp("depay"), "hevc")


def run(session: MediaSession, packets: list[Packet], *, flush: bool = True) -> list[bytes]:
    out: list[bytes] = []
    for p in packets:
        out += session.on_rtp(p.track, p.data, p.arrival)
    if flush:
        out += session.flush()
    assert all(len(d) == DATAGRAM for d in out)
    return out


def probe(path: Path) -> dict[str, dict[str, object]]:
    result = subprocess.run(
        [need_tool("ffprobe"), "-v", "error", "-count_frames", "-show_streams", "-of", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {s["codec_type"]: s for s in json.loads(result.stdout)["streams"]}


def decode_errors(path: Path) -> str:
    result = subprocess.run(
        [need_tool("ffmpeg"), "-v", "error", "-i", str(path), "-f", "null", "-"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def demux(datagrams: list[bytes]) -> tuple[list[AccessUnit], list[AccessUnit], TsDemuxer]:
    d = TsDemuxer()
    units: list[AccessUnit] = []
    for g in datagrams:
        units += d.feed(g)
    units += d.flush()
    return [u for u in units if u.kind == "video"], [u for u in units if u.kind == "audio"], d


def check_timing(video: list[AccessUnit], audio: list[AccessUnit]) -> None:
    assert all(u.dts <= u.pts for u in video)
    assert all(b.dts > a.dts for a, b in itertools.pairwise(video))
    assert all(b.pts > a.pts for a, b in itertools.pairwise(audio))
    assert sorted(u.pts for u in video) == sorted({u.pts for u in video})


def new_session() -> MediaSession:
    return MediaSession(our_ssrc=0xCAFEBABE, cname="mediaplane@test")


@pytest.mark.parametrize(
    ("codec", "audio_mode"), [("h264", "hbr"), ("hevc", "latm"), ("h264", "latm"), ("hevc", "hbr")]
)
def test_camera_stream_becomes_a_clean_program(
    codec: str, audio_mode: str, h264: Source, hevc: Source, tmp_path: Path
) -> None:
    src = h264 if codec == "h264" else hevc
    stream = Stream(src, audio_mode=audio_mode)
    session = new_session()
    assert session.begin(stream.tracks(), 0.0) == [0, 1]
    out = run(session, stream.packets())
    path = tmp_path / "out.ts"
    path.write_bytes(b"".join(out))
    streams = probe(path)
    assert streams["video"]["codec_name"] == codec
    assert (streams["video"]["width"], streams["video"]["height"]) == (320, 240)
    assert int(str(streams["video"]["nb_read_frames"])) == len(src.video)
    assert streams["audio"]["codec_name"] == "aac"
    assert int(str(streams["audio"]["nb_read_frames"])) == len(src.audio)
    assert decode_errors(path) == ""
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0
    check_timing(video, audio)
    st = session.stats
    assert (st.units_video, st.units_audio, st.units_dropped, st.rtp_lost, st.bad_packets) == (
        len(src.video),
        len(src.audio),
        0,
        0,
        0,
    )
    assert st.video_codec == codec and st.audio_codec == "aac" and st.datagrams == len(out)
    # B-frames really were there (PTS below an earlier one), and DTS was derived for them
    assert any(u.dts < u.pts for u in video)


def test_lost_fu_a_fragment_drops_exactly_its_unit(h264: Source, tmp_path: Path) -> None:
    stream = Stream(h264, mtu=5)
    packets = stream.packets()
    # a non-reference picture (nal_ref_idc 0) fragmented over 3+ FU-A packets: lose its middle
    target = None
    for unit in h264.video[5:]:
        payloads = h264_payloads(unit.data, 5)
        fus = [p for p in payloads if p[0] & 0x1F == 28]
        if len(fus) >= 3 and fus[0][0] & 0x60 == 0:
            target = fus[1]
            break
    if target is None:  # every picture is small: use the first with a fragment at all
        pytest.fail("no fragmented non-reference picture in the source")
    victim = next(p for p in packets if p.data[12:] == target)
    packets.remove(victim)
    session = new_session()
    session.begin(stream.tracks(), 0.0)
    out = run(session, packets)
    assert session.stats.units_dropped == 1 and session.stats.rtp_lost == 1
    assert session.stats.units_video == len(h264.video) - 1
    path = tmp_path / "loss.ts"
    path.write_bytes(b"".join(out))
    assert int(str(probe(path)["video"]["nb_read_frames"])) == len(h264.video) - 1
    assert decode_errors(path) == ""


def test_reconnect_keeps_timestamps_monotonic_and_counters_continuous(h264: Source, tmp_path: Path) -> None:
    session = new_session()
    first = Stream(h264, video_ts0=0x7FFFFFF0, audio_ts0=0x10000)
    session.begin(first.tracks(), 100.0)
    out = run(
        session, [Packet(p.track, p.data, p.arrival + 100.0, p.seq, p.media) for p in first.packets()], flush=False
    )
    # the camera restarts: RTP timestamps and sequence numbers start again at lower values
    second = Stream(h264, video_ts0=1000, audio_ts0=5, video_seq0=3, audio_seq0=7, ssrc=(0x333, 0x444))
    session.begin(second.tracks(), 200.0)
    out += run(session, [Packet(p.track, p.data, p.arrival + 200.0, p.seq, p.media) for p in second.packets()])
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0 and d.stats.pmt_changes <= 1
    check_timing(video, audio)
    assert len(video) == 2 * len(h264.video) and len(audio) == 2 * len(h264.audio)
    assert session.units.stats.programs == 1 and session.stats.sessions == 2
    path = tmp_path / "reconnect.ts"
    path.write_bytes(b"".join(out))
    assert decode_errors(path) == ""


def test_codec_change_on_reconnect_makes_a_new_program_version(h264: Source, hevc: Source, tmp_path: Path) -> None:
    session = new_session()
    a = Stream(h264)
    session.begin(a.tracks(), 0.0)
    out = run(session, a.packets(), flush=False)
    b = Stream(hevc, ssrc=(5, 6))
    session.begin(b.tracks(), 10.0)
    out += run(session, [Packet(p.track, p.data, p.arrival + 10.0, p.seq, p.media) for p in b.packets()])
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0
    assert {u.codec for u in video} == {"h264", "hevc"}
    assert session.units.stats.programs == 2
    check_timing(video, audio)
    path = tmp_path / "change.ts"
    path.write_bytes(b"".join(out))
    assert decode_errors(path) == ""  # the HEVC stream is on a new PID: a new decoder
    assert d.stats.pmt_changes == 1


def sender_report(ssrc: int, ntp_seconds: float, rtp_ts: int) -> bytes:
    ntp = int(ntp_seconds * (1 << 32))
    return struct.pack("!BBHIQIII", 0x80, 200, 6, ssrc, ntp, rtp_ts & 0xFFFFFFFF, 0, 0)


def av_offset(video: list[AccessUnit], audio: list[AccessUnit], src: Source) -> int:
    """Output (audio - video) time shift relative to the source's, 90 kHz."""
    return (audio[0].pts - src.audio[0].pts) - (video[0].pts - min(u.pts for u in src.video[:5]))


def test_sender_reports_align_audio_on_video(h264: Source) -> None:
    stream = Stream(h264, audio_delay=0.4)  # audio packets arrive 400 ms after their video
    packets = stream.packets()
    # without SRs the arrival times set the anchors: 400 ms of lip sync error
    session = new_session()
    session.begin(stream.tracks(), 0.0)
    video, audio, _ = demux(run(session, packets))
    assert 27_000 < av_offset(video, audio, h264) < 45_000
    # with SRs (the camera's wallclock for an RTP time of each track), within one frame
    session = new_session()
    session.begin(stream.tracks(), 0.0)
    t0 = 3_900_000_000.0
    session.on_rtcp(0, sender_report(stream.ssrc[0], t0 + 1.0, stream.video_ts0 + 90_000), 0.0)
    session.on_rtcp(1, sender_report(stream.ssrc[1], t0 + 0.5, stream.audio_ts0 + 24_000), 0.0)
    video, audio, _ = demux(run(session, packets))
    assert abs(av_offset(video, audio, h264)) <= 3_600
    assert session.stats.sender_reports == 2
    rr = session.receiver_reports(3.0)
    assert set(rr) == {0, 1}


def test_begin_refuses_an_sdp_without_a_usable_track() -> None:
    session = new_session()
    tracks = [
        TrackSpec(0, "video", "VP8", 90000, None, {}),
        TrackSpec(1, "audio", "PCMU", 8000, 1, {}),
        TrackSpec(2, "audio", "mpeg4-generic", 48000, 2, {"mode": "AAC-hbr"}),
    ]
    with pytest.raises(ValueError, match=r"no H\.264/H\.265/AAC track in the camera's SDP \(found: video VP8/90000"):
        session.begin(tracks, 0.0)


def test_begin_chooses_the_first_usable_track_of_each_kind(h264: Source) -> None:
    stream = Stream(h264)
    video, audio = stream.tracks()
    tracks = [
        TrackSpec(5, "audio", "PCMA", 8000, 1, {}),
        TrackSpec(6, "video", "H265", 90000, None, {"sprop-max-don-diff": "2"}),
        TrackSpec(7, "video", "H264", 90000, None, video.fmtp),
        TrackSpec(8, "audio", "MPEG4-GENERIC", 48000, 2, audio.fmtp),
        TrackSpec(9, "video", "H264", 90000, None, video.fmtp),
        TrackSpec(10, "application", "ONVIF.METADATA", 90000, None, {}),
    ]
    session = new_session()
    assert session.begin(tracks, 0.0) == [7, 8]
    assert session.stats.ignored_tracks == 4


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_loss_duplication_and_reordering_keep_the_output_sound(h264: Source, data: st.DataObject) -> None:
    packets = Stream(h264).packets()
    n = len(packets)
    # indexes drawn independently of n (the encoder's packet count may vary between runs)
    drops = {i % n for i in data.draw(st.sets(st.integers(0, 1 << 16), max_size=8))}
    dups = {i % n for i in data.draw(st.sets(st.integers(0, 1 << 16), max_size=5))}
    swaps = {i % (n - 1) for i in data.draw(st.sets(st.integers(0, 1 << 16), max_size=5))}
    for i in sorted(swaps):
        packets[i], packets[i + 1] = packets[i + 1], packets[i]
    mangled: list[Packet] = []
    for i, p in enumerate(packets):
        if i not in drops:
            mangled += [p, p] if i in dups else [p]
    session = new_session()
    session.begin(Stream(h264).tracks(), 0.0)
    out = run(session, mangled)
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0
    check_timing(video, audio)
    assert session.stats.rtp_duplicates >= len(dups - drops) - len(swaps) * 2
    assert session.stats.units_video + session.stats.units_dropped <= len(h264.video) + 1


def test_sender_reports_arriving_mid_stream_move_the_audio(h264: Source) -> None:
    stream = Stream(h264, audio_delay=0.4)
    packets = stream.packets()
    session = new_session()
    session.begin(stream.tracks(), 0.0)
    half = len(packets) // 2
    out = run(session, packets[:half], flush=False)
    t0 = 3_900_000_000.0
    session.on_rtcp(0, sender_report(stream.ssrc[0], t0 + 1.0, stream.video_ts0 + 90_000), 1.0)
    session.on_rtcp(1, sender_report(stream.ssrc[1], t0 + 0.5, stream.audio_ts0 + 24_000), 1.0)
    out += run(session, packets[half:])
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0
    check_timing(video, audio)
    # after the correction the last units are in sync; audio that fell behind was dropped, counted
    shift = (audio[-1].pts - h264.audio[-1].pts) - (video[-1].pts - h264.video[-1].pts)
    assert abs(shift) <= 3_600
    assert session.units.stats.late_units > 0


def test_a_new_ssrc_restarts_the_track_clock_without_going_back(h264: Source, tmp_path: Path) -> None:
    first = Stream(h264)
    second = Stream(h264, video_ts0=77, audio_ts0=88, video_seq0=1, audio_seq0=2, ssrc=(0xAA, 0xBB))
    session = new_session()
    session.begin(first.tracks(), 0.0)
    out = run(session, first.packets(), flush=False)
    out += run(session, [Packet(p.track, p.data, p.arrival + 2.5, p.seq, p.media) for p in second.packets()])
    assert session.stats.ssrc_changes == 2
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0
    check_timing(video, audio)
    assert len(video) == 2 * len(h264.video)
    path = tmp_path / "ssrc.ts"
    path.write_bytes(b"".join(out))
    assert decode_errors(path) == ""


def test_rtp_info_sets_the_first_expected_sequence_number(h264: Source) -> None:
    stream = Stream(h264, video_seq0=500)
    session = new_session()
    session.begin(stream.tracks(), 0.0)
    session.set_rtp_info(0, 498, stream.video_ts0)
    session.set_rtp_info(1, None, None)
    run(session, stream.packets())
    assert session.stats.rtp_lost == 2  # 498 and 499 never came
    reports = session.receiver_reports(5.0)
    assert set(reports) == {0, 1} and all(len(r) % 4 == 0 for r in reports.values())


def test_reordered_and_duplicated_packets_are_repaired(h264: Source, tmp_path: Path) -> None:
    stream = Stream(h264, mtu=300)
    packets = stream.packets()
    video_at = [i for i, p in enumerate(packets) if p.track == 0]
    for k in (5, 20, 40):  # a packet overtaken by the two after it, within the video track
        i, j = video_at[k], video_at[k + 2]
        packets.insert(j, packets.pop(i))
    packets.insert(video_at[30], packets[video_at[30]])  # a duplicate
    session = new_session()
    session.begin(stream.tracks(), 0.0)
    out = run(session, packets)
    st = session.stats
    assert (st.rtp_reordered, st.rtp_duplicates, st.rtp_lost, st.units_dropped) == (3, 1, 0, 0)
    assert st.units_video == len(h264.video)
    path = tmp_path / "reorder.ts"
    path.write_bytes(b"".join(out))
    assert decode_errors(path) == ""


@pytest.mark.parametrize("only", ["video", "audio"])
def test_single_track_sessions(only: str, h264: Source, tmp_path: Path) -> None:
    stream = Stream(h264)
    index = 0 if only == "video" else 1
    session = new_session()
    assert session.begin([stream.tracks()[index]], 0.0) == [index]
    out = run(session, [p for p in stream.packets() if p.track == index])
    path = tmp_path / "single.ts"
    path.write_bytes(b"".join(out))
    streams = probe(path)
    assert set(streams) == {only}
    expected = len(h264.video) if only == "video" else len(h264.audio)
    assert int(str(streams[only]["nb_read_frames"])) == expected
    assert decode_errors(path) == ""


def test_an_rtp_clock_jump_under_the_same_ssrc_restarts_the_track_clock(h264: Source, tmp_path: Path) -> None:
    first = Stream(h264)
    out_packets = first.packets()
    second = Stream(h264, video_ts0=5, audio_ts0=0x7FFFF000, video_seq0=first.seq[0], audio_seq0=first.seq[1])
    out_packets += [Packet(p.track, p.data, p.arrival + 2.1, p.seq, p.media) for p in second.packets()]
    session = new_session()
    session.begin(first.tracks(), 0.0)
    out = run(session, out_packets)
    assert session.stats.clock_jumps == 2 and session.stats.rtp_lost == 0
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0
    check_timing(video, audio)
    assert len(video) == 2 * len(h264.video) and len(audio) == 2 * len(h264.audio)
    path = tmp_path / "jump.ts"
    path.write_bytes(b"".join(out))
    assert decode_errors(path) == ""


def test_a_track_with_a_zero_clock_rate_is_not_chosen(h264: Source) -> None:
    video, audio = Stream(h264).tracks()
    bad = TrackSpec(0, "video", "H264", 0, None, video.fmtp)
    session = new_session()
    assert session.begin([bad, audio], 0.0) == [1]
    with pytest.raises(ValueError, match="clock rate 0"):
        session.begin([bad], 0.0)


def test_joining_mid_gop_the_video_joins_the_announced_program_at_its_keyframe(h264: Source, tmp_path: Path) -> None:
    stream = Stream(h264)
    packets = stream.packets()
    # the session starts 18 pictures into the first GOP: 0.7 s + the DTS window before a keyframe
    first_kept_video = next(p for p in packets if p.track == 0 and p.arrival >= 18 / 25 + 0.05)
    packets = [p for p in packets if p.track == 1 or p.arrival >= first_kept_video.arrival]
    session = new_session()
    session.begin(stream.tracks(), 0.0)
    out = run(session, packets)
    path = tmp_path / "midgop.ts"
    path.write_bytes(b"".join(out))
    streams = probe(path)
    assert int(str(streams["video"]["nb_read_frames"])) == 25  # the second GOP
    assert int(str(streams["audio"]["nb_read_frames"])) == len(h264.audio)
    assert decode_errors(path) == ""
    video, audio, d = demux(out)
    assert d.stats.cc_errors == 0
    check_timing(video, audio)
