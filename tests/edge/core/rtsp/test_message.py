"""RtspReader framing (RFC 2326 §4, §6, §7, §10.12) and build_request/build_response."""

from __future__ import annotations

import pytest

from services.edge.core.rtsp import (
    InterleavedFrame,
    RtspProtocolError,
    RtspReader,
    RtspRequest,
    RtspResponse,
    build_request,
    build_response,
)
from services.edge.core.rtsp.message import MAX_BODY_BYTES, MAX_GARBAGE_BYTES, MAX_HEADER_BYTES, MAX_HEADERS

OK = b"RTSP/1.0 200 OK\r\nCSeq: 1\r\nPublic: OPTIONS, DESCRIBE\r\n\r\n"


def frame(channel: int, data: bytes) -> bytes:
    return b"$" + bytes([channel]) + len(data).to_bytes(2, "big") + data


def test_a_response_with_headers() -> None:
    (msg,) = RtspReader().feed(OK)
    assert isinstance(msg, RtspResponse)
    assert (msg.version, msg.status, msg.reason, msg.body) == ("1.0", 200, "OK", b"")
    assert msg.get("cseq") == "1" and msg.get("PUBLIC") == "OPTIONS, DESCRIBE" and msg.cseq == 1
    assert msg.get("Session") is None


def test_repeated_headers_are_kept_in_order() -> None:
    data = (
        b"RTSP/1.0 401 Unauthorized\r\nCSeq: 2\r\n"
        b'WWW-Authenticate: Digest realm="r", nonce="n"\r\nwww-authenticate: Basic realm="r"\r\n\r\n'
    )
    (msg,) = RtspReader().feed(data)
    assert isinstance(msg, RtspResponse)
    assert msg.get_all("WWW-Authenticate") == ['Digest realm="r", nonce="n"', 'Basic realm="r"']


def test_body_of_content_length_bytes() -> None:
    body = b"v=0\r\nm=video 0 RTP/AVP 96\r\n"
    data = b"RTSP/1.0 200 OK\r\nCSeq: 3\r\nContent-Length: %d\r\n\r\n" % len(body) + body + OK
    msgs = RtspReader().feed(data)
    assert [type(m) for m in msgs] == [RtspResponse, RtspResponse]
    assert isinstance(msgs[0], RtspResponse) and msgs[0].body == body


def test_lf_only_trailing_whitespace_and_no_reason_phrase() -> None:
    (msg,) = RtspReader().feed(b"RTSP/1.0 200  \nCSeq:   7   \t\nX-Odd: a b  \n\n")
    assert isinstance(msg, RtspResponse)
    assert (msg.status, msg.reason, msg.get("CSeq"), msg.get("x-odd")) == (200, "", "7", "a b")


def test_rtsp_2_0_and_folded_header_lines() -> None:
    (msg,) = RtspReader().feed(b"RTSP/2.0 200 OK\r\nCSeq: 1\r\nPublic: OPTIONS,\r\n  DESCRIBE\r\nbogus line\r\n\r\n")
    assert isinstance(msg, RtspResponse)
    assert msg.version == "2.0" and msg.get("Public") == "OPTIONS, DESCRIBE"
    assert len(msg.headers) == 2  # the line without a colon is dropped


def test_server_request() -> None:
    (msg,) = RtspReader().feed(b"GET_PARAMETER rtsp://cam/stream RTSP/1.0\r\nCSeq: 9\r\nSession: 1\r\n\r\n")
    assert isinstance(msg, RtspRequest)
    assert (msg.method, msg.url, msg.version, msg.cseq) == ("GET_PARAMETER", "rtsp://cam/stream", "1.0", 9)


def test_interleaved_frames_between_messages() -> None:
    data = frame(0, b"rtp") + OK + frame(1, b"") + frame(255, b"x" * 1000)
    msgs = RtspReader().feed(data)
    assert msgs == [
        InterleavedFrame(0, b"rtp"),
        RtspReader().feed(OK)[0],
        InterleavedFrame(1, b""),
        InterleavedFrame(255, b"x" * 1000),
    ]


def test_byte_at_a_time_gives_the_same_messages() -> None:
    body = b"hello"
    data = (
        frame(0, b"\x80\x60" + b"\x00" * 20)
        + b"RTSP/1.0 200 OK\r\nCSeq: 3\r\nContent-Length: 5\r\n\r\n"
        + body
        + frame(1, b"rtcp")
        + b"OPTIONS * RTSP/1.0\nCSeq: 4\n\n"
    )
    whole = RtspReader().feed(data)
    reader = RtspReader()
    pieces = [m for i in range(len(data)) for m in reader.feed(data[i : i + 1])]
    assert pieces == whole and len(whole) == 4
    assert reader.buffered == 0


def test_a_request_line_cut_after_its_cr() -> None:
    reader = RtspReader()
    assert reader.feed(b"SET_PARAMETER * RTSP/1.0\r") == []
    (msg,) = reader.feed(b"\n\r\n")
    assert isinstance(msg, RtspRequest) and msg.method == "SET_PARAMETER" and reader.skipped_bytes == 0


def test_garbage_between_messages_is_skipped_and_counted() -> None:
    reader = RtspReader()
    msgs = reader.feed(b"\x00\x01junk junk\r\n" + OK + b"\r\n\r\n" + b"\xff\xfe" + frame(2, b"ab"))
    assert [type(m) for m in msgs] == [RtspResponse, InterleavedFrame]
    assert reader.skipped_bytes == len(b"\x00\x01junk junk\r\n") + 2


def test_garbage_run_over_the_limit_fails() -> None:
    reader = RtspReader()
    with pytest.raises(RtspProtocolError, match="unparseable"):
        for _ in range(MAX_GARBAGE_BYTES // 1000 + 2):
            reader.feed(b"\x00" * 1000)


def test_garbage_runs_are_separate_after_a_good_message() -> None:
    reader = RtspReader()
    for _ in range(3):
        reader.feed(b"\x00" * (MAX_GARBAGE_BYTES - 100) + OK)
    assert reader.skipped_bytes == 3 * (MAX_GARBAGE_BYTES - 100)


def test_header_block_limit() -> None:
    reader = RtspReader()
    reader.feed(b"RTSP/1.0 200 OK\r\n")
    with pytest.raises(RtspProtocolError, match="header block"):
        for _ in range(MAX_HEADER_BYTES // 100 + 1):
            reader.feed(b"X-Pad: " + b"a" * 91 + b"\r\n")


def test_header_count_limit() -> None:
    lines = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1))
    with pytest.raises(RtspProtocolError, match="header lines"):
        RtspReader().feed(b"RTSP/1.0 200 OK\r\n" + lines + b"\r\n")


@pytest.mark.parametrize("value", [b"-1", b"abc", b"1e3", b"%d" % (MAX_BODY_BYTES + 1), b"99999999999"])
def test_bad_content_length(value: bytes) -> None:
    with pytest.raises(RtspProtocolError):
        RtspReader().feed(b"RTSP/1.0 200 OK\r\nContent-Length: " + value + b"\r\n\r\n")


def test_conflicting_content_lengths() -> None:
    with pytest.raises(RtspProtocolError, match="conflicting"):
        RtspReader().feed(b"RTSP/1.0 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")


def test_body_up_to_the_limit_is_accepted() -> None:
    reader = RtspReader()
    head = b"RTSP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % MAX_BODY_BYTES
    assert reader.feed(head + b"a" * (MAX_BODY_BYTES - 1)) == []
    (msg,) = reader.feed(b"a")
    assert isinstance(msg, RtspResponse) and len(msg.body) == MAX_BODY_BYTES


def test_build_request() -> None:
    data = build_request("DESCRIBE", "rtsp://h/s", [("CSeq", "2"), ("Accept", "application/sdp")])
    assert data == b"DESCRIBE rtsp://h/s RTSP/1.0\r\nCSeq: 2\r\nAccept: application/sdp\r\n\r\n"
    with_body = build_request("SET_PARAMETER", "rtsp://h/s", [("CSeq", "3")], b"a: b\r\n")
    assert with_body.endswith(b"Content-Length: 6\r\n\r\na: b\r\n")
    (msg,) = RtspReader().feed(build_response(200, "OK", [("CSeq", "3")]))
    assert isinstance(msg, RtspResponse) and msg.cseq == 3


@pytest.mark.parametrize(
    ("method", "url", "headers"),
    [("GET PARAMETER", "rtsp://h", []), ("OPTIONS", "rtsp://h/a b", []), ("OPTIONS", "*", [("X", "a\r\nInjected: 1")])],
)
def test_build_request_refuses_injection(method: str, url: str, headers: list[tuple[str, str]]) -> None:
    with pytest.raises(ValueError):
        build_request(method, url, headers)
