"""FlvToTs: FLV tags (RTMP) -> 1316-byte TS datagrams, read back with TsDemuxer."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.edge.core.mux.codec import (
    AvcConfig,
    HevcConfig,
    annexb_to_length_prefixed,
    build_asc,
    build_avcc,
    build_hvcc,
    split_annexb,
)
from services.edge.core.mux.from_flv import TIMESTAMP_BASE, FlvToTs
from services.edge.core.mux.ts_demux import TsDemuxer
from services.edge.core.rtmp.flv import AudioCodec, AudioTag, FrameType, PacketKind, VideoCodec, VideoTag

from .helpers import AAC_LC_48K_STEREO, PPS, SPS, h264_au

AVCC = build_avcc(AvcConfig.from_parameter_sets([SPS], [PPS]))
ASC = build_asc(AAC_LC_48K_STEREO)


def avc_header() -> VideoTag:
    return VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, AVCC)


def avc_frame(index: int, *, key: bool, cts: int = 0, size: int = 300) -> VideoTag:
    # RTMP sources send NAL units without AUD or parameter sets: keep the slice only.
    slice_nal = split_annexb(h264_au(size, idr=key, seed=index))[-1]
    payload = annexb_to_length_prefixed(b"\x00\x00\x00\x01" + slice_nal)
    frame_type = FrameType.KEY if key else FrameType.INTER
    return VideoTag(VideoCodec.AVC, frame_type, PacketKind.FRAME, payload, composition_time=cts)


def aac_header() -> AudioTag:
    return AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, ASC)


def aac_frame(index: int) -> AudioTag:
    return AudioTag(AudioCodec.AAC, PacketKind.FRAME, bytes((index + i) % 256 for i in range(200)))


def run(tags: list[tuple[bool, int, VideoTag | AudioTag]], conv: FlvToTs | None = None) -> tuple[FlvToTs, bytes]:
    conv = conv or FlvToTs()
    out: list[bytes] = []
    for is_video, ts, tag in tags:
        out += conv.push_video(ts, tag) if is_video else conv.push_audio(ts, tag)  # type: ignore[arg-type]
    assert all(len(d) == 1316 for d in out)
    out += conv.flush()
    return conv, b"".join(out)


def av_session(seconds: float = 2.0, *, gop: int = 25) -> list[tuple[bool, int, VideoTag | AudioTag]]:
    tags: list[tuple[bool, int, VideoTag | AudioTag]] = [(True, 0, avc_header()), (False, 0, aac_header())]
    video_n = int(seconds * 25)
    events: list[tuple[int, bool, int]] = [(i * 40, True, i) for i in range(video_n)]
    events += [(int(k * 1024 * 1000 / 48000), False, k) for k in range(int(seconds * 48000 / 1024))]
    for ts, is_video, i in sorted(events):
        tag = avc_frame(i, key=i % gop == 0, cts=80) if is_video else aac_frame(i)
        tags.append((is_video, ts, tag))
    return tags


def test_h264_and_aac_become_a_decodable_program() -> None:
    conv, ts = run(av_session())
    assert conv.program == ("h264", "aac")
    demux = TsDemuxer()
    units = demux.feed(ts) + demux.flush()
    video = [u for u in units if u.kind == "video"]
    audio = [u for u in units if u.kind == "audio"]
    assert len(video) == 50 and len(audio) == 93
    assert demux.stats.cc_errors == 0
    # PTS = (ts + cts) x 90, DTS = ts x 90 (plus the 1 s base)
    assert video[1].dts == 40 * 90 + TIMESTAMP_BASE and video[1].pts == 120 * 90 + TIMESTAMP_BASE
    assert audio[0].pts == TIMESTAMP_BASE
    for unit in video:
        nals = split_annexb(unit.data)
        assert nals[0] == b"\x09\xf0"  # an AUD first
        if unit.keyframe:
            assert nals[1:3] == [SPS, PPS]  # parameter sets before every IDR
    assert sum(u.keyframe for u in video) == 2
    assert all(u.data[:2] == b"\xff\xf1" for u in audio)  # ADTS


def test_video_only_starts_after_the_wait() -> None:
    tags: list[tuple[bool, int, VideoTag | AudioTag]] = [(True, 0, avc_header())]
    tags += [(True, i * 40, avc_frame(i, key=i == 0)) for i in range(40)]
    conv = FlvToTs()
    first_out = None
    for n, (_, ts, tag) in enumerate(tags):
        assert isinstance(tag, VideoTag)
        if conv.push_video(ts, tag) and first_out is None:
            first_out = n
    assert conv.program == ("h264", None)
    assert first_out is not None and tags[first_out][1] >= 1000  # waited ~1 s of media for audio
    # audio that turns up later is not followed (the program is fixed)
    conv.push_audio(1700, aac_header())
    conv.push_audio(1710, aac_frame(0))
    assert conv.stats.late_streams == 1


def test_audio_only_program() -> None:
    tags: list[tuple[bool, int, VideoTag | AudioTag]] = [(False, 0, aac_header())]
    tags += [(False, k * 21, aac_frame(k)) for k in range(60)]
    conv, ts = run(tags)
    assert conv.program == (None, "aac")
    units = TsDemuxer().feed(ts)
    assert len([u for u in units if u.kind == "audio"]) >= 55


def test_video_before_the_first_keyframe_is_dropped() -> None:
    tags: list[tuple[bool, int, VideoTag | AudioTag]] = [(True, 0, avc_header()), (False, 0, aac_header())]
    tags += [(True, 40 * i, avc_frame(i, key=i == 3)) for i in range(6)]
    conv, ts = run(tags)
    assert conv.stats.dropped_before_keyframe == 3
    video = [u for u in TsDemuxer().feed(ts) if u.kind == "video"]
    assert video and video[0].keyframe


def test_hevc_enhanced_rtmp() -> None:
    vps = bytes.fromhex("40010c01ffff016000000300900000030000030078959809")
    sps = bytes.fromhex("420101016000000300900000030000030078a00502016965959a4932bc05a80808082000000300200000030321")
    pps = bytes.fromhex("4401c172b46240")
    record = build_hvcc(HevcConfig.from_parameter_sets([vps], [sps], [pps]))
    header = VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, record, enhanced=True)
    idr = b"\x26\x01" + bytes(range(1, 200))  # IDR_W_RADL
    trail = b"\x02\x01" + bytes(range(1, 100))  # TRAIL_R
    tags: list[tuple[bool, int, VideoTag | AudioTag]] = [(True, 0, header)]
    for i in range(30):
        nal = idr if i % 10 == 0 else trail
        ft = FrameType.KEY if i % 10 == 0 else FrameType.INTER
        payload = len(nal).to_bytes(4, "big") + nal
        tags.append((True, i * 40, VideoTag(VideoCodec.HEVC, ft, PacketKind.FRAME, payload, enhanced=True)))
    conv, ts = run(tags)
    assert conv.program == ("hevc", None)
    video = [u for u in TsDemuxer().feed(ts) if u.kind == "video"]
    assert len(video) >= 25
    first = split_annexb(video[0].data)
    assert first[0] == b"\x46\x01\x50" and first[1:4] == [vps, sps, pps]


def test_unsupported_codecs_are_counted_not_muxed() -> None:
    vp9 = VideoTag(VideoCodec.VP9, FrameType.KEY, PacketKind.FRAME, b"\x00" * 10, enhanced=True)
    mp3 = AudioTag(AudioCodec.MP3, PacketKind.FRAME, b"\xff\xfb" + b"\x00" * 100)
    tags: list[tuple[bool, int, VideoTag | AudioTag]] = [(False, 0, aac_header())]
    for i in range(60):
        tags += [(True, i * 40, vp9), (False, i * 40, mp3), (False, i * 40 + 1, aac_frame(i))]
    conv, _ = run(tags)
    assert conv.program == (None, "aac") and conv.stats.unsupported >= 100


_tags = st.one_of(
    st.builds(lambda i, k: (True, avc_frame(i, key=k, size=50)), st.integers(0, 50), st.booleans()),
    st.just((True, avc_header())),
    st.just((False, aac_header())),
    st.builds(lambda i: (False, aac_frame(i)), st.integers(0, 50)),
    st.builds(lambda b: (True, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.FRAME, b)), st.binary(max_size=40)),
    st.builds(lambda b: (True, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, b)), st.binary()),
    st.builds(lambda b: (False, AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, b)), st.binary(max_size=8)),
    st.builds(lambda b: (False, AudioTag(AudioCodec.AAC, PacketKind.FRAME, b)), st.binary(max_size=100)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), _tags), max_size=80))
def test_any_tag_sequence_gives_whole_datagrams(items: list[tuple[int, tuple[bool, VideoTag | AudioTag]]]) -> None:
    conv = FlvToTs()
    out: list[bytes] = []
    for ts, (is_video, tag) in sorted(items, key=lambda x: x[0]):
        out += conv.push_video(ts, tag) if is_video else conv.push_audio(ts, tag)  # type: ignore[arg-type]
    assert all(len(d) == 1316 for d in out)
    tail = conv.flush()
    assert all(len(d) == 1316 and d[0] == 0x47 for d in out + tail)
    demux = TsDemuxer()
    demux.feed(b"".join(out + tail))
    assert demux.stats.cc_errors == 0
