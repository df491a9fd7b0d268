"""RtspClient against a scripted camera: the dialogue, auth, failures and field quirks."""

from __future__ import annotations

import base64

import pytest

from services.edge.core.rtsp import (
    ClientState,
    Described,
    Failed,
    InterleavedData,
    InterleavedFrame,
    KeepaliveAnswered,
    Playing,
    RtspClient,
    RtspEvent,
    RtspProtocolError,
    RtspRequest,
    RtspResponse,
    Track,
    TrackReady,
)

from .camera import SDP, URL, Camera, frame, new_client, response

BASE = URL + "/"
TRACK1 = BASE + "trackID=1"
TRACK2 = BASE + "trackID=2"


def play_tcp(client: RtspClient, camera: Camera) -> tuple[list[TrackReady], Playing]:
    """Describe, SETUP both tracks, PLAY; return the TrackReady events and Playing."""
    described = camera.describe()
    client.setup(described.tracks)
    ready: list[TrackReady] = []
    for i in range(len(described.tracks)):
        setup = camera.request()
        transport = f"RTP/AVP/TCP;unicast;interleaved={2 * i}-{2 * i + 1}"
        (event,) = camera.answer(setup, headers=[("Session", "12345678;timeout=30"), ("Transport", transport)])
        assert isinstance(event, TrackReady)
        ready.append(event)
    play = camera.request()
    (playing,) = camera.answer(play, headers=[("Session", "12345678"), ("RTP-Info", f"url={TRACK1};seq=1;rtptime=2")])
    assert isinstance(playing, Playing)
    return ready, playing


# ---------------------------------------------------------------------------- the dialogue


def test_full_tcp_session() -> None:
    client, camera = new_client(user_agent="Mediaplane/1.2")
    options = camera.request()
    assert (options.method, options.url, options.cseq) == ("OPTIONS", URL, 1)
    assert options.get("User-Agent") == "Mediaplane/1.2" and options.get("Session") is None
    assert client.state is ClientState.OPTIONS
    public = [("Public", "OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN, GET_PARAMETER")]
    assert camera.answer(options, headers=public) == []
    describe = camera.request()
    assert (describe.method, describe.url, describe.cseq, describe.get("Accept")) == (
        "DESCRIBE",
        URL,
        2,
        "application/sdp",
    )
    (described,) = camera.answer(describe, headers=[("Content-Base", BASE)], body=SDP.encode())
    assert isinstance(described, Described) and described.base_url == BASE
    video, audio = described.tracks
    assert video == Track(
        0,
        "video",
        96,
        "H264",
        90000,
        None,
        {
            "packetization-mode": "1",
            "profile-level-id": "640028",
            "sprop-parameter-sets": "Z2QAKKzZQHgCJ+WEAAADAAQAAAMAyDxgxlg=,aOvjyyLA",
        },
        TRACK1,
    )
    assert (audio.index, audio.media, audio.encoding, audio.clock_rate, audio.channels) == (
        1,
        "audio",
        "MPEG4-GENERIC",
        48000,
        2,
    )
    assert audio.fmtp["sizelength"] == "13" and audio.control_url == TRACK2
    assert client.state.value == "described"

    client.setup([video, audio])
    setup1 = camera.request()
    assert (setup1.method, setup1.url) == ("SETUP", TRACK1)
    assert setup1.get("Transport") == "RTP/AVP/TCP;unicast;interleaved=0-1"
    assert setup1.get("Session") is None and setup1.get("Require") is None
    (ready1,) = camera.answer(
        setup1,
        headers=[
            ("Session", "12345678;timeout=30"),
            ("Transport", "RTP/AVP/TCP;unicast;interleaved=0-1;ssrc=1A2B3C4D"),
        ],
    )
    assert ready1 == TrackReady(video, (0, 1), None, None, 0x1A2B3C4D)
    setup2 = camera.request()
    assert (setup2.url, setup2.get("Session"), setup2.get("Require")) == (TRACK2, "12345678", None)
    assert setup2.get("Transport") == "RTP/AVP/TCP;unicast;interleaved=2-3"
    (ready2,) = camera.answer(setup2, headers=[("Session", "12345678"), ("Transport", "RTP/AVP/TCP;interleaved=2-3")])
    assert ready2 == TrackReady(audio, (2, 3), None, None, None)

    play = camera.request()
    assert (play.method, play.url, play.get("Session"), play.get("Range")) == ("PLAY", BASE, "12345678", "npt=0.000-")
    rtp_info = "url=trackID=1;seq=4660;rtptime=305419896,url=rtsp://10.0.0.9/Streaming/Channels/101/trackID=2;seq=7"
    (playing,) = camera.answer(play, headers=[("Session", "12345678"), ("RTP-Info", rtp_info)])
    assert playing == Playing({TRACK1: (4660, 305419896), TRACK2: (7, None)}, 30.0)
    assert client.state.value == "playing" and client.session_timeout == 30.0 and client.session_id == "12345678"

    client.keepalive()
    keepalive = camera.request()
    assert (keepalive.method, keepalive.url, keepalive.get("Session")) == ("GET_PARAMETER", BASE, "12345678")
    assert camera.answer(keepalive) == [KeepaliveAnswered()]

    client.send_interleaved(1, b"rtcp-rr")
    assert camera.take() == [InterleavedFrame(1, b"rtcp-rr")]

    client.teardown()
    teardown = camera.request()
    assert (teardown.method, teardown.url, teardown.get("Session")) == ("TEARDOWN", BASE, "12345678")
    assert client.state.value == "closed"
    assert camera.answer(teardown) == []
    client.teardown()
    assert camera.take() == []
    cseqs = [m.cseq for m in camera.sent if isinstance(m, RtspRequest)]
    assert cseqs == list(range(1, len(cseqs) + 1))


def test_udp_transport() -> None:
    client, camera = new_client(transport="udp")
    described = camera.describe()
    client.setup(described.tracks[:1], [(50000, 50001)])
    setup = camera.request()
    assert setup.get("Transport") == "RTP/AVP;unicast;client_port=50000-50001"
    transport = "RTP/AVP;unicast;client_port=50000-50001;server_port=6970-6971;source=192.168.1.64;ssrc=0000ABCD"
    (ready,) = camera.answer(setup, headers=[("Session", "s1"), ("Transport", transport)])
    assert ready == TrackReady(described.tracks[0], None, (6970, 6971), "192.168.1.64", 0xABCD)
    play = camera.request()
    assert play.method == "PLAY"
    (playing,) = camera.answer(play)
    assert playing == Playing({}, 60.0)


def test_setup_misuse_is_an_error() -> None:
    client, camera = new_client(transport="udp")
    with pytest.raises(RuntimeError):
        client.setup([])
    described = camera.describe()
    with pytest.raises(ValueError):
        client.setup(described.tracks)  # UDP without ports
    with pytest.raises(ValueError):
        client.setup([])
    with pytest.raises(RuntimeError):
        client.start()


def test_content_location_then_request_url_as_base() -> None:
    _, camera = new_client()
    described = camera.describe(headers=[("Content-Location", "rtsp://cam/other/")])
    assert described.base_url == "rtsp://cam/other/" and described.tracks[0].control_url == "rtsp://cam/other/trackID=1"
    _, camera = new_client()
    described = camera.describe(headers=[])
    assert described.base_url == URL  # no trailing slash: still joined with one "/"
    assert [t.control_url for t in described.tracks] == [URL + "/trackID=1", URL + "/trackID=2"]


def test_session_level_control_is_the_play_url() -> None:
    client, camera = new_client()
    sdp = SDP.replace("a=control:*", "a=control:rtsp://cam/aggregate")
    described = camera.describe(sdp)
    client.setup(described.tracks[:1])
    setup = camera.request()
    camera.answer(setup, headers=[("Session", "1"), ("Transport", "RTP/AVP/TCP;interleaved=0-1")])
    assert camera.request().url == "rtsp://cam/aggregate"


# ---------------------------------------------------------------------------- camera quirks


def test_sdp_without_o_line_and_broken_sprop() -> None:
    _client, camera = new_client()
    sdp = "m=video 0 RTP/AVP 96\na=rtpmap:96 H264/90000\na=fmtp:96 sprop-parameter-sets=%%%broken,\na=control:track1\n"
    described = camera.describe(sdp)
    (track,) = described.tracks
    assert track.fmtp == {"sprop-parameter-sets": "%%%broken,"} and described.description.origin is None


def test_sdp_without_sprop_and_with_a_static_payload_type() -> None:
    _client, camera = new_client()
    described = camera.describe("m=video 0 RTP/AVP 26\nm=audio 0 RTP/AVP 0\n")
    assert [(t.encoding, t.clock_rate, t.channels) for t in described.tracks] == [
        ("JPEG", 90000, None),
        ("PCMU", 8000, 1),
    ]
    assert [t.control_url for t in described.tracks] == [BASE, BASE]


def test_setup_reply_without_interleaved_uses_the_requested_channels() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks)
    for expected in ((0, 1), (2, 3)):
        setup = camera.request()
        (ready,) = camera.answer(setup, headers=[("Session", "ABC"), ("Transport", "RTP/AVP/TCP;unicast")])
        assert isinstance(ready, TrackReady) and ready.interleaved == expected


def test_session_id_format_with_timeout() -> None:
    client, camera = new_client()
    _ready, playing = play_tcp(client, camera)
    assert playing.session_timeout == 30.0
    client.keepalive()
    assert camera.request().get("Session") == "12345678"


def test_session_without_timeout_and_odd_spacing() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks[:1])
    camera.answer(camera.request(), headers=[("Session", " DEADBEEF ; timeout = 45 ")])
    assert camera.request().get("Session") == "DEADBEEF" and client.session_timeout == 45.0


def test_get_parameter_answered_501_then_options() -> None:
    client, camera = new_client()
    play_tcp(client, camera)
    client.keepalive()
    first = camera.request()
    assert first.method == "GET_PARAMETER"
    assert camera.answer(first, 501, "Not Implemented") == [KeepaliveAnswered()]
    assert client.state is ClientState.PLAYING
    client.keepalive()
    second = camera.request()
    assert (second.method, second.get("Session")) == ("OPTIONS", "12345678")
    assert camera.answer(second) == [KeepaliveAnswered()]


def test_options_keepalive_when_public_lacks_get_parameter() -> None:
    client, camera = new_client()
    camera.answer(camera.request(), headers=[("Public", "OPTIONS, DESCRIBE, SETUP, PLAY")])
    assert client.public_methods == frozenset({"OPTIONS", "DESCRIBE", "SETUP", "PLAY"})
    (described,) = camera.answer(camera.request(), headers=[("Content-Base", BASE)], body=SDP.encode())
    assert isinstance(described, Described)
    client.keepalive()
    assert camera.take() == []  # no session yet: nothing to keep alive
    client.setup(described.tracks[:1])
    camera.answer(camera.request(), headers=[("Session", "K")])
    client.keepalive()  # PLAY is still pending: keepalives may interleave with it
    play, keepalive = camera.requests()
    assert (play.method, keepalive.method, keepalive.get("Session")) == ("PLAY", "OPTIONS", "K")
    assert camera.answer(keepalive) == [KeepaliveAnswered()]
    assert camera.answer(play) == [Playing({}, 60.0)]


def test_server_requests_are_answered() -> None:
    client, camera = new_client()
    play_tcp(client, camera)
    data = (
        b"OPTIONS rtsp://192.168.1.64/ RTSP/1.0\r\nCSeq: 99\r\n\r\n"
        + frame(0, b"rtp")
        + b"GET_PARAMETER rtsp://192.168.1.64/ RTSP/1.0\nCSeq: 100\nSession: 12345678\n\n"
        + b"ANNOUNCE rtsp://192.168.1.64/ RTSP/1.0\r\nCSeq: 101\r\nContent-Length: 3\r\n\r\nv=0"
    )
    assert client.receive_data(data) == [InterleavedData(0, b"rtp")]
    answers = camera.take()
    assert [(m.status, m.cseq) for m in answers if isinstance(m, RtspResponse)] == [(200, 99), (200, 100), (501, 101)]
    assert isinstance(answers[1], RtspResponse) and answers[1].get("Session") == "12345678"
    assert client.server_requests == 3 and client.state is ClientState.PLAYING


def test_rtp_before_and_around_the_play_reply() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks[:1])
    camera.answer(camera.request(), headers=[("Session", "1"), ("Transport", "RTP/AVP/TCP;interleaved=0-1")])
    play = camera.request()
    events = camera.answer(play, before=frame(0, b"a") + frame(1, b"b"), after=frame(0, b"c"))
    assert events == [
        InterleavedData(0, b"a"),
        InterleavedData(1, b"b"),
        Playing({}, 60.0),
        InterleavedData(0, b"c"),
    ]


def test_the_whole_session_one_byte_at_a_time() -> None:
    client, camera = new_client()
    options = camera.request()
    assert camera.answer(options, headers=[("Public", "GET_PARAMETER")], bytewise=True) == []
    describe = camera.request()
    (described,) = camera.answer(describe, headers=[("Content-Base", BASE)], body=SDP.encode(), bytewise=True)
    assert isinstance(described, Described) and len(described.tracks) == 2
    client.setup(described.tracks)
    for i in range(2):
        setup = camera.request()
        headers = [("Session", "77;timeout=20"), ("Transport", f"RTP/AVP/TCP;interleaved={2 * i}-{2 * i + 1}")]
        events = camera.answer(setup, headers=headers, before=frame(9, b"early"), bytewise=True)
        assert [type(e) for e in events] == [InterleavedData, TrackReady]
    play = camera.request()
    events = camera.answer(
        play, headers=[("RTP-Info", "url=trackID=1;seq=5")], after=frame(0, b"x" * 300), bytewise=True
    )
    assert events == [Playing({TRACK1: (5, None)}, 20.0), InterleavedData(0, b"x" * 300)]


def test_stray_responses_are_ignored() -> None:
    client, camera = new_client()
    options = camera.request()
    assert client.receive_data(response(42) + response(None, 200) + response(7, 404, "Not Found")) == []
    # the CSeq-less answer was taken as the answer to OPTIONS (the oldest request)
    assert client.stray_responses == 1 + 1
    describe = camera.request()
    assert describe.method == "DESCRIBE" and options.cseq == 1


def test_1xx_is_skipped() -> None:
    _client, camera = new_client()
    options = camera.request()
    assert camera.answer(options, 100, "Continue") == []
    assert camera.take() == []
    camera.answer(options)
    assert camera.request().method == "DESCRIBE"


def test_options_error_still_describes() -> None:
    _client, camera = new_client()
    camera.answer(camera.request(), 404, "Not Found")
    describe = camera.request()
    assert describe.method == "DESCRIBE"


def test_rtp_info_matching() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks)
    for i in range(2):
        camera.answer(camera.request(), headers=[("Session", "1"), ("Transport", f"RTP/AVP/TCP;interleaved={2 * i}")])
    play = camera.request()
    rtp_info = "url=rtsp://203.0.113.5:8554/Streaming/Channels/101/trackID=2;seq=1, url=/unknown/trackID=9;seq=2"
    (playing,) = camera.answer(play, headers=[("RTP-Info", rtp_info)])
    assert playing == Playing({TRACK2: (1, None), "/unknown/trackID=9": (2, None)}, 60.0)


def test_single_rtp_info_entry_for_a_single_track() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks[:1])
    camera.answer(camera.request(), headers=[("Session", "1")])
    (playing,) = camera.answer(camera.request(), headers=[("RTP-Info", f"url={URL};seq=10;rtptime=20")])
    assert playing == Playing({TRACK1: (10, 20)}, 60.0)


def test_teardown_without_a_session_is_a_noop() -> None:
    client, camera = new_client()
    camera.take()
    client.teardown()
    client.keepalive()
    assert camera.take() == []


def test_teardown_after_failure_frees_the_session() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks[:1])
    camera.answer(camera.request(), headers=[("Session", "S")])
    (failed,) = camera.answer(camera.request(), 500, "Internal Server Error")
    assert failed == Failed("camera error on PLAY (500 Internal Server Error)", 500, False)
    client.keepalive()
    client.teardown()
    teardown = camera.request()
    assert (teardown.method, teardown.get("Session")) == ("TEARDOWN", "S")


def test_framing_error_sticks() -> None:
    client, _camera = new_client()
    with pytest.raises(RtspProtocolError):
        client.receive_data(b"RTSP/1.0 200 OK\r\nContent-Length: x\r\n\r\n")
    with pytest.raises(RtspProtocolError):
        client.receive_data(response(1))
    client.teardown()  # no session: nothing; but still callable


# ---------------------------------------------------------------------------- failures


def failed(events: list[RtspEvent]) -> Failed:
    (event,) = events
    assert isinstance(event, Failed), event
    return event


@pytest.mark.parametrize(
    ("status", "reason", "auth", "text"),
    [
        (404, "Not Found", False, "stream not found (404 Not Found)"),
        (403, "Forbidden", True, "access denied (403 Forbidden)"),
        (405, "Method Not Allowed", False, "DESCRIBE refused (405 Method Not Allowed)"),
        (503, "Service Unavailable", False, "camera error on DESCRIBE (503 Service Unavailable)"),
        (599, "whatever", False, "camera error on DESCRIBE (status 599)"),
    ],
)
def test_describe_failures(status: int, reason: str, auth: bool, text: str) -> None:
    client, camera = new_client()
    camera.answer(camera.request())
    event = failed(camera.answer(camera.request(), status, reason))
    assert event == Failed(text, status, auth)
    assert client.state is ClientState.FAILED
    assert camera.answer(RtspRequest("X", "*", "1.0", (("CSeq", "3"),))) == []  # later answers ignored


@pytest.mark.parametrize("status", [301, 302])
def test_redirect_is_not_followed_and_location_not_echoed(status: int) -> None:
    _client, camera = new_client()
    camera.answer(camera.request())
    location = "rtsp://secret-host.example/secret-path"
    event = failed(camera.answer(camera.request(), status, "Moved", headers=[("Location", location)]))
    assert event.reason.startswith("redirected to another server, not followed") and event.status == status
    assert "secret" not in event.reason


@pytest.mark.parametrize(("transport", "hint"), [("tcp", "try transport udp"), ("udp", "try transport tcp")])
def test_unsupported_transport(transport: str, hint: str) -> None:
    client, camera = new_client(transport=transport)
    described = camera.describe()
    client.setup(described.tracks[:1], [(5000, 5001)] if transport == "udp" else None)
    event = failed(camera.answer(camera.request(), 461, "Unsupported transport"))
    assert event.status == 461 and "does not support RTP over" in event.reason and hint in event.reason


def test_session_not_found() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks[:1])
    camera.answer(camera.request(), headers=[("Session", "1")])
    assert failed(camera.answer(camera.request(), 454, "Session Not Found")).status == 454


@pytest.mark.parametrize("body", [b"", b"not an sdp at all", b"v=0\r\ns=x\r\n"])
def test_unusable_sdp(body: bytes) -> None:
    _client, camera = new_client()
    camera.answer(camera.request())
    event = failed(camera.answer(camera.request(), body=body))
    assert "no usable SDP" in event.reason and event.status is None


def test_sdp_with_only_non_rtp_media() -> None:
    _client, camera = new_client()
    camera.answer(camera.request())
    event = failed(camera.answer(camera.request(), body=b"m=application 0 udp wb\r\n"))
    assert event.reason == "the camera describes no RTP media"


# ---------------------------------------------------------------------------- authentication

PASSWORD = "s3cr3t-Pa55w0rd"
DIGEST_MD5 = 'Digest realm="IP Camera", nonce="n0nce1", qop="auth"'
DIGEST_SHA = 'Digest realm="IP Camera", nonce="n0nce2", qop="auth", algorithm=SHA-256'


def test_basic_auth_then_proactive() -> None:
    _client, camera = new_client(username="admin", password="open sesame")
    options = camera.request()
    assert options.get("Authorization") is None
    assert camera.answer(options, 401, "Unauthorized", headers=[("WWW-Authenticate", 'Basic realm="cam"')]) == []
    retry = camera.request()
    assert (retry.method, retry.cseq, retry.get("Authorization")) == ("OPTIONS", 2, "Basic YWRtaW46b3BlbiBzZXNhbWU=")
    camera.answer(retry)
    assert camera.request().get("Authorization") == "Basic YWRtaW46b3BlbiBzZXNhbWU="


def test_digest_md5_qop_auth_with_nc_counting() -> None:
    client, camera = new_client(username="admin", password=PASSWORD)
    camera.answer(camera.request())  # OPTIONS open to all
    describe = camera.request()
    assert describe.get("Authorization") is None
    camera.answer(describe, 401, "Unauthorized", headers=[("WWW-Authenticate", DIGEST_MD5)])
    retry = camera.request()
    authorization = retry.get("Authorization") or ""
    assert authorization.startswith('Digest username="admin", realm="IP Camera", nonce="n0nce1", ')
    assert f'uri="{URL}"' in authorization  # the absolute request URL, as sent
    assert "nc=00000001" in authorization and 'cnonce="0a4f113b"' in authorization and "qop=auth" in authorization
    assert "algorithm" not in authorization  # not echoed when the camera did not name one
    (described,) = camera.answer(retry, headers=[("Content-Base", BASE)], body=SDP.encode())
    assert isinstance(described, Described)
    client.setup(described.tracks[:1])
    setup = camera.request()
    assert "nc=00000002" in (setup.get("Authorization") or "") and f'uri="{TRACK1}"' in (
        setup.get("Authorization") or ""
    )


def test_digest_md5_without_qop() -> None:
    _client, camera = new_client(username="admin", password=PASSWORD)
    challenge = 'Digest realm="Streaming Server", nonce="abcdef"'
    camera.answer(camera.request(), 401, "Unauthorized", headers=[("WWW-Authenticate", challenge)])
    authorization = camera.request().get("Authorization") or ""
    assert authorization.startswith("Digest ") and "qop" not in authorization and "nc=" not in authorization


def test_digest_sha256_preferred_over_md5_and_basic() -> None:
    _client, camera = new_client(username="admin", password=PASSWORD)
    challenges = [("WWW-Authenticate", 'Basic realm="x"'), ("WWW-Authenticate", DIGEST_MD5)]
    challenges.append(("WWW-Authenticate", DIGEST_SHA))
    camera.answer(camera.request(), 401, "Unauthorized", headers=challenges)
    authorization = camera.request().get("Authorization") or ""
    assert 'nonce="n0nce2"' in authorization and "algorithm=SHA-256" in authorization


def test_stale_nonce_is_retried_without_failing() -> None:
    _client, camera = new_client(username="admin", password=PASSWORD)
    camera.answer(camera.request(), 401, "Unauthorized", headers=[("WWW-Authenticate", DIGEST_MD5)])
    retry = camera.request()
    stale = 'Digest realm="IP Camera", nonce="fresh", qop="auth", stale=TRUE'
    assert camera.answer(retry, 401, "Unauthorized", headers=[("WWW-Authenticate", stale)]) == []
    again = camera.request()
    assert 'nonce="fresh"' in (again.get("Authorization") or "") and "nc=00000001" in (again.get("Authorization") or "")
    camera.answer(again)
    assert camera.request().method == "DESCRIBE"


def test_a_rotating_nonce_on_a_proactive_request_is_answered_again() -> None:
    _client, camera = new_client(username="admin", password=PASSWORD)
    camera.answer(camera.request(), 401, "Unauthorized", headers=[("WWW-Authenticate", DIGEST_MD5)])
    camera.answer(camera.request())
    describe = camera.request()  # sent with the old nonce, up front
    rotated = 'Digest realm="IP Camera", nonce="n0nce9", qop="auth"'
    assert camera.answer(describe, 401, "Unauthorized", headers=[("WWW-Authenticate", rotated)]) == []
    assert 'nonce="n0nce9"' in (camera.request().get("Authorization") or "")


def test_wrong_credentials_fail_with_auth() -> None:
    url = f"rtsp://admin:{PASSWORD}@192.168.1.64:554/Streaming/Channels/101"
    _client, camera = new_client(url)
    camera.answer(camera.request(), 401, "Unauthorized", headers=[("WWW-Authenticate", DIGEST_MD5)])
    event = failed(camera.answer(camera.request(), 401, "Unauthorized", headers=[("WWW-Authenticate", DIGEST_MD5)]))
    assert event == Failed("authentication failed (401 Unauthorized)", 401, True)


def test_no_credentials_configured() -> None:
    _client, camera = new_client()
    event = failed(camera.answer(camera.request(), 401, "Unauthorized", headers=[("WWW-Authenticate", DIGEST_MD5)]))
    assert event.auth and event.status == 401 and "no credentials" in event.reason


def test_no_supported_scheme() -> None:
    _client, camera = new_client(username="u", password=PASSWORD)
    headers = [
        ("WWW-Authenticate", "Negotiate"),
        ("WWW-Authenticate", 'Digest realm="r", nonce="n", algorithm=SHA-512-256'),
    ]
    event = failed(camera.answer(camera.request(), 401, "Unauthorized", headers=headers))
    assert event.status == 401 and event.auth and "no supported authentication scheme" in event.reason
    assert "digest" in event.reason and "negotiate" in event.reason


def test_userinfo_is_stripped_and_used_as_credentials() -> None:
    client, camera = new_client(f"rtsp://admin:{PASSWORD.replace('-', '%2D')}@cam:8554/live?ch=1")
    assert client.display_url == "rtsp://cam:8554/live?ch=1"
    assert repr(client).count(PASSWORD) == 0
    options = camera.request()
    assert options.url == "rtsp://cam:8554/live?ch=1"
    camera.answer(options, 401, "Unauthorized", headers=[("WWW-Authenticate", 'Basic realm="x"')])
    retry = camera.request()
    assert base64.b64decode((retry.get("Authorization") or "").split()[1]).decode() == f"admin:{PASSWORD}"


def test_explicit_credentials_win_over_userinfo() -> None:
    _client, camera = new_client("rtsp://old:oldpass@cam/live", username="new", password="newpass")
    camera.answer(camera.request(), 401, "Unauthorized", headers=[("WWW-Authenticate", 'Basic realm="x"')])
    assert camera.request().get("Authorization") == "Basic bmV3Om5ld3Bhc3M="  # new:newpass


SCENARIOS: list[tuple[int, str, list[tuple[str, str]]]] = [
    (401, "Unauthorized", [("WWW-Authenticate", 'Basic realm="x"')]),
    (401, f"Unauthorized {PASSWORD}", [("WWW-Authenticate", "Negotiate")]),
    (403, f"Forbidden for admin:{PASSWORD}", []),
    (404, f"rtsp://admin:{PASSWORD}@cam/ not found", []),
    (302, "Found", [("Location", f"rtsp://admin:{PASSWORD}@elsewhere/")]),
    (500, PASSWORD, []),
    (461, PASSWORD, []),
]


@pytest.mark.parametrize(("status", "reason", "headers"), SCENARIOS)
def test_failure_reasons_never_hold_credentials(status: int, reason: str, headers: list[tuple[str, str]]) -> None:
    for username, password in ((None, None), ("admin", PASSWORD)):
        _client, camera = new_client(f"rtsp://admin:{PASSWORD}@cam/live", username=username, password=password)
        events: list[RtspEvent] = []
        for _ in range(3):  # the first answer, and the answer to a retry with credentials
            for request in camera.requests():
                events += camera.answer(request, status, reason, headers)
        reasons = [e.reason for e in events if isinstance(e, Failed)]
        assert reasons, events
        for text in reasons:
            assert PASSWORD not in text and f"admin:{PASSWORD}" not in text and "@cam" not in text


# ---------------------------------------------------------------------------- more quirks


def test_content_base_userinfo_is_dropped_and_a_relative_one_resolved() -> None:
    _, camera = new_client()
    described = camera.describe(headers=[("Content-Base", f"rtsp://admin:{PASSWORD}@cam/live/")])
    assert described.base_url == "rtsp://cam/live/" and PASSWORD not in described.tracks[0].control_url
    _, camera = new_client()
    described = camera.describe(headers=[("Content-Base", "/other/path/")])
    assert described.base_url == "rtsp://192.168.1.64:554/other/path/"


def test_setup_reply_without_session_still_plays() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks)
    camera.answer(camera.request(), headers=[("Transport", "RTP/AVP/TCP;interleaved=0-1")])
    second = camera.request()
    assert second.get("Session") is None
    camera.answer(second)
    play = camera.request()
    assert play.method == "PLAY" and play.get("Session") is None
    assert camera.answer(play) == [Playing({}, 60.0)]
    client.teardown()  # no session id: nothing to tear down
    assert camera.take() == []


def test_lf_only_answers_without_reason_phrases() -> None:
    client, camera = new_client()
    options = camera.request()
    client.receive_data(b"RTSP/1.0 200\nCSeq: 1\nPublic: DESCRIBE, SETUP\n\n")
    describe = camera.request()
    body = SDP.replace("\r\n", "\n").encode()
    data = b"RTSP/1.0 200\nCSeq: %d\nContent-Length: %d\n\n" % (describe.cseq or 0, len(body)) + body
    (described,) = client.receive_data(data)
    assert isinstance(described, Described) and len(described.tracks) == 2 and options.cseq == 1


def test_proxy_authentication_is_not_supported() -> None:
    _, camera = new_client()
    camera.answer(camera.request())
    event = failed(camera.answer(camera.request(), 407, "Proxy Authentication Required"))
    assert event.auth and event.status == 407 and "proxy authentication" in event.reason


def test_play_reply_updates_the_session_timeout() -> None:
    client, camera = new_client()
    described = camera.describe()
    client.setup(described.tracks[:1])
    camera.answer(camera.request(), headers=[("Session", "S1")])
    (playing,) = camera.answer(camera.request(), headers=[("Session", "S1;timeout=12")])
    assert playing == Playing({}, 12.0) and client.session_timeout == 12.0
