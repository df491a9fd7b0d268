"""parse_sdp (RFC 8866) with camera quirks, and resolve_control (RFC 2326 §C.1.1)."""

from __future__ import annotations

import pytest

from services.edge.core.rtsp import RtpMap, SdpError, parse_sdp, resolve_control

CAMERA_SDP = """v=0
o=- 1 1 IN IP4 192.168.1.64
s=Media Presentation
c=IN IP4 0.0.0.0
b=AS:5100
t=0 0
a=control:rtsp://192.168.1.64:554/Streaming/Channels/101/
m=video 0 RTP/AVP 96
b=AS:5000
a=recvonly
a=x-dimensions:1920,1080
a=control:rtsp://192.168.1.64:554/Streaming/Channels/101/trackID=1
a=rtpmap:96 H264/90000
a=fmtp:96 profile-level-id=420029; packetization-mode=1; sprop-parameter-sets=Z00AKpWoHgCJ+WEAAAMD6AAAdTAB,aO48gA==
m=audio 0 RTP/AVP 104
a=rtpmap:104 mpeg4-generic/16000/1
a=fmtp:104 profile-level-id=15; streamtype=5; mode=AAC-hbr; config=1408;SizeLength=13; IndexLength=3;
a=control:rtsp://192.168.1.64:554/Streaming/Channels/101/trackID=2
"""


def test_a_typical_camera_sdp() -> None:
    sd = parse_sdp(CAMERA_SDP.replace("\n", "\r\n"))
    assert sd.control == "rtsp://192.168.1.64:554/Streaming/Channels/101/"
    assert sd.session_name == "Media Presentation" and sd.origin is not None
    assert sd.bandwidth == {"AS": 5100}
    video, audio = sd.media
    assert (video.media, video.port, video.proto, video.formats) == ("video", 0, "RTP/AVP", ("96",))
    assert video.rtpmaps[96] == RtpMap(96, "H264", 90000, None)
    assert video.fmtps[96]["sprop-parameter-sets"] == "Z00AKpWoHgCJ+WEAAAMD6AAAdTAB,aO48gA=="
    assert video.fmtps[96]["packetization-mode"] == "1"
    assert video.control == "rtsp://192.168.1.64:554/Streaming/Channels/101/trackID=1"
    assert video.bandwidth == {"AS": 5000} and video.attribute("recvonly") == ""
    assert audio.rtpmaps[104] == RtpMap(104, "mpeg4-generic", 16000, 1)
    fmtp = audio.fmtps[104]
    assert fmtp["sizelength"] == "13" and fmtp["mode"] == "AAC-hbr" and fmtp["config"] == "1408"
    assert "" not in fmtp  # the trailing ";" adds nothing


def test_no_v_no_o_lf_blank_lines_unknown_lines() -> None:
    sd = parse_sdp("\n\ns=x\nnonsense\nz\nm=video 0 RTP/AVP 96\n\nfoo bar\na=rtpmap:96 H265/90000\na=control:track1\n")
    assert sd.origin is None and sd.control is None
    (video,) = sd.media
    assert video.rtpmaps[96].encoding == "H265" and video.control == "track1"


def test_duplicate_attributes_first_wins() -> None:
    sd = parse_sdp(
        "m=video 0 RTP/AVP 96\na=rtpmap:96 H264/90000\na=rtpmap:96 H265/90000\n"
        "a=fmtp:96 a=1\na=fmtp:96 a=2\na=control:one\na=control:two\n"
    )
    media = sd.media[0]
    assert media.rtpmaps[96].encoding == "H264" and media.fmtps[96] == {"a": "1"} and media.control == "one"


@pytest.mark.parametrize(
    ("pt", "encoding", "clock", "channels"),
    [(0, "PCMU", 8000, 1), (8, "PCMA", 8000, 1), (14, "MPA", 90000, None), (26, "JPEG", 90000, None),
     (33, "MP2T", 90000, None)],
)  # fmt: skip
def test_static_payload_types_from_rfc_3551(pt: int, encoding: str, clock: int, channels: int | None) -> None:
    media = parse_sdp(f"m=video 0 RTP/AVP {pt}\n").media[0]
    assert media.rtpmaps[pt] == RtpMap(pt, encoding, clock, channels)


def test_explicit_rtpmap_beats_the_static_table() -> None:
    media = parse_sdp("m=audio 0 RTP/AVP 0\na=rtpmap:0 PCMU/16000\n").media[0]
    assert media.rtpmaps[0].clock_rate == 16000


def test_malformed_attributes_are_skipped() -> None:
    sd = parse_sdp(
        "m=video 0 RTP/AVP 96\na=rtpmap:96\na=rtpmap:x H264/90000\na=rtpmap:96 H264/abc\na=fmtp:\na=fmtp:96\n"
        "b=AS:lots\na=\n"
    )
    media = sd.media[0]
    assert media.rtpmaps == {} and media.fmtps == {96: {}} and media.bandwidth == {}


def test_a_broken_m_line_drops_its_section_only() -> None:
    sd = parse_sdp("m=video x RTP/AVP 96\na=control:bad\nm=audio 0 RTP/AVP 0\na=control:good\n")
    assert [m.media for m in sd.media] == ["audio"] and sd.media[0].control == "good"
    assert sd.control is None  # the dropped section's a=control is not session-level


@pytest.mark.parametrize("text", ["", "v=0\ns=x\n", "m=video\n", "m=video 0 RTP/AVP\n", "garbage\x00\x01"])
def test_no_usable_media_is_an_sdp_error(text: str) -> None:
    with pytest.raises(SdpError):
        parse_sdp(text)


@pytest.mark.parametrize(
    ("base", "control", "expected"),
    [
        ("rtsp://h/stream", None, "rtsp://h/stream"),
        ("rtsp://h/stream", "*", "rtsp://h/stream"),
        ("rtsp://h/stream", "", "rtsp://h/stream"),
        ("rtsp://h/stream", "trackID=1", "rtsp://h/stream/trackID=1"),
        ("rtsp://h/stream/", "trackID=1", "rtsp://h/stream/trackID=1"),
        ("rtsp://h/stream/", "/trackID=1", "rtsp://h/stream/trackID=1"),
        ("rtsp://h/stream", "rtsp://other:8554/x/track2", "rtsp://other:8554/x/track2"),
        ("rtsp://h/stream", "RTSP://H/y", "RTSP://H/y"),
        # FFmpeg and live555 append after a query too (Dahua URLs), and cameras expect it.
        ("rtsp://h/cam/realmonitor?channel=1&subtype=0", "trackID=0", "rtsp://h/cam/realmonitor?channel=1&subtype=0/trackID=0"),
    ],
)  # fmt: skip
def test_resolve_control(base: str, control: str | None, expected: str) -> None:
    assert resolve_control(base, control) == expected
