"""Property tests: arbitrary and mutated input raises nothing but RtspProtocolError / SdpError,
chunking never changes what a valid stream parses to, and buffered input stays within the caps."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core.rtsp import (
    Described,
    Failed,
    RtspClient,
    RtspProtocolError,
    RtspReader,
    SdpError,
    parse_sdp,
)
from services.edge.core.rtsp.message import MAX_BODY_BYTES, MAX_HEADER_BYTES

from .camera import SDP, frame, response

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PASSWORD = "fuzz-Secret-99"


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


# ---------------------------------------------------------------------------- RtspReader

PIECES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"RTSP/1.0 200 OK\r\nCSeq: 1\r\n\r\n",
            b"RTSP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nbody",
            b"RTSP/1.0 401\nWWW-Authenticate: Basic\n\n",
            b"OPTIONS * RTSP/1.0\r\nCSeq: 5\r\n\r\n",
            b"RTSP/1.0 200 OK\r\nContent-Length: 99999999\r\n\r\n",
            b"RTSP/1.0 200 OK\r\nContent-Length: 500\r\n\r\n",
            b"RTSP/1.0 200 OK\r\nContent-Length: 513\r\n\r\n",
            b"X-Long: " + b"x" * 200 + b"\r\n",
            b"\x00" * 100,
            b"A" * 120,
            b"RTSP/1.0 200 OK\r\n",
            b"RTSP/1.0 200 OK\r\nContent-Length: 500\r\n\r\n" + b"b" * 300,
            b"b" * 200,
            b"$\x00\xff\xff",
            b"$\x01\x00\x02ab",
            b"\r\n",
            b"RTSP/",
            b"X-Header: value\r\n",
            b"\n\n",
        ]
    ),
)


SMALL = {"max_start_line": 128, "max_header_bytes": 256, "max_headers": 8, "max_body_bytes": 512}
SMALL_GARBAGE = 300  # small caps so "never past the caps" means something at these input sizes


def check_bounded(reader: RtspReader, chunk: bytes) -> None:
    """Buffered input stays within one message's caps (or one $ frame) plus the last chunk."""
    cap = SMALL["max_header_bytes"] + SMALL["max_body_bytes"]
    if reader.buffered and reader._buffer[0] == 0x24:
        cap = max(cap, 4 + 0xFFFF)
    assert reader.buffered <= cap + len(chunk)


@FAST
@given(st.lists(PIECES, max_size=40), st.lists(st.integers(min_value=0), max_size=12))
def test_reader_raises_only_protocol_errors_and_stays_bounded(pieces: list[bytes], cuts: list[int]) -> None:
    reader = RtspReader(**SMALL, max_garbage_bytes=SMALL_GARBAGE)
    try:
        for chunk in chunked(b"".join(pieces), cuts):
            reader.feed(chunk)
            check_bounded(reader, chunk)
    except RtspProtocolError:
        pass


@FAST
@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0), max_size=12))
def test_reader_on_random_bytes(data: bytes, cuts: list[int]) -> None:
    reader = RtspReader(**SMALL, max_garbage_bytes=SMALL_GARBAGE)
    try:
        for chunk in chunked(data, cuts):
            reader.feed(chunk)
            check_bounded(reader, chunk)
    except RtspProtocolError:
        pass


def test_default_caps_bound_the_buffer() -> None:
    reader = RtspReader()
    head = b"RTSP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % MAX_BODY_BYTES
    reader.feed(head + b"a" * (MAX_BODY_BYTES - 1))
    assert reader.buffered == len(head) + MAX_BODY_BYTES - 1 <= MAX_HEADER_BYTES + MAX_BODY_BYTES


VALID = st.one_of(
    st.builds(frame, st.integers(0, 255), st.binary(max_size=64)),
    st.builds(
        response,
        st.integers(0, 10**6),
        st.integers(100, 599),
        st.sampled_from(["OK", "", "Not Found", "Odd reason phrase"]),
        st.lists(
            st.tuples(st.sampled_from(["Session", "X-A", "Public"]), st.from_regex(r"[ -~]{0,30}", fullmatch=True))
        ),
        st.binary(max_size=64),
    ),
    st.sampled_from([b"\r\n", b"GET_PARAMETER rtsp://h/ RTSP/1.0\nCSeq: 3\n\n", b"SET_PARAMETER * RTSP/1.0\r\n\r\n"]),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(VALID, max_size=8), st.lists(st.integers(min_value=0), max_size=20))
def test_chunking_does_not_change_a_valid_stream(messages: list[bytes], cuts: list[int]) -> None:
    data = b"".join(messages)
    whole = RtspReader().feed(data)
    reader = RtspReader()
    pieces = [m for chunk in chunked(data, cuts) for m in reader.feed(chunk)]
    assert pieces == whole
    assert reader.buffered == 0 and reader.skipped_bytes == 0


# ---------------------------------------------------------------------------- parse_sdp

SDP_LINES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(SDP.splitlines()),
    st.sampled_from(
        [
            "m=video 0 RTP/AVP 96",
            "m=audio x RTP/AVP 0",
            "m=",
            "a=rtpmap:96",
            "a=rtpmap:999 H264/90000",
            "a=rtpmap:96 H264/99999999999999",
            "a=fmtp:96 ;;;=;a==b;",
            "a=fmtp: ",
            "b=AS:",
            "b=:5",
            "a=control:",
            "a=:x",
            "c=IN IP4",
        ]
    ),
)


@FAST
@given(st.lists(SDP_LINES, max_size=20), st.sampled_from(["\n", "\r\n", "\r", "\x85"]))
def test_parse_sdp_raises_only_sdp_error(lines: list[str], newline: str) -> None:
    try:
        parse_sdp(newline.join(lines))
    except SdpError:
        pass


@FAST
@given(st.text(max_size=1000))
def test_parse_sdp_on_random_text(text: str) -> None:
    try:
        parse_sdp(text)
    except SdpError:
        pass


# ---------------------------------------------------------------------------- RtspClient

HEADERS = st.sampled_from(
    [
        ("Public", "OPTIONS, GET_PARAMETER"),
        ("Content-Base", "rtsp://h/s/"),
        ("Content-Base", "relative/base"),
        ("Content-Location", "rtsp://[::1"),
        ("Session", "12345678;timeout=30"),
        ("Session", ";timeout=abc"),
        ("Session", "x;timeout=0"),
        ("Transport", "RTP/AVP/TCP;interleaved=0-1;ssrc=zz"),
        ("Transport", "RTP/AVP;server_port=99999-1;source=;ssrc=FFFFFFFF"),
        ("Transport", "RTP/AVP/TCP;interleaved=300-301"),
        ("Transport", ";;=;interleaved"),
        ("WWW-Authenticate", 'Digest realm="r", nonce="n", qop="auth", stale=true'),
        ("WWW-Authenticate", 'Digest realm="r", nonce="n2", algorithm=SHA-256'),
        ("WWW-Authenticate", 'Digest nonce="n", qop=auth-int, algorithm=MD5-sess'),
        ("WWW-Authenticate", "Basic"),
        ("WWW-Authenticate", 'Digest realm="unterminated'),
        ("WWW-Authenticate", "=,,= x"),
        ("RTP-Info", "url=trackID=1;seq=1;rtptime=2,url=;seq=x"),
        ("RTP-Info", "url=rtsp://other/s/trackID=2;seq=99999999;rtptime=-1"),
        ("RTP-Info", ",,;;="),
        ("Location", f"rtsp://admin:{PASSWORD}@x/"),
    ]
)
BODIES = st.one_of(
    st.sampled_from(
        [
            SDP.encode(),
            b"m=video 0 RTP/AVP 96 97\r\na=control:rtsp://x/y z\r\n",
            b"m=application 0 RTP/AVP 107\r\n",
            b"",
        ]
    ),
    st.binary(max_size=100),
)
SERVER_MESSAGES = st.one_of(
    st.builds(
        response,
        st.one_of(st.none(), st.integers(0, 12)),
        st.sampled_from([100, 200, 200, 200, 301, 401, 401, 403, 404, 454, 461, 501, 503]),
        st.sampled_from(["OK", PASSWORD, ""]),
        st.lists(HEADERS, max_size=4),
        BODIES,
    ),
    st.builds(frame, st.integers(0, 255), st.binary(max_size=50)),
    st.sampled_from([b"OPTIONS * RTSP/1.0\r\nCSeq: 1\r\n\r\n", b"ANNOUNCE x RTSP/1.0\r\nCSeq: \r\x01\r\n\r\n"]),
    st.binary(max_size=40),
)
ACTIONS = st.lists(st.sampled_from(["keepalive", "teardown", "interleaved", "none"]), max_size=12)


@FAST
@given(
    st.lists(SERVER_MESSAGES, max_size=12),
    st.lists(st.integers(min_value=0), max_size=6),
    ACTIONS,
    st.sampled_from(["tcp", "udp"]),
    st.booleans(),
)
def test_client_against_a_scripted_garbage_server(
    messages: list[bytes], cuts: list[int], actions: list[str], transport: str, credentials: bool
) -> None:
    user = "admin" if credentials else None
    client = RtspClient(
        f"rtsp://admin:{PASSWORD}@h/s",
        username=user,
        password=PASSWORD if credentials else None,
        transport=transport,  # type: ignore[arg-type]
        cnonce=lambda: "c",
    )
    client.start()
    client.data_to_send()
    actions = actions + ["none"] * 20
    try:
        for i, chunk in enumerate(chunked(b"".join(messages), cuts)):
            for event in client.receive_data(chunk):
                if isinstance(event, Described) and event.tracks:
                    ports = [(5000 + 2 * n, 5001 + 2 * n) for n in range(len(event.tracks))]
                    client.setup(event.tracks, ports if transport == "udp" else None)
                if isinstance(event, Failed):
                    assert PASSWORD not in event.reason
            action = actions[i]
            if action == "keepalive":
                client.keepalive()
            elif action == "teardown":
                client.teardown()
            elif action == "interleaved":
                client.send_interleaved(1, b"rr")
            out = client.data_to_send()
            assert PASSWORD.encode() not in out
    except RtspProtocolError:
        pass


@FAST
@given(st.binary(max_size=3000), st.lists(st.integers(min_value=0), max_size=10))
def test_client_on_random_bytes(data: bytes, cuts: list[int]) -> None:
    client = RtspClient("rtsp://h/s", cnonce=lambda: "c")
    client.start()
    try:
        for chunk in chunked(data, cuts):
            client.receive_data(chunk)
    except RtspProtocolError:
        pass


def valid_answers() -> list[bytes]:
    """A camera's answers to OPTIONS, DESCRIBE, SETUP x2 and PLAY (CSeq 1..5), RTP before PLAY's."""
    return [
        response(1, 200, "OK", [("Public", "OPTIONS, DESCRIBE, SETUP, PLAY, GET_PARAMETER")]),
        response(2, 200, "OK", [("Content-Base", "rtsp://h/s/")], SDP.encode()),
        response(3, 200, "OK", [("Session", "ABCD;timeout=30"), ("Transport", "RTP/AVP/TCP;interleaved=0-1")]),
        frame(0, b"\x80\x60rtp") + response(4, 200, "OK", [("Session", "ABCD"), ("Transport", "RTP/AVP/TCP")]),
        frame(2, b"early") + response(5, 200, "OK", [("RTP-Info", "url=trackID=1;seq=1;rtptime=2")]) + frame(0, b"x"),
    ]


MUTATION = st.tuples(
    st.integers(min_value=0), st.sampled_from(["flip", "drop", "insert", "cut"]), st.binary(max_size=4)
)


def mutate(data: bytes, mutations: list[tuple[int, str, bytes]]) -> bytes:
    for position, kind, extra in mutations:
        if not data:
            break
        at = position % len(data)
        if kind == "flip":
            data = data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]
        elif kind == "drop":
            data = data[:at] + data[at + 1 :]
        elif kind == "insert":
            data = data[:at] + extra + data[at:]
        else:
            data = data[:at]
    return data


@FAST
@given(
    st.lists(st.lists(MUTATION, max_size=3), min_size=5, max_size=5),
    st.lists(st.integers(min_value=0), max_size=4),
)
def test_client_on_a_mutated_valid_session(mutations: list[list[tuple[int, str, bytes]]], cuts: list[int]) -> None:
    client = RtspClient("rtsp://h/s", cnonce=lambda: "c")
    client.start()
    try:
        for answer, changes in zip(valid_answers(), mutations, strict=True):
            for chunk in chunked(mutate(answer, changes), cuts):
                for event in client.receive_data(chunk):
                    if isinstance(event, Described):
                        client.setup(event.tracks)
            client.keepalive()
            client.data_to_send()
    except RtspProtocolError:
        pass


def test_the_unmutated_session_plays() -> None:
    client = RtspClient("rtsp://h/s", cnonce=lambda: "c")
    client.start()
    seen = []
    for answer in valid_answers():
        for event in client.receive_data(answer):
            seen.append(type(event).__name__)
            if isinstance(event, Described):
                client.setup(event.tracks)
    assert seen == [
        "Described",
        "TrackReady",
        "InterleavedData",
        "TrackReady",
        "InterleavedData",
        "Playing",
        "InterleavedData",
    ]
