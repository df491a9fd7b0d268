"""Direct-mode peer authentication (interop.md 8.3): DirectDialler ↔ DirectListener, in memory."""

from __future__ import annotations

import json

import pytest

from appliance.protocol.errors import ErrorKind, LocalProtocolError
from appliance.protocol.session import FrameDropped
from appliance.relayproto import FrameDecoder, decode, encode, encode_frame
from appliance.relayproto.direct import (
    AUTH_FAILED,
    AUTH_TIMEOUT,
    AUTH_TIMEOUT_S,
    CONNECTION_LOST,
    PEER_AUTH_EXPECTED,
    WRONG_TUNNEL,
    DirectClose,
    DirectDialler,
    DirectListener,
    DirectState,
    DirectStep,
    PeerAuthenticated,
    PeerRejected,
)
from appliance.relayproto.messages import (
    PeerAuthErrorMessage,
    PeerAuthMessage,
    PeerAuthOkMessage,
    PingMessage,
    PongMessage,
)

TUNNEL = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
PSK = "correct horse battery staple"
VECTOR = (
    "NmYxYzJiM2EtNGQ1ZS00ZjYwLThhN2ItOWMwZDFlMmYzYTRiOjA4NmQzNDQ4ZjZhZjllOGJmN2Y0MTZkYjIzNDFjN2E3"
    "ZTYwY2MzODBjNTE5YzY5MjE3ZjgyNWIwNTQyNDAyODA="
)


def pair(
    dialler_psk: str = PSK, listener_psk: str = PSK, *, timeout: float = AUTH_TIMEOUT_S
) -> tuple[DirectDialler, DirectListener]:
    return (
        DirectDialler(tunnel_id=TUNNEL, tunnel_psk=dialler_psk, auth_timeout_s=timeout),
        DirectListener(tunnel_id=TUNNEL, tunnel_psk=listener_psk, auth_timeout_s=timeout),
    )


def frames(data: bytes) -> list[dict[str, object]]:
    decoder = FrameDecoder()
    bodies = decoder.feed(data)
    decoder.end_of_stream()
    return [json.loads(body) for body in bodies]


# --------------------------------------------------------------------------- happy path
def test_both_sides_authenticate_and_hand_over_the_stream() -> None:
    dialler, listener = pair()
    assert listener.start(0.0) == DirectStep()
    hello = dialler.start(0.0)
    assert frames(hello.data) == [{"type": "peer_auth", "tunnel_id": TUNNEL, "token": VECTOR}]
    assert not listener.admit_data() and not dialler.admit_data()

    answer = listener.receive_data(hello.data, 0.5)
    assert answer.events == (PeerAuthenticated(TUNNEL),)
    assert answer.close is None
    assert frames(answer.data) == [{"type": "peer_auth_ok", "tunnel_id": TUNNEL}]
    assert listener.state is DirectState.AUTHENTICATED and listener.admit_data()

    done = dialler.receive_data(answer.data, 0.6)
    assert done == DirectStep(events=(PeerAuthenticated(TUNNEL),))
    assert dialler.authenticated and dialler.admit_data()
    assert dialler.take_remaining() == b"" and listener.take_remaining() == b""
    assert dialler.next_deadline() is None and listener.next_deadline() is None
    assert dialler.tick(1e9) == DirectStep() and listener.tick(1e9) == DirectStep()


def test_peer_auth_token_is_the_8_3_vector() -> None:
    dialler = DirectDialler(tunnel_id=TUNNEL, tunnel_psk=PSK)
    (message,) = [decode(body) for body in FrameDecoder().feed(dialler.start(0.0).data)]
    assert isinstance(message, PeerAuthMessage)
    assert message.token.get_secret_value() == VECTOR
    listener = DirectListener(tunnel_id=TUNNEL, tunnel_psk=PSK)
    listener.start(0.0)
    wire = encode(PeerAuthMessage.model_validate({"tunnel_id": TUNNEL, "token": VECTOR}))
    assert listener.receive_data(wire, 1.0).events == (PeerAuthenticated(TUNNEL),)


def test_bytes_after_the_auth_frame_are_handed_over_untouched() -> None:
    dialler, listener = pair()
    listener.start(0.0)
    trailing = encode(PingMessage()) + b"\x00\x00\x00\x10partial"
    step = listener.receive_data(dialler.start(0.0).data + trailing, 0.1)
    assert step.events == (PeerAuthenticated(TUNNEL),)
    assert listener.take_remaining() == trailing
    assert listener.take_remaining() == b""  # once

    extra = encode(PongMessage())
    assert dialler.receive_data(step.data + extra, 0.2).events == (PeerAuthenticated(TUNNEL),)
    assert dialler.take_remaining() == extra


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_split_chunks(size: int) -> None:
    dialler, listener = pair()
    listener.start(0.0)
    data = dialler.start(0.0).data
    steps = [listener.receive_data(data[i : i + size], 0.1) for i in range(0, len(data), size)]
    assert all(s == DirectStep() for s in steps[:-1])
    assert steps[-1].events == (PeerAuthenticated(TUNNEL),)
    answer = steps[-1].data
    back = [dialler.receive_data(answer[i : i + size], 0.2) for i in range(0, len(answer), size)]
    assert all(s == DirectStep() for s in back[:-1])
    assert back[-1].events == (PeerAuthenticated(TUNNEL),)


# --------------------------------------------------------------------------- rejection
def test_wrong_psk_errors_and_closes_on_both_sides() -> None:
    dialler, listener = pair(dialler_psk="wrong psk")
    listener.start(0.0)
    step = listener.receive_data(dialler.start(0.0).data, 0.1)
    assert step.events == (PeerRejected(AUTH_FAILED, local=True),)
    assert step.close == DirectClose(AUTH_FAILED)
    assert frames(step.data) == [{"type": "peer_auth_error", "reason": AUTH_FAILED}]
    assert listener.state is DirectState.CLOSED and not listener.admit_data()

    back = dialler.receive_data(step.data, 0.2)
    assert back.events == (PeerRejected(AUTH_FAILED, local=False),)
    assert back.close is not None
    assert dialler.state is DirectState.CLOSED and not dialler.admit_data()
    # Closed machines ignore late bytes and a lost connection.
    assert listener.receive_data(b"anything", 0.3) == DirectStep()
    assert dialler.connection_lost() == DirectStep()


def test_wrong_tunnel_id_is_the_same_generic_error() -> None:
    other = "00000000-0000-4000-8000-000000000000"
    listener = DirectListener(tunnel_id=TUNNEL, tunnel_psk=PSK)
    listener.start(0.0)
    # A token valid for the other tunnel, under the right PSK.
    forged = DirectDialler(tunnel_id=other, tunnel_psk=PSK).start(0.0).data
    step = listener.receive_data(forged, 0.1)
    assert step.events == (PeerRejected(AUTH_FAILED, local=True),)
    # The right token under a wrong tunnel_id field.
    listener = DirectListener(tunnel_id=TUNNEL, tunnel_psk=PSK)
    listener.start(0.0)
    mixed = encode(PeerAuthMessage.model_validate({"tunnel_id": other, "token": VECTOR}))
    assert listener.receive_data(mixed, 0.1).events == (PeerRejected(AUTH_FAILED, local=True),)


def test_the_error_never_echoes_the_token_or_psk() -> None:
    dialler, listener = pair(dialler_psk="other secret")
    listener.start(0.0)
    step = listener.receive_data(dialler.start(0.0).data, 0.1)
    text = step.data + repr(step).encode() + repr(listener).encode() + repr(dialler).encode()
    assert b"other secret" not in text and PSK.encode() not in text


@pytest.mark.parametrize(
    "first",
    [
        encode(PingMessage()),
        encode(PeerAuthOkMessage(tunnel_id=TUNNEL)),
        encode_frame(b"not json"),
        encode_frame(b'{"type":"no_such_type"}'),
        encode_frame(b'{"type":"peer_auth","tunnel_id":"x"}'),  # no token
    ],
)
def test_anything_but_peer_auth_first_is_refused(first: bytes) -> None:
    listener = DirectListener(tunnel_id=TUNNEL, tunnel_psk=PSK)
    listener.start(0.0)
    step = listener.receive_data(first + DirectDialler(tunnel_id=TUNNEL, tunnel_psk=PSK).start(0.0).data, 0.1)
    assert step.events == (PeerRejected(PEER_AUTH_EXPECTED, local=True),)
    assert step.close == DirectClose(PEER_AUTH_EXPECTED)
    assert frames(step.data) == [{"type": "peer_auth_error", "reason": PEER_AUTH_EXPECTED}]
    assert listener.state is DirectState.CLOSED


def test_data_before_auth_is_not_admitted() -> None:
    dialler, listener = pair()
    listener.start(0.0)
    data = dialler.start(0.0).data
    listener.receive_data(data[:5], 0.1)  # half a peer_auth
    assert not listener.admit_data()
    with pytest.raises(LocalProtocolError):
        listener.take_remaining()
    listener.receive_data(data[5:], 0.2)
    assert listener.admit_data()


def test_oversize_first_frame_closes_without_an_answer() -> None:
    listener = DirectListener(tunnel_id=TUNNEL, tunnel_psk=PSK)
    listener.start(0.0)
    step = listener.receive_data((2**31).to_bytes(4, "big"), 0.1)
    assert step.data == b""
    assert step.close is not None and listener.state is DirectState.CLOSED
    assert isinstance(step.events[0], PeerRejected)


# --------------------------------------------------------------------------- timeouts
def test_listener_times_out_without_peer_auth() -> None:
    _, listener = pair(timeout=5.0)
    listener.start(100.0)
    assert listener.next_deadline() == 105.0
    assert listener.tick(104.9) == DirectStep()
    step = listener.tick(105.0)
    assert step.events == (PeerRejected(AUTH_TIMEOUT, local=True),)
    assert step.close == DirectClose(AUTH_TIMEOUT)
    assert frames(step.data) == [{"type": "peer_auth_error", "reason": AUTH_TIMEOUT}]
    assert listener.next_deadline() is None


def test_a_late_peer_auth_is_timed_out_not_accepted() -> None:
    dialler, listener = pair(timeout=5.0)
    listener.start(0.0)
    step = listener.receive_data(dialler.start(0.0).data, 6.0)
    assert step.events == (PeerRejected(AUTH_TIMEOUT, local=True),)
    assert not listener.authenticated


def test_dialler_times_out_without_an_answer() -> None:
    dialler, _ = pair(timeout=5.0)
    dialler.start(10.0)
    assert dialler.next_deadline() == 15.0
    assert dialler.tick(14.0) == DirectStep()
    step = dialler.tick(15.5)
    assert step == DirectStep(events=(PeerRejected(AUTH_TIMEOUT, local=True),), close=DirectClose(AUTH_TIMEOUT))
    assert dialler.state is DirectState.CLOSED


# --------------------------------------------------------------------------- dialler details
def test_dialler_drops_stray_frames_before_the_answer() -> None:
    dialler = DirectDialler(tunnel_id=TUNNEL, tunnel_psk=PSK)
    dialler.start(0.0)
    step = dialler.receive_data(encode(PongMessage()) + encode_frame(b"{bad"), 0.1)
    assert [type(e) for e in step.events] == [FrameDropped, FrameDropped]
    assert isinstance(step.events[0], FrameDropped) and step.events[0].kind is ErrorKind.UNEXPECTED_TYPE
    assert step.close is None and dialler.state is DirectState.AUTHENTICATING


def test_dialler_closes_on_ok_for_another_tunnel() -> None:
    dialler = DirectDialler(tunnel_id=TUNNEL, tunnel_psk=PSK)
    dialler.start(0.0)
    step = dialler.receive_data(encode(PeerAuthOkMessage(tunnel_id="other")), 0.1)
    assert step.events == (PeerRejected(WRONG_TUNNEL, local=True),)
    assert step.close == DirectClose(WRONG_TUNNEL)


def test_dialler_reports_the_listeners_reason() -> None:
    dialler = DirectDialler(tunnel_id=TUNNEL, tunnel_psk=PSK)
    dialler.start(0.0)
    step = dialler.receive_data(encode(PeerAuthErrorMessage(reason="bad token")), 0.1)
    assert step.events == (PeerRejected("bad token", local=False),)


def test_connection_lost_before_auth() -> None:
    dialler, listener = pair()
    dialler.start(0.0)
    listener.start(0.0)
    assert dialler.connection_lost().events == (PeerRejected(CONNECTION_LOST, local=True),)
    assert listener.connection_lost().events == (PeerRejected(CONNECTION_LOST, local=True),)
    assert dialler.connection_lost() == DirectStep()


# --------------------------------------------------------------------------- driver misuse
def test_driver_misuse_raises() -> None:
    dialler, listener = pair()
    with pytest.raises(LocalProtocolError):
        listener.receive_data(b"", 0.0)  # not started
    dialler_start = dialler.start(0.0)
    with pytest.raises(LocalProtocolError):
        dialler.start(0.0)
    listener.start(0.0)
    answer = listener.receive_data(dialler_start.data, 0.0)
    with pytest.raises(LocalProtocolError):
        listener.receive_data(b"more", 0.0)  # authenticated: the driver owns the stream now
    dialler.receive_data(answer.data, 0.0)
    with pytest.raises(LocalProtocolError):
        dialler.receive_data(b"more", 0.0)


@pytest.mark.parametrize(
    ("tunnel_id", "tunnel_psk", "timeout"), [("", PSK, 1.0), (TUNNEL, "", 1.0), (TUNNEL, PSK, 0.0)]
)
def test_bad_config_is_refused(tunnel_id: str, tunnel_psk: str, timeout: float) -> None:
    with pytest.raises(ValueError):
        DirectListener(tunnel_id=tunnel_id, tunnel_psk=tunnel_psk, auth_timeout_s=timeout)
    with pytest.raises(ValueError):
        DirectDialler(tunnel_id=tunnel_id, tunnel_psk=tunnel_psk, auth_timeout_s=timeout)
