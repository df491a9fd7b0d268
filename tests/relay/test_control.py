"""The relay side of the control protocol (interop.md 8.1, 8.2, 8.4, 13): canned messages, no I/O."""

from __future__ import annotations

from appliance.protocol.session import FrameDropped
from appliance.relayproto import (
    BIND_AUTH_FAILED,
    PROTOCOL_MISMATCH,
    REPLACED_BY_NEWER_BIND,
    TUNNEL_LIMIT_EXCEEDED,
    BindAuthorization,
    EdgeRelaySession,
    HelloAckMessage,
    HelloMessage,
    IdentifyMessage,
    PingMessage,
    PongMessage,
    TunnelBindMessage,
    TunnelDownMessage,
    TunnelReadyMessage,
    TunnelState,
    TunnelUnbindMessage,
    TunnelWaitingMessage,
    compute_bind_token,
    encode,
)
from services.relay.control import (
    BindRejected,
    ConnectionClosed,
    LegReleased,
    RelayConnection,
    RelayTunnels,
    TunnelRemoved,
    TunnelStatus,
)

TID = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
SECRET = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
INGRESS_TOKEN = "be5aeadc2699dec87e429f12981a5bd977abb0afd853abcdeb1a52457b6567a6"  # interop.md 8.4 vector
EGRESS_TOKEN = "a8b7fbafbd4eadeb3d0e61bdb8dbc292c53349c707ac188ce78a6415db1cdb41"


def bind(direction: str, token: str | None = None, protocol: str = "udp", tunnel_id: str = TID) -> TunnelBindMessage:
    return TunnelBindMessage.model_validate(
        {"tunnel_id": tunnel_id, "direction": direction, "protocol": protocol, "bind_token": token}
    )


def connect(table: RelayTunnels, cid: int, ip: str = "198.51.100.10", edge_id: str | None = None) -> RelayConnection:
    conn = table.open_connection(cid, (ip, 40000 + cid), now=0.0)
    assert conn is not None
    out = conn.receive(HelloMessage(software_version="0.3.0"), now=0.0)
    assert out.sends == ((cid, HelloAckMessage(software_version="relay-1")),)
    if edge_id is not None:
        conn.receive(IdentifyMessage(edge_id=edge_id), now=0.0)
    return conn


def table(**kwargs: object) -> RelayTunnels:
    return RelayTunnels(software_version="relay-1", **kwargs)  # type: ignore[arg-type]


def test_the_test_vector_tokens_are_the_bind_tokens() -> None:
    assert compute_bind_token(SECRET, TID, "ingress") == INGRESS_TOKEN
    assert compute_bind_token(SECRET, TID, "egress") == EGRESS_TOKEN


def test_hello_then_ping_pong_and_edge_id() -> None:
    t = table()
    a = connect(t, 1)
    assert a.edge_id == "198.51.100.10:40001#1"
    assert a.receive(PingMessage(), now=1.0).sends == ((1, PongMessage()),)
    b = connect(t, 2, edge_id="node-b")
    assert b.edge_id == "node-b"


def test_messages_before_hello_are_dropped() -> None:
    t = table()
    conn = t.open_connection(1, ("192.0.2.1", 1), now=0.0)
    assert conn is not None
    out = conn.receive(bind("ingress"), now=0.0)
    assert out.sends == ()
    assert isinstance(out.events[0], FrameDropped)
    assert t.total_tunnels == 0


def test_one_leg_gets_waiting_and_entry_is_waiting_for_the_other() -> None:
    t = table()
    a = connect(t, 1, edge_id="node-a")
    out = a.receive(bind("ingress"), now=1.0)
    assert out.sends == ((1, TunnelWaitingMessage(tunnel_id=TID)),)
    entry = t.tunnel(TID)
    assert entry is not None
    assert entry.status is TunnelStatus.WAITING_EGRESS
    assert (entry.ingress_edge_id, entry.egress_edge_id) == ("node-a", None)
    assert t.total_tunnels == 1


def test_both_legs_bind_and_both_get_ready() -> None:
    t = table()
    t.authorize_tunnel(BindAuthorization.from_secret(SECRET, TID))
    a = connect(t, 1, edge_id="node-a")
    b = connect(t, 2, edge_id="node-b")
    a.receive(bind("ingress", INGRESS_TOKEN), now=1.0)
    out = b.receive(bind("egress", EGRESS_TOKEN), now=2.0)
    assert set(out.sends) == {(1, TunnelReadyMessage(tunnel_id=TID)), (2, TunnelReadyMessage(tunnel_id=TID))}
    entry = t.tunnel(TID)
    assert entry is not None
    assert entry.status is TunnelStatus.READY
    assert (entry.ingress_edge_id, entry.egress_edge_id) == ("node-a", "node-b")


def test_wrong_token_under_require_bind_auth_is_refused_and_changes_nothing() -> None:
    t = table(require_bind_auth=True)
    t.authorize_tunnel(BindAuthorization.from_secret(SECRET, TID))
    a = connect(t, 1)
    b = connect(t, 2)
    a.receive(bind("ingress", INGRESS_TOKEN), now=1.0)
    for token in (INGRESS_TOKEN, None, "00" * 32):  # the other direction's token, none, garbage
        out = b.receive(bind("egress", token), now=2.0)
        assert out.sends == ((2, TunnelDownMessage(tunnel_id=TID, reason=BIND_AUTH_FAILED)),)
        assert out.events == (BindRejected(TID, "egress", 2, BIND_AUTH_FAILED),)
    entry = t.tunnel(TID)
    assert entry is not None
    assert entry.status is TunnelStatus.WAITING_EGRESS
    assert entry.egress is None
    assert t.counters.binds_rejected_auth == 3


def test_require_bind_auth_without_an_authorization_fails_closed() -> None:
    t = table(require_bind_auth=True)
    out = connect(t, 1).receive(bind("ingress"), now=0.0)
    assert out.sends == ((1, TunnelDownMessage(tunnel_id=TID, reason=BIND_AUTH_FAILED)),)
    assert t.total_tunnels == 0


def test_no_authorization_and_require_bind_auth_off_is_allowed() -> None:
    t = table()
    connect(t, 1).receive(bind("ingress"), now=0.0)
    out = connect(t, 2).receive(bind("egress"), now=0.0)
    assert (2, TunnelReadyMessage(tunnel_id=TID)) in out.sends


def test_an_authorization_is_checked_even_with_require_bind_auth_off_and_revoke_lifts_it() -> None:
    t = table()
    t.authorize_tunnel(BindAuthorization.from_secret(SECRET, TID))
    a = connect(t, 1)
    assert a.receive(bind("ingress"), now=0.0).sends == (
        (1, TunnelDownMessage(tunnel_id=TID, reason=BIND_AUTH_FAILED)),
    )
    assert t.revoke_tunnel(TID)
    assert a.receive(bind("ingress"), now=0.0).sends == ((1, TunnelWaitingMessage(tunnel_id=TID)),)


def test_revoke_keeps_live_legs() -> None:
    t = table()
    t.authorize_tunnel(BindAuthorization.from_secret(SECRET, TID))
    connect(t, 1).receive(bind("ingress", INGRESS_TOKEN), now=0.0)
    t.revoke_tunnel(TID)
    entry = t.tunnel(TID)
    assert entry is not None
    assert entry.ingress is not None


def test_a_newer_bind_replaces_the_older_leg() -> None:
    t = table()
    old = connect(t, 1, edge_id="node-a")
    peer = connect(t, 2, edge_id="node-b")
    new = connect(t, 3, edge_id="node-a")
    old.receive(bind("ingress"), now=0.0)
    peer.receive(bind("egress"), now=0.0)
    out = new.receive(bind("ingress"), now=5.0)
    assert out.sends[0] == (1, TunnelDownMessage(tunnel_id=TID, reason=REPLACED_BY_NEWER_BIND))
    assert set(out.sends[1:]) == {(3, TunnelReadyMessage(tunnel_id=TID)), (2, TunnelReadyMessage(tunnel_id=TID))}
    entry = t.tunnel(TID)
    assert entry is not None and entry.ingress is not None
    assert entry.ingress.connection_id == 3
    assert old.legs == frozenset()
    # The stale connection going later leaves the new leg alone.
    lost = old.connection_lost(now=6.0)
    assert lost.sends == ()
    assert t.tunnel(TID) is entry
    assert entry.status is TunnelStatus.READY


def test_unbind_leaves_a_waiting_entry_then_the_last_leg_removes_it() -> None:
    t = table()
    a = connect(t, 1)
    b = connect(t, 2)
    a.receive(bind("ingress"), now=0.0)
    b.receive(bind("egress"), now=0.0)
    out = a.receive(TunnelUnbindMessage(tunnel_id=TID), now=1.0)
    assert out.sends == ((2, TunnelWaitingMessage(tunnel_id=TID)),)
    entry = t.tunnel(TID)
    assert entry is not None
    assert entry.status is TunnelStatus.WAITING_INGRESS
    assert entry.ingress_edge_id is None
    assert t.total_tunnels == 1
    out = b.receive(TunnelUnbindMessage(tunnel_id=TID), now=2.0)
    assert TunnelRemoved(TID) in out.events
    assert t.total_tunnels == 0


def test_unbind_of_an_unknown_tunnel_is_dropped() -> None:
    t = table()
    out = connect(t, 1).receive(TunnelUnbindMessage(tunnel_id=TID), now=0.0)
    assert out.sends == ()
    assert isinstance(out.events[0], FrameDropped)


def test_connection_lost_tells_the_other_leg_to_wait() -> None:
    t = table()
    a = connect(t, 1)
    b = connect(t, 2)
    a.receive(bind("ingress"), now=0.0)
    b.receive(bind("egress"), now=0.0)
    out = b.connection_lost(now=3.0)
    assert out.sends == ((1, TunnelWaitingMessage(tunnel_id=TID)),)
    assert LegReleased(TID, "egress", 2, "connection lost") in out.events
    entry = t.tunnel(TID)
    assert entry is not None and entry.status is TunnelStatus.WAITING_EGRESS
    assert t.active_connections == 1
    assert b.connection_lost(now=4.0).sends == ()  # idempotent
    assert b.receive(PingMessage(), now=4.0).sends == ()
    # A fresh connection for the lost side binds again: ready.
    c = connect(t, 3)
    assert (1, TunnelReadyMessage(tunnel_id=TID)) in c.receive(bind("egress"), now=5.0).sends


def test_close_tunnel_sends_down_to_every_bound_leg_and_removes_the_entry() -> None:
    t = table()
    a = connect(t, 1)
    b = connect(t, 2)
    a.receive(bind("ingress"), now=0.0)
    b.receive(bind("egress"), now=0.0)
    out = t.close_tunnel(TID, reason="deleted by admin")
    assert out is not None
    assert set(out.sends) == {
        (1, TunnelDownMessage(tunnel_id=TID, reason="deleted by admin")),
        (2, TunnelDownMessage(tunnel_id=TID, reason="deleted by admin")),
    }
    assert t.tunnel(TID) is None
    assert a.legs == b.legs == frozenset()
    assert t.close_tunnel(TID) is None
    assert a.connection_lost(now=1.0).sends == ()


def test_close_tunnel_of_a_half_bound_tunnel() -> None:
    t = table()
    connect(t, 1).receive(bind("ingress"), now=0.0)
    out = t.close_tunnel(TID)
    assert out is not None
    assert [cid for cid, _ in out.sends] == [1]
    assert t.total_tunnels == 0


def test_tunnel_limit_per_connection() -> None:
    t = table(max_tunnels_per_connection=2)
    a = connect(t, 1)
    ids = [f"00000000-0000-4000-8000-00000000000{i}" for i in range(3)]
    assert a.receive(bind("ingress", tunnel_id=ids[0]), now=0.0).sends[0][1].type == "tunnel_waiting"
    assert a.receive(bind("ingress", tunnel_id=ids[1]), now=0.0).sends[0][1].type == "tunnel_waiting"
    out = a.receive(bind("ingress", tunnel_id=ids[2]), now=0.0)
    assert out.sends == ((1, TunnelDownMessage(tunnel_id=ids[2], reason=TUNNEL_LIMIT_EXCEEDED)),)
    assert t.tunnel(ids[2]) is None
    # Rebinding a leg it holds takes no new slot; another connection has its own budget.
    assert a.receive(bind("ingress", tunnel_id=ids[0]), now=1.0).sends[0][1].type == "tunnel_waiting"
    assert connect(t, 2).receive(bind("ingress", tunnel_id=ids[2]), now=0.0).sends[0][1].type == "tunnel_waiting"


def test_connections_per_ip_limit() -> None:
    t = table(max_connections_per_ip=2)
    first = t.open_connection(1, ("192.0.2.1", 1), now=0.0)
    assert first is not None
    assert t.open_connection(2, ("192.0.2.1", 2), now=0.0) is not None
    assert t.open_connection(3, ("192.0.2.1", 3), now=0.0) is None
    assert t.open_connection(4, ("192.0.2.2", 1), now=0.0) is not None
    first.connection_lost(now=1.0)
    assert t.open_connection(5, ("192.0.2.1", 5), now=1.0) is not None
    assert t.counters.connections_refused == 1
    assert t.counters.connections_total == 4


def test_protocol_mismatch() -> None:
    t = table()
    connect(t, 1).receive(bind("ingress", protocol="udp"), now=0.0)
    out = connect(t, 2).receive(bind("egress", protocol="tcp"), now=0.0)
    assert out.sends == ((2, TunnelDownMessage(tunnel_id=TID, reason=PROTOCOL_MISMATCH)),)
    entry = t.tunnel(TID)
    assert entry is not None and entry.status is TunnelStatus.WAITING_EGRESS


def test_counters_total_and_peak() -> None:
    t = table()
    a = connect(t, 1)
    ids = ["11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"]
    for tunnel_id in ids:
        a.receive(bind("ingress", tunnel_id=tunnel_id), now=0.0)
    assert t.total_tunnels == 2
    a.connection_lost(now=1.0)
    assert (t.total_tunnels, t.counters.peak_tunnels, t.counters.peak_connections) == (0, 2, 1)


def test_raw_bytes_and_an_oversized_frame_closes() -> None:
    t = table()
    conn = t.open_connection(1, ("192.0.2.1", 1), now=0.0)
    assert conn is not None
    data = encode(HelloMessage(software_version="x")) + b"\x00\x00\x00\x05{bad}" + encode(bind("ingress"))
    out = conn.receive_data(data, now=0.0)
    assert [m.type for _, m in out.sends] == ["hello_ack", "tunnel_waiting"]
    assert any(isinstance(e, FrameDropped) for e in out.events)
    out = conn.receive_data(b"\xff\xff\xff\xff", now=1.0)
    assert any(isinstance(e, ConnectionClosed) for e in out.events)
    assert t.total_tunnels == 0
    assert t.active_connections == 0


def test_against_the_edge_session() -> None:
    """Move bytes by hand between two EdgeRelaySessions and the relay core."""
    t = table()
    t.authorize_tunnel(BindAuthorization.from_secret(SECRET, TID))
    edges = {1: EdgeRelaySession(software_version="0.3.0", edge_id="a"), 2: EdgeRelaySession(software_version="0.3.0")}
    conns: dict[int, RelayConnection] = {}
    for cid in edges:
        conn = t.open_connection(cid, ("192.0.2.9", cid), now=0.0)
        assert conn is not None
        conns[cid] = conn

    def pump(cid: int, data: bytes) -> None:
        out = conns[cid].receive_data(data, now=0.0)
        for target, message in out.sends:
            edges[target].receive_data(encode(message))

    for cid, edge in edges.items():
        pump(cid, edge.start(now=0.0).data)
    pump(1, edges[1].bind(TID, "ingress", "udp", INGRESS_TOKEN).data)
    assert edges[1].tunnel_state(TID) is TunnelState.WAITING
    pump(2, edges[2].bind(TID, "egress", "udp", EGRESS_TOKEN).data)
    assert edges[1].tunnel_state(TID) is edges[2].tunnel_state(TID) is TunnelState.READY
    pump(2, edges[2].unbind(TID).data)
    assert edges[1].tunnel_state(TID) is TunnelState.WAITING
