"""The relay's native UDP plane (interop.md 9 and the native-plane parts of 13), sans-IO."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid

import pytest

from appliance.relayproto import BindAuthorization, bind_allowed
from services.relay import native_plane as np_
from services.relay.native_plane import (
    NIL_PREFIX,
    Ack,
    ControlError,
    NativePlane,
    Register,
    decode_ack,
    decode_register,
    encode_ack,
    encode_register,
)

TID = uuid.UUID("6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b")
OTHER_TID = uuid.UUID("0b6c8f0e-3f2a-4c1d-9e8b-7a6f5e4d3c2b")
SECRET = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
A = ("198.51.100.10", 40000)  # ingress edge
B = ("203.0.113.20", 50000)  # egress edge
C = ("192.0.2.30", 60000)  # a third party


def token(tid: uuid.UUID, direction: str) -> str:
    return hmac.new(SECRET.encode(), f"{tid}:{direction}".encode(), hashlib.sha256).hexdigest()


def verifier(tid: uuid.UUID, direction: np_.Direction, presented: str | None) -> bool:
    """What the relay passes: the one 8.4 rule (appliance.relayproto), fail-closed."""
    authorization = BindAuthorization.from_secret(SECRET, str(tid))
    return bind_allowed(authorization, direction, presented, require_bind_auth=True)


def reg(direction: np_.Direction, tid: uuid.UUID = TID, tok: str | None = "") -> bytes:
    return encode_register(Register(tid, direction, token(tid, direction) if tok == "" else tok))


def media(payload: bytes, tid: uuid.UUID = TID) -> bytes:
    return tid.bytes + payload


def acks(sends: list[tuple[bytes, np_.Address]]) -> list[tuple[Ack, np_.Address]]:
    return [(decode_ack(data), addr) for data, addr in sends]


def both_latched(now: float = 0.0) -> NativePlane:
    plane = NativePlane(verifier)
    plane.on_datagram(reg("ingress"), A, now)
    plane.on_datagram(reg("egress"), B, now)
    return plane


# ------------------------------------------------------------------ control messages


def test_register_round_trips_with_the_documented_fields() -> None:
    data = reg("ingress")
    assert data[:16] == NIL_PREFIX
    assert json.loads(data[16:]) == {
        "type": "register",
        "tunnel_id": str(TID),
        "direction": "ingress",
        "bind_token": "be5aeadc2699dec87e429f12981a5bd977abb0afd853abcdeb1a52457b6567a6",
        "protocol_version": 2,
    }
    assert decode_register(data) == Register(TID, "ingress", token(TID, "ingress"), 2)


def test_bind_token_matches_the_8_4_test_vector() -> None:
    assert token(TID, "egress") == "a8b7fbafbd4eadeb3d0e61bdb8dbc292c53349c707ac188ce78a6415db1cdb41"


def test_register_without_bind_token_parses_as_none() -> None:
    body = {"type": "register", "tunnel_id": str(TID), "direction": "egress", "protocol_version": 2}
    assert decode_register(NIL_PREFIX + json.dumps(body).encode()).bind_token is None


def test_ack_encoding_is_nil_prefix_and_flat_json() -> None:
    data = encode_ack(Ack(TID, True))
    assert data == NIL_PREFIX + b'{"type":"ack","tunnel_id":"6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b","ready":true}'
    assert decode_ack(data) == Ack(TID, True)
    assert decode_ack(encode_ack(Ack(TID, False))).ready is False


GOOD = {"type": "register", "tunnel_id": str(TID), "direction": "ingress", "bind_token": "x", "protocol_version": 2}


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        json.dumps({**GOOD, "type": "hello"}).encode(),
        json.dumps({**GOOD, "direction": "both"}).encode(),
        json.dumps({**GOOD, "tunnel_id": str(uuid.UUID(int=0))}).encode(),
        json.dumps({**GOOD, "tunnel_id": str(TID).upper()}).encode(),
        json.dumps({**GOOD, "tunnel_id": "nope"}).encode(),
        json.dumps({**GOOD, "protocol_version": 1}).encode(),
        json.dumps({**GOOD, "protocol_version": True}).encode(),
        json.dumps({k: v for k, v in GOOD.items() if k != "protocol_version"}).encode(),
        json.dumps({**GOOD, "bind_token": 5}).encode(),
        json.dumps({**GOOD, "extra": 1}).encode(),
        json.dumps({**GOOD, "bind_token": "x" * 2100}).encode(),  # over 2032 bytes of JSON
    ],
)
def test_malformed_registers_are_rejected(body: bytes) -> None:
    with pytest.raises(ControlError):
        decode_register(NIL_PREFIX + body)
    plane = NativePlane(verifier)
    assert plane.on_datagram(NIL_PREFIX + body, A, 0.0) == []
    assert plane.counters.control_malformed == 1
    assert plane.sessions_active == 0


def test_control_json_of_exactly_2032_bytes_is_accepted() -> None:
    body = json.dumps(GOOD).encode()
    padded = body[:-1] + b" " * (2032 - len(body)) + b"}"
    assert len(padded) == 2032
    assert decode_register(NIL_PREFIX + padded).direction == "ingress"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[uuid.UUID, str, str | None]] = []

    def __call__(self, tid: uuid.UUID, direction: np_.Direction, presented: str | None) -> bool:
        self.calls.append((tid, direction, presented))
        return True


def test_the_verifier_gets_tunnel_direction_and_token() -> None:
    seen = Recorder()
    plane = NativePlane(seen)
    plane.on_datagram(reg("egress", tok=None), B, 0.0)
    assert seen.calls == [(TID, "egress", None)]


# ------------------------------------------------------------------ latching rules of 9


def test_first_register_latches_and_is_acked_not_ready() -> None:
    plane = NativePlane(verifier)
    out = plane.on_datagram(reg("ingress"), A, 0.0)
    assert acks(out) == [(Ack(TID, False), A)]
    session = plane.session(TID)
    assert session is not None and session.ingress.address == A and session.egress.address is None


def test_ack_is_ready_once_both_slots_are_latched() -> None:
    plane = NativePlane(verifier)
    plane.on_datagram(reg("ingress"), A, 0.0)
    assert acks(plane.on_datagram(reg("egress"), B, 0.0)) == [(Ack(TID, True), B)]
    assert acks(plane.on_datagram(reg("ingress"), A, 5.0)) == [(Ack(TID, True), A)]


@pytest.mark.parametrize(
    "source",
    [("0.0.0.0", 4000), ("::", 4000), ("224.0.0.1", 4000), ("ff02::1", 4000), ("255.255.255.255", 4000), (A[0], 0)],
)
def test_rule1_unlatchable_source_is_rejected_without_ack(source: np_.Address) -> None:
    seen = Recorder()
    plane = NativePlane(seen)
    assert plane.on_datagram(reg("ingress"), source, 0.0) == []
    assert plane.sessions_active == 0
    assert plane.counters.registers_rejected["unlatchable"] == 1
    assert seen.calls == []  # rule 1 is checked before the token


def test_rule2_failed_bind_token_is_rejected_without_ack() -> None:
    plane = NativePlane(verifier)
    assert plane.on_datagram(reg("ingress", tok=token(TID, "egress")), A, 0.0) == []
    assert plane.on_datagram(reg("ingress", tok=None), A, 0.0) == []
    assert plane.sessions_active == 0
    assert plane.counters.registers_rejected["auth"] == 2


def test_rule2_bad_token_does_not_move_a_latched_slot() -> None:
    plane = both_latched()
    assert plane.on_datagram(reg("ingress", tok="0" * 64), C, 1.0) == []
    session = plane.session(TID)
    assert session is not None and session.ingress.address == A


def test_rule3_loop_guard_rejects_source_equal_to_other_slot() -> None:
    plane = NativePlane(verifier)
    plane.on_datagram(reg("ingress"), A, 0.0)
    assert plane.on_datagram(reg("egress"), A, 0.0) == []
    assert plane.counters.registers_rejected["loop"] == 1
    session = plane.session(TID)
    assert session is not None and session.egress.address is None


def test_rule4_takeover_grace_rejects_other_ip_while_slot_carried_media_in_last_12s() -> None:
    plane = both_latched()
    plane.on_datagram(media(b"x"), B, 10.0)  # the egress slot carries media at t=10
    assert plane.on_datagram(reg("egress"), C, 21.9) == []
    assert plane.counters.registers_rejected["takeover_grace"] == 1
    session = plane.session(TID)
    assert session is not None and session.egress.address == B


def test_rule4_takeover_after_grace_is_accepted() -> None:
    plane = both_latched()
    plane.on_datagram(media(b"x"), B, 10.0)
    assert acks(plane.on_datagram(reg("egress"), C, 22.0)) == [(Ack(TID, True), C)]
    session = plane.session(TID)
    assert session is not None and session.egress.address == C
    assert plane.on_datagram(media(b"y"), B, 22.1) == []  # the old address is no longer latched
    assert plane.counters.dropped_unknown_source == 1


def test_rule4_port_change_from_same_ip_is_always_accepted() -> None:
    plane = both_latched()
    plane.on_datagram(media(b"x"), B, 10.0)
    moved = (B[0], B[1] + 1)
    assert acks(plane.on_datagram(reg("egress"), moved, 10.5)) == [(Ack(TID, True), moved)]
    assert plane.on_datagram(media(b"y"), moved, 10.6) == [(media(b"y"), A)]


def test_rule4_slot_that_never_carried_media_is_last_writer_wins() -> None:
    plane = both_latched()
    plane.on_datagram(media(b"x"), B, 1.0)  # media from egress only: ingress slot never carried any
    assert acks(plane.on_datagram(reg("ingress"), C, 1.5)) == [(Ack(TID, True), C)]
    assert acks(plane.on_datagram(reg("ingress"), A, 2.0)) == [(Ack(TID, True), A)]
    session = plane.session(TID)
    assert session is not None and session.ingress.address == A


def test_rule5_per_ip_session_cap() -> None:
    plane = NativePlane(lambda t, d, k: True, max_sessions_per_ip=2)
    tids = [uuid.UUID(int=i + 1, version=4) for i in range(3)]
    assert plane.on_datagram(reg("ingress", tids[0], None), A, 0.0)
    assert plane.on_datagram(reg("ingress", tids[1], None), (A[0], A[1] + 1), 0.0)
    assert plane.on_datagram(reg("ingress", tids[2], None), A, 0.0) == []
    assert plane.counters.registers_rejected["per_ip_limit"] == 1
    # another IP may still create sessions; the capped IP may still join an existing one
    assert plane.on_datagram(reg("ingress", tids[2], None), B, 0.0)
    assert plane.on_datagram(reg("egress", tids[2], None), A, 0.0)
    # a reaped or closed session frees the IP's quota
    assert plane.close(tids[0])
    assert plane.on_datagram(reg("ingress", OTHER_TID, None), A, 1.0)


def test_rules_are_checked_in_order_auth_before_loop() -> None:
    plane = NativePlane(verifier)
    plane.on_datagram(reg("ingress"), A, 0.0)
    plane.on_datagram(reg("egress", tok="bad"), A, 0.0)
    assert plane.counters.registers_rejected["auth"] == 1
    assert plane.counters.registers_rejected["loop"] == 0


def test_re_register_from_latched_address_is_acked() -> None:
    plane = both_latched()
    plane.on_datagram(media(b"x"), A, 1.0)
    assert acks(plane.on_datagram(reg("ingress"), A, 2.0)) == [(Ack(TID, True), A)]


# ------------------------------------------------------------------ forwarding


def test_media_is_forwarded_byte_for_byte_both_ways() -> None:
    plane = both_latched()
    d1, d2 = media(b"\x47" * 1316), media(b"back")
    out1 = plane.on_datagram(d1, A, 1.0)
    out2 = plane.on_datagram(d2, B, 1.0)
    assert out1 == [(d1, B)] and out1[0][0] is d1
    assert out2 == [(d2, A)]


def test_unknown_tunnel_is_dropped() -> None:
    plane = both_latched()
    assert plane.on_datagram(media(b"x", OTHER_TID), A, 1.0) == []
    assert plane.counters.dropped_unknown_tunnel == 1


def test_datagram_from_unlatched_source_is_dropped_and_counted() -> None:
    plane = both_latched()
    assert plane.on_datagram(media(b"x"), C, 1.0) == []
    assert plane.on_datagram(media(b"x"), (A[0], A[1] + 1), 1.0) == []
    assert plane.counters.dropped_unknown_source == 2
    assert plane.counters.datagrams_forwarded == 0


def test_half_latched_session_drops_media() -> None:
    plane = NativePlane(verifier)
    plane.on_datagram(reg("ingress"), A, 0.0)
    assert plane.on_datagram(media(b"x"), A, 1.0) == []
    assert plane.counters.dropped_half_latched == 1


def test_datagram_whose_destination_equals_its_source_is_dropped_as_loop() -> None:
    plane = both_latched()
    session = plane.session(TID)
    assert session is not None
    session.egress.address = A  # unreachable through register (rule 3); the forwarder guards too
    assert plane.on_datagram(media(b"x"), A, 1.0) == []
    assert plane.counters.dropped_loop == 1


def test_short_datagram_is_dropped() -> None:
    plane = both_latched()
    assert plane.on_datagram(TID.bytes[:15], A, 1.0) == []
    assert plane.counters.dropped_short == 1


def test_rejected_register_sends_nothing_and_the_table_is_unchanged() -> None:
    plane = both_latched()
    before = [(s.ingress.address, s.egress.address) for s in plane.sessions()]
    assert plane.on_datagram(reg("egress"), A, 1.0) == []  # loop
    assert [(s.ingress.address, s.egress.address) for s in plane.sessions()] == before


# ------------------------------------------------------------------ counters (13)


def test_counters_count_forwarded_datagrams_both_ways_and_payload_per_bound_leg() -> None:
    plane = both_latched()
    plane.on_datagram(media(b"a" * 100), A, 1.0)  # from ingress
    plane.on_datagram(media(b"b" * 100), A, 1.0)
    plane.on_datagram(media(b"c" * 7), B, 1.0)  # from egress
    plane.on_datagram(media(b"d" * 50), C, 1.0)  # dropped: not counted as forwarded
    session = plane.session(TID)
    assert session is not None
    assert (session.datagrams, session.bytes_ingress, session.bytes_egress) == (3, 200, 7)
    c = plane.counters
    assert (c.datagrams_forwarded, c.bytes_forwarded, c.bytes_ingress, c.bytes_egress) == (3, 207, 200, 7)
    assert c.registers_accepted == 2 and c.sessions_created == 1


def test_plane_counters_survive_reaping() -> None:
    plane = both_latched()
    plane.on_datagram(media(b"a" * 10), A, 1.0)
    assert plane.reap(31.0) == [TID]
    assert plane.counters.datagrams_forwarded == 1 and plane.counters.bytes_forwarded == 10
    assert plane.counters.sessions_reaped == 1 and plane.sessions_active == 0


# ------------------------------------------------------------------ reaper


def test_session_idle_for_30s_is_reaped() -> None:
    plane = both_latched(now=100.0)
    assert plane.reap(129.9) == []
    assert plane.reap(130.0) == [TID]
    assert plane.session(TID) is None
    assert plane.on_datagram(media(b"x"), A, 130.1) == []
    assert plane.counters.dropped_unknown_tunnel == 1


def test_registers_and_media_from_either_side_keep_the_session_alive() -> None:
    plane = both_latched(now=0.0)
    plane.on_datagram(reg("ingress"), A, 25.0)
    assert plane.reap(50.0) == []
    plane.on_datagram(media(b"x"), B, 50.0)
    assert plane.reap(79.0) == []
    assert plane.reap(80.0) == [TID]


def test_unlatched_sources_do_not_keep_a_session_alive() -> None:
    plane = both_latched(now=0.0)
    plane.on_datagram(media(b"x"), C, 20.0)
    plane.on_datagram(reg("ingress", tok="bad"), C, 20.0)
    assert plane.reap(30.0) == [TID]


def test_half_latched_session_is_kept_alive_by_its_side_and_reaped_after() -> None:
    plane = NativePlane(verifier)
    plane.on_datagram(reg("ingress"), A, 0.0)
    plane.on_datagram(media(b"x"), A, 20.0)  # dropped (half-latched) but it is a datagram from a side
    assert plane.reap(49.0) == []
    assert plane.reap(50.0) == [TID]


def test_timer_constants() -> None:
    assert np_.SESSION_IDLE_S == 30.0 and np_.REAP_INTERVAL_S == 10.0 and np_.TAKEOVER_GRACE_S == 12.0
    assert np_.EDGE_REGISTER_INTERVAL_S == 5.0 and np_.EDGE_DEAD_AFTER_S == 25.0 and np_.EDGE_RETRY_INTERVAL_S == 1.0
    assert np_.RECV_BUFFER_BYTES == 2048 and np_.MAX_CONTROL_JSON == 2032
    assert np_.SOCKET_BUFFER_BYTES == 32 * 1024 * 1024
