"""The relay ↔ edge control protocol core (interop.md 8, 13): framing, messages, tokens, edge session."""

from __future__ import annotations

import ast
import json
import uuid
from pathlib import Path

import pytest

from appliance.protocol.errors import ErrorKind, LocalProtocolError, ProtocolError
from appliance.protocol.session import FrameDropped
from appliance.relayproto import (
    BIND_AUTH_FAILED,
    CONNECTION_LOST,
    MAX_FRAME_BYTES,
    MESSAGE_MODELS,
    PROTOCOL_VERSION,
    BindAuthorization,
    ConnectionState,
    EdgeRelaySession,
    FrameDecoder,
    FrameTooLarge,
    HelloAcknowledged,
    HelloMessage,
    PeerAuthMessage,
    PongReceived,
    StreamHeader,
    TruncatedFrame,
    TunnelBindMessage,
    TunnelDown,
    TunnelReady,
    TunnelState,
    TunnelWaiting,
    bind_allowed,
    compute_bind_token,
    decode,
    decode_datagram,
    decode_stream_header,
    encode,
    encode_datagram,
    encode_frame,
    encode_stream_header,
    peer_auth_token,
    verify_bind_token,
    verify_peer_auth_token,
)

SECRET = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
TUNNEL = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
INGRESS_TOKEN = "be5aeadc2699dec87e429f12981a5bd977abb0afd853abcdeb1a52457b6567a6"
EGRESS_TOKEN = "a8b7fbafbd4eadeb3d0e61bdb8dbc292c53349c707ac188ce78a6415db1cdb41"
PSK = "correct horse battery staple"
PEER_TOKEN = (
    "NmYxYzJiM2EtNGQ1ZS00ZjYwLThhN2ItOWMwZDFlMmYzYTRiOjA4NmQzNDQ4ZjZhZjllOGJmN2Y0MTZkYjIzNDFjN2E3ZTYwY2MzODBj"
    "NTE5YzY5MjE3ZjgyNWIwNTQyNDAyODA="
)


def frame(document: object) -> bytes:
    body = json.dumps(document).encode()
    return len(body).to_bytes(4, "big") + body


# --------------------------------------------------------------------------- test vectors (8.3, 8.4)
def test_bind_token_vectors() -> None:
    assert compute_bind_token(SECRET, TUNNEL, "ingress") == INGRESS_TOKEN
    assert compute_bind_token(SECRET, TUNNEL, "egress") == EGRESS_TOKEN
    auth = BindAuthorization.from_secret(SECRET, TUNNEL)
    assert (auth.ingress_token, auth.egress_token) == (INGRESS_TOKEN, EGRESS_TOKEN)
    assert INGRESS_TOKEN not in repr(auth)


def test_peer_auth_token_vector() -> None:
    assert peer_auth_token(PSK, TUNNEL) == PEER_TOKEN
    assert verify_peer_auth_token(PSK, TUNNEL, PEER_TOKEN)
    assert not verify_peer_auth_token("wrong", TUNNEL, PEER_TOKEN)
    assert not verify_peer_auth_token(PSK, TUNNEL, None)


def test_secret_is_used_as_ascii_text_not_hex_decoded() -> None:
    import hashlib
    import hmac

    decoded_key = hmac.new(bytes.fromhex(SECRET), f"{TUNNEL}:ingress".encode(), hashlib.sha256).hexdigest()
    assert compute_bind_token(SECRET, TUNNEL, "ingress") != decoded_key
    with pytest.raises(ValueError, match="not ASCII"):
        compute_bind_token("sécret", TUNNEL, "ingress")


def test_verify_bind_token() -> None:
    assert verify_bind_token(SECRET, TUNNEL, "ingress", INGRESS_TOKEN)
    assert not verify_bind_token(SECRET, TUNNEL, "ingress", EGRESS_TOKEN)  # the other direction's
    assert not verify_bind_token(SECRET, TUNNEL, "egress", None)
    assert not verify_bind_token(SECRET, TUNNEL, "egress", "é" * 64)


@pytest.mark.parametrize(
    ("has_entry", "token", "require", "allowed"),
    [
        (True, INGRESS_TOKEN, False, True),
        (True, INGRESS_TOKEN, True, True),
        (True, EGRESS_TOKEN, False, False),
        (True, None, False, False),  # a missing token fails
        (True, "xyz", False, False),
        (False, None, False, True),
        (False, "anything", False, True),
        (False, None, True, False),  # fail-closed
        (False, INGRESS_TOKEN, True, False),
    ],
)
def test_bind_check(has_entry: bool, token: str | None, require: bool, allowed: bool) -> None:
    entry = BindAuthorization.from_secret(SECRET, TUNNEL) if has_entry else None
    assert bind_allowed(entry, "ingress", token, require_bind_auth=require) is allowed


# --------------------------------------------------------------------------- framing (8.1, 13)
def test_frame_round_trip() -> None:
    body = b'{"type":"ping"}'
    data = encode_frame(body)
    assert data == b"\x00\x00\x00\x0f" + body
    assert FrameDecoder().feed(data) == [body]
    assert FrameDecoder().feed(encode_frame(b"")) == [b""]


def test_frames_split_and_merged() -> None:
    bodies = [b'{"type":"ping"}', b'{"type":"pong"}', json.dumps({"type": "x", "pad": "é" * 300}).encode()]
    stream = b"".join(encode_frame(b) for b in bodies)
    for size in (1, 2, 3, 5, 7, 64, len(stream)):
        decoder = FrameDecoder()
        out: list[bytes] = []
        for i in range(0, len(stream), size):
            out.extend(decoder.feed(stream[i : i + size]))
        assert out == bodies, size
        assert decoder.buffered == 0
        decoder.end_of_stream()


def test_truncated_stream() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(b"abcdef")[:-1]) == []
    with pytest.raises(TruncatedFrame):
        decoder.end_of_stream()


def test_oversize_frame_closes_the_connection() -> None:
    decoder = FrameDecoder()
    # Only the prefix: refused before any body is buffered.
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    assert info.value.closes_connection
    assert info.value.kind is ErrorKind.FRAME_TOO_LARGE
    with pytest.raises(FrameTooLarge):  # poisoned: nothing more is used
        decoder.feed(encode_frame(b'{"type":"ping"}'))
    # Exactly 1 MiB is allowed.
    ok = FrameDecoder()
    assert ok.feed(encode_frame(b"x" * MAX_FRAME_BYTES)) == [b"x" * MAX_FRAME_BYTES]
    with pytest.raises(LocalProtocolError):
        encode_frame(b"x" * (MAX_FRAME_BYTES + 1))
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_stream_header_then_raw_bytes() -> None:
    nonce = bytes(range(16))
    header = StreamHeader(tunnel_id=TUNNEL, stream_nonce=nonce.hex())
    data = encode_stream_header(header) + b"raw tcp bytes"
    decoder = FrameDecoder()
    decoder.receive_data(data[:10])
    assert decoder.next_frame() is None
    decoder.receive_data(data[10:])
    body = decoder.next_frame()
    assert body is not None
    parsed = decode_stream_header(body)
    assert parsed == header
    assert parsed.nonce_bytes() == nonce
    assert json.loads(body) == {"tunnel_id": TUNNEL, "stream_type": "tcp", "stream_nonce": nonce.hex()}
    assert decoder.take_remaining() == b"raw tcp bytes"


@pytest.mark.parametrize(
    "document",
    [
        {"tunnel_id": TUNNEL, "stream_type": "udp", "stream_nonce": "00" * 16},
        {"tunnel_id": TUNNEL, "stream_type": "tcp", "stream_nonce": "00" * 15},
        {"tunnel_id": TUNNEL, "stream_type": "tcp", "stream_nonce": "zz" * 16},
        {"stream_type": "tcp", "stream_nonce": "00" * 16},
    ],
)
def test_bad_stream_header(document: dict[str, object]) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_stream_header(json.dumps(document).encode())
    assert info.value.kind is ErrorKind.INVALID


def test_datagram_prefix() -> None:
    data = encode_datagram(TUNNEL, b"payload")
    assert data[:16] == uuid.UUID(TUNNEL).bytes
    assert decode_datagram(data) == (uuid.UUID(TUNNEL), b"payload")
    assert decode_datagram(uuid.UUID(TUNNEL).bytes) == (uuid.UUID(TUNNEL), b"")
    with pytest.raises(ProtocolError):
        decode_datagram(b"short")


# --------------------------------------------------------------------------- messages (8.2, 8.3, 13)
DOC_EXAMPLES: list[dict[str, object]] = [
    {"type": "hello", "protocol_version": 2, "software_version": "0.3.0"},
    {"type": "hello_ack", "protocol_version": 2, "software_version": "0.3.1"},
    {"type": "identify", "edge_id": "node-1"},
    {
        "type": "tunnel_bind",
        "tunnel_id": TUNNEL,
        "direction": "ingress",
        "protocol": "tcp",
        "bind_token": INGRESS_TOKEN,
    },
    {"type": "tunnel_bind", "tunnel_id": TUNNEL, "direction": "egress", "protocol": "udp"},
    {"type": "tunnel_waiting", "tunnel_id": TUNNEL},
    {"type": "tunnel_ready", "tunnel_id": TUNNEL},
    {"type": "tunnel_unbind", "tunnel_id": TUNNEL},
    {"type": "tunnel_down", "tunnel_id": TUNNEL, "reason": "bind authentication failed"},
    {"type": "tunnel_down", "tunnel_id": TUNNEL, "reason": "per-connection tunnel limit exceeded"},
    {"type": "ping"},
    {"type": "pong"},
    {"type": "peer_auth", "tunnel_id": TUNNEL, "token": PEER_TOKEN},
    {"type": "peer_auth_ok", "tunnel_id": TUNNEL},
    {"type": "peer_auth_error", "reason": "bad token"},
]


def test_examples_cover_every_type() -> None:
    assert {d["type"] for d in DOC_EXAMPLES} == set(MESSAGE_MODELS)


@pytest.mark.parametrize("document", DOC_EXAMPLES, ids=lambda d: str(d["type"]))
def test_doc_examples_round_trip(document: dict[str, object]) -> None:
    message = decode(json.dumps(document).encode())
    assert type(message) is MESSAGE_MODELS[str(document["type"])]
    data = encode(message)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert json.loads(data[4:]) == document  # flat JSON; an absent bind_token stays absent
    assert data[4:] == json.dumps(document, separators=(",", ":")).encode()  # compact, doc's key order


def test_tokens_are_hidden_in_repr_but_sent() -> None:
    bind = TunnelBindMessage(tunnel_id=TUNNEL, direction="ingress", protocol="tcp", bind_token=INGRESS_TOKEN)
    assert INGRESS_TOKEN not in repr(bind)
    assert bind.token() == INGRESS_TOKEN
    assert INGRESS_TOKEN.encode() in encode(bind)
    peer = PeerAuthMessage(tunnel_id=TUNNEL, token=PEER_TOKEN)
    assert PEER_TOKEN not in repr(peer)


def test_hello_defaults_to_version_2() -> None:
    assert PROTOCOL_VERSION == 2
    assert json.loads(encode(HelloMessage(software_version="0.3.0"))[4:]) == {
        "type": "hello",
        "protocol_version": 2,
        "software_version": "0.3.0",
    }


def test_extra_keys_are_ignored() -> None:
    message = decode(b'{"type":"tunnel_ready","tunnel_id":"t","new_field":1}')
    assert message.model_dump() == {"type": "tunnel_ready", "tunnel_id": "t"}


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"{not json", ErrorKind.MALFORMED),
        (b"\xff\xfe", ErrorKind.MALFORMED),
        (b"[1, 2]", ErrorKind.MALFORMED),
        (b'{"tunnel_id": "t"}', ErrorKind.MALFORMED),
        (b'{"type": 7}', ErrorKind.MALFORMED),
        (b"[" * 100 + b"]" * 100, ErrorKind.MALFORMED),
        (b'{"type": "tunnel_teleport", "tunnel_id": "t"}', ErrorKind.UNKNOWN_TYPE),
        (b'{"type": "tunnel_bind", "tunnel_id": "t", "direction": "sideways", "protocol": "tcp"}', ErrorKind.INVALID),
        (b'{"type": "hello", "protocol_version": "2", "software_version": "x"}', ErrorKind.INVALID),
        (b'{"type": "tunnel_down", "tunnel_id": "t"}', ErrorKind.INVALID),
    ],
)
def test_bad_frames_are_protocol_errors(body: bytes, kind: ErrorKind) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(body)
    assert info.value.kind is kind


def test_error_text_never_quotes_the_frame() -> None:
    body = json.dumps({"type": "tunnel_bind", "tunnel_id": "t", "direction": "SECRETDIR", "protocol": "tcp"})
    with pytest.raises(ProtocolError) as info:
        decode(body.encode())
    assert "SECRETDIR" not in info.value.message
    assert info.value.__cause__ is None


# --------------------------------------------------------------------------- edge session (8.2)
def relay_frames(*documents: object) -> bytes:
    return b"".join(frame(d) for d in documents)


def sent(data: bytes) -> list[dict[str, object]]:
    return [json.loads(b) for b in FrameDecoder().feed(data)]


def started(edge_id: str | None = "node-1") -> EdgeRelaySession:
    session = EdgeRelaySession(software_version="0.3.0", edge_id=edge_id)
    session.start(now=0.0)
    return session


def test_session_hello_identify_bind_ready() -> None:
    session = EdgeRelaySession(software_version="0.3.0", edge_id="node-1")
    step = session.start(now=100.0)
    assert sent(step.data) == [
        {"type": "hello", "protocol_version": 2, "software_version": "0.3.0"},
        {"type": "identify", "edge_id": "node-1"},
    ]
    assert session.state.value == "hello_sent"
    step = session.receive_data(frame({"type": "hello_ack", "protocol_version": 2, "software_version": "0.3.1"}))
    assert step.events == (HelloAcknowledged(2, "0.3.1"),)
    assert session.state is ConnectionState.OPEN

    step = session.bind(TUNNEL, "ingress", "tcp", INGRESS_TOKEN)
    assert sent(step.data) == [
        {
            "type": "tunnel_bind",
            "tunnel_id": TUNNEL,
            "direction": "ingress",
            "protocol": "tcp",
            "bind_token": INGRESS_TOKEN,
        }
    ]
    assert session.tunnel_state(TUNNEL) is TunnelState.BINDING
    data = relay_frames({"type": "tunnel_waiting", "tunnel_id": TUNNEL}, {"type": "tunnel_ready", "tunnel_id": TUNNEL})
    step = session.receive_data(data[:7])
    assert step.events == ()
    step = session.receive_data(data[7:])
    assert step.events == (TunnelWaiting(TUNNEL), TunnelReady(TUNNEL))
    assert session.tunnel_state(TUNNEL) is TunnelState.READY

    step = session.receive_data(frame({"type": "tunnel_down", "tunnel_id": TUNNEL, "reason": BIND_AUTH_FAILED}))
    assert step.events == (TunnelDown(TUNNEL, BIND_AUTH_FAILED),)
    assert session.tunnel_state(TUNNEL) is TunnelState.DOWN
    assert session.tunnels == {}


def test_session_without_identify_and_without_token() -> None:
    session = EdgeRelaySession(software_version="0.3.0")
    assert [m["type"] for m in sent(session.start(now=0.0).data)] == ["hello"]
    assert sent(session.bind(TUNNEL, "egress", "udp").data) == [
        {"type": "tunnel_bind", "tunnel_id": TUNNEL, "direction": "egress", "protocol": "udp"}
    ]


def test_session_unbind() -> None:
    session = started()
    session.bind(TUNNEL, "egress", "tcp")
    assert sent(session.unbind(TUNNEL).data) == [{"type": "tunnel_unbind", "tunnel_id": TUNNEL}]
    assert session.tunnel_state(TUNNEL) is TunnelState.DOWN
    with pytest.raises(LocalProtocolError):
        session.unbind(TUNNEL)


def test_session_driver_misuse_raises() -> None:
    session = EdgeRelaySession(software_version="0.3.0")
    with pytest.raises(LocalProtocolError):
        session.bind(TUNNEL, "egress", "tcp")
    session.start(now=0.0)
    with pytest.raises(LocalProtocolError):
        session.start(now=0.0)
    session.bind(TUNNEL, "egress", "tcp")
    with pytest.raises(LocalProtocolError):
        session.bind(TUNNEL, "egress", "tcp")


def test_session_pings_every_15_s() -> None:
    session = EdgeRelaySession(software_version="0.3.0")
    session.start(now=10.0)
    assert session.next_deadline() == 25.0
    assert session.tick(now=24.9).data == b""
    assert sent(session.tick(now=25.0).data) == [{"type": "ping"}]
    assert session.tick(now=30.0).data == b""
    assert sent(session.tick(now=40.0).data) == [{"type": "ping"}]
    assert session.receive_data(frame({"type": "pong"})).events == (PongReceived(),)


def test_session_skips_bad_frames_and_stays_up() -> None:
    session = started()
    session.bind(TUNNEL, "ingress", "tcp")
    data = (
        encode_frame(b"{broken")
        + frame({"type": "future_thing"})
        + frame({"type": "tunnel_down", "tunnel_id": TUNNEL})  # no reason: invalid
        + frame({"type": "tunnel_bind", "tunnel_id": TUNNEL, "direction": "ingress", "protocol": "tcp"})
        + frame({"type": "tunnel_ready", "tunnel_id": "someone-else"})
        + frame({"type": "tunnel_ready", "tunnel_id": TUNNEL})
    )
    step = session.receive_data(data)
    kinds = [e.kind for e in step.events if isinstance(e, FrameDropped)]
    assert kinds == [
        ErrorKind.MALFORMED,
        ErrorKind.UNKNOWN_TYPE,
        ErrorKind.INVALID,
        ErrorKind.UNEXPECTED_TYPE,
        ErrorKind.UNEXPECTED_TYPE,
    ]
    assert step.events[-1] == TunnelReady(TUNNEL)
    assert step.close is None
    assert session.state is ConnectionState.HELLO_SENT


def test_session_oversize_frame_closes_and_downs_tunnels() -> None:
    session = started()
    session.bind(TUNNEL, "ingress", "tcp")
    step = session.receive_data((MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"x" * 10)
    assert step.close is not None
    assert step.events == (TunnelDown(TUNNEL, CONNECTION_LOST, local=True),)
    assert session.state is ConnectionState.CLOSED
    assert session.receive_data(frame({"type": "pong"})) == session.connection_lost()  # both empty
    assert session.tick(now=1000.0).data == b""


def test_session_connection_lost() -> None:
    session = started()
    session.bind(TUNNEL, "ingress", "tcp")
    session.bind("other", "egress", "udp")
    step = session.connection_lost()
    assert {e.tunnel_id for e in step.events if isinstance(e, TunnelDown)} == {TUNNEL, "other"}
    assert session.connection_lost().events == ()


# --------------------------------------------------------------------------- layering
def test_package_does_no_io() -> None:
    forbidden = {"trio", "socket", "time", "random", "asyncio", "os", "secrets"}
    root = Path(__file__).resolve().parents[2] / "appliance" / "relayproto"
    files = sorted(root.glob("*.py"))
    assert len(files) >= 5  # an empty list must not pass quietly
    for path in files:
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        assert not names & forbidden, path
