"""The relay's native UDP plane (interop.md 9, and the native-plane parts of 13) as a sans-IO table.

``NativePlane.on_datagram(data, source, now)`` takes one datagram received on the UDP-plane
socket (port 4434) and answers the datagrams to send as ``(bytes, address)`` pairs; the caller
sends them from that same socket (the ack "leaves from the relay socket the register arrived
on"). ``reap(now)`` is called every ``REAP_INTERVAL_S``. No sockets, no clock, no randomness:
``now`` is a monotonic time in seconds supplied by the caller.

Wire format: ``[16-byte tunnel UUID][payload]`` is media, forwarded byte for byte; a nil-UUID
prefix is followed by UTF-8 JSON of at most 2032 bytes (``register`` from an edge, ``ack`` from
the relay). Bind tokens (8.4) are checked by a verifier the caller supplies.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

# The wire format lives in appliance.relayproto.native (the edge speaks it too); re-exported here.
from appliance.relayproto.native import (
    DIRECTIONS as DIRECTIONS,
)
from appliance.relayproto.native import (
    EDGE_DEAD_AFTER_S as EDGE_DEAD_AFTER_S,
)
from appliance.relayproto.native import (
    EDGE_REGISTER_INTERVAL_S as EDGE_REGISTER_INTERVAL_S,
)
from appliance.relayproto.native import (
    EDGE_RETRY_INTERVAL_S as EDGE_RETRY_INTERVAL_S,
)
from appliance.relayproto.native import (
    MAX_CONTROL_JSON as MAX_CONTROL_JSON,
)
from appliance.relayproto.native import (
    NIL_PREFIX as NIL_PREFIX,
)
from appliance.relayproto.native import (
    PREFIX_LEN as PREFIX_LEN,
)
from appliance.relayproto.native import (
    PROTOCOL_VERSION as PROTOCOL_VERSION,
)
from appliance.relayproto.native import (
    RECV_BUFFER_BYTES as RECV_BUFFER_BYTES,
)
from appliance.relayproto.native import (
    Ack as Ack,
)
from appliance.relayproto.native import (
    ControlError as ControlError,
)
from appliance.relayproto.native import (
    Direction as Direction,
)
from appliance.relayproto.native import (
    Register as Register,
)
from appliance.relayproto.native import (
    decode_ack as decode_ack,
)
from appliance.relayproto.native import (
    decode_register as decode_register,
)
from appliance.relayproto.native import (
    encode_ack as encode_ack,
)
from appliance.relayproto.native import (
    encode_register as encode_register,
)

Address = tuple[str, int]
"""``(ip, port)`` as ``recvfrom`` reports it (an IPv6 caller passes the first two fields)."""
BindVerifier = Callable[[uuid.UUID, Direction, str | None], bool]
"""``(tunnel_id, direction, bind_token or None) -> accepted``: the 8.4 check, i.e.
``appliance.relayproto.bind_allowed`` with the tunnel's authorization."""


# Relay timers (9 "Relay timers and fallback").
SESSION_IDLE_S: Final = 30.0
REAP_INTERVAL_S: Final = 10.0
TAKEOVER_GRACE_S: Final = 12.0
SOCKET_BUFFER_BYTES: Final = 32 * 1024 * 1024
DEFAULT_MAX_SESSIONS_PER_IP: Final = 64  # relay.json max_connections_per_ip (1.2)


RejectReason = Literal["unlatchable", "auth", "loop", "takeover_grace", "per_ip_limit"]


# --------------------------------------------------------------------------- the latching table


def _ip(address: Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address[0])
    except ValueError:
        return None


def is_latchable(address: Address) -> bool:
    """Rule 1 of 9: not an unspecified, multicast or broadcast IP, and not port 0."""
    ip = _ip(address)
    if ip is None or not 0 < address[1] <= 0xFFFF:
        return False
    if ip.is_unspecified or ip.is_multicast:
        return False
    return not (isinstance(ip, ipaddress.IPv4Address) and ip == ipaddress.IPv4Address("255.255.255.255"))


def _same_ip(a: Address, b: Address) -> bool:
    ia, ib = _ip(a), _ip(b)
    return ia is not None and ia == ib


@dataclass(slots=True)
class Slot:
    """One direction's latched address and when media from it was last forwarded."""

    address: Address | None = None
    last_media: float | None = None


@dataclass(slots=True)
class Session:
    tunnel_id: uuid.UUID
    creator_ip: str
    created: float
    last_seen: float
    ingress: Slot = field(default_factory=Slot)
    egress: Slot = field(default_factory=Slot)
    datagrams: int = 0  # forwarded, both directions (13)
    bytes_ingress: int = 0  # payload forwarded from the ingress leg, prefix excluded (13)
    bytes_egress: int = 0

    def slot(self, direction: Direction) -> Slot:
        return self.ingress if direction == "ingress" else self.egress

    @property
    def ready(self) -> bool:
        return self.ingress.address is not None and self.egress.address is not None


@dataclass(slots=True)
class Counters:
    """Plane-wide lifetime counters; they survive reaping."""

    datagrams_forwarded: int = 0  # every forwarded datagram, both directions (13)
    bytes_forwarded: int = 0  # payload bytes forwarded, prefix excluded (13)
    bytes_ingress: int = 0
    bytes_egress: int = 0
    registers_accepted: int = 0
    registers_rejected: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("unlatchable", "auth", "loop", "takeover_grace", "per_ip_limit"), 0)
    )
    control_malformed: int = 0  # nil prefix but not a valid register (bad JSON, unknown type, too long)
    dropped_short: int = 0  # fewer than 16 bytes
    dropped_unknown_tunnel: int = 0
    dropped_unknown_source: int = 0  # source is neither latched address
    dropped_half_latched: int = 0
    dropped_loop: int = 0  # destination equals source
    sessions_created: int = 0
    sessions_reaped: int = 0


Send = tuple[bytes, Address]


class NativePlane:
    """Latching table of interop.md 9: sessions keyed by tunnel id, one slot per direction."""

    def __init__(
        self,
        verify_bind: BindVerifier,
        *,
        max_sessions_per_ip: int = DEFAULT_MAX_SESSIONS_PER_IP,
        idle_s: float = SESSION_IDLE_S,
        grace_s: float = TAKEOVER_GRACE_S,
    ) -> None:
        self._verify = verify_bind
        self._max_per_ip = max_sessions_per_ip
        self._idle_s = idle_s
        self._grace_s = grace_s
        self._sessions: dict[uuid.UUID, Session] = {}
        self._per_ip: dict[str, int] = {}
        self.counters = Counters()

    # -- queries

    @property
    def sessions_active(self) -> int:
        return len(self._sessions)

    def session(self, tunnel_id: uuid.UUID) -> Session | None:
        return self._sessions.get(tunnel_id)

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    # -- input

    def on_datagram(self, data: bytes, source: Address, now: float) -> list[Send]:
        """One received datagram; returns what to send where (from the same socket)."""
        if len(data) < PREFIX_LEN:
            self.counters.dropped_short += 1
            return []
        if data[:PREFIX_LEN] == NIL_PREFIX:
            return self._on_control(data, source, now)
        return self._on_media(data, source, now)

    def _on_control(self, data: bytes, source: Address, now: float) -> list[Send]:
        try:
            reg = decode_register(data)
        except ControlError:
            self.counters.control_malformed += 1
            return []
        reason = self._register(reg, source, now)
        if reason is not None:
            self.counters.registers_rejected[reason] += 1
            return []
        self.counters.registers_accepted += 1
        session = self._sessions[reg.tunnel_id]
        return [(encode_ack(Ack(reg.tunnel_id, session.ready)), source)]

    def _register(self, reg: Register, source: Address, now: float) -> RejectReason | None:
        # Rules in the order of 9 "Latching"; the first that fails decides.
        if not is_latchable(source):
            return "unlatchable"
        if not self._verify(reg.tunnel_id, reg.direction, reg.bind_token):
            return "auth"
        session = self._sessions.get(reg.tunnel_id)
        if session is not None:
            other = session.slot("egress" if reg.direction == "ingress" else "ingress")
            if other.address == source:
                return "loop"
            slot = session.slot(reg.direction)
            if (
                slot.address is not None
                and slot.last_media is not None
                and now - slot.last_media < self._grace_s
                and not _same_ip(slot.address, source)
            ):
                return "takeover_grace"
        else:
            if self._per_ip.get(source[0], 0) >= self._max_per_ip:
                return "per_ip_limit"
            session = Session(reg.tunnel_id, creator_ip=source[0], created=now, last_seen=now)
            self._sessions[reg.tunnel_id] = session
            self._per_ip[source[0]] = self._per_ip.get(source[0], 0) + 1
            self.counters.sessions_created += 1
        slot = session.slot(reg.direction)
        if slot.address != source:
            slot.address = source
            slot.last_media = None  # the grace window belongs to the address that carried media
        session.last_seen = now
        return None

    def _on_media(self, data: bytes, source: Address, now: float) -> list[Send]:
        session = self._sessions.get(uuid.UUID(bytes=data[:PREFIX_LEN]))
        if session is None:
            self.counters.dropped_unknown_tunnel += 1
            return []
        if source == session.ingress.address:
            from_dir: Direction = "ingress"
            src_slot, dst_slot = session.ingress, session.egress
        elif source == session.egress.address:
            from_dir = "egress"
            src_slot, dst_slot = session.egress, session.ingress
        else:
            self.counters.dropped_unknown_source += 1
            return []
        session.last_seen = now  # a datagram from either side keeps the session alive
        destination = dst_slot.address
        if destination is None:
            self.counters.dropped_half_latched += 1
            return []
        if destination == source:
            self.counters.dropped_loop += 1
            return []
        payload = len(data) - PREFIX_LEN
        src_slot.last_media = now
        session.datagrams += 1
        self.counters.datagrams_forwarded += 1
        self.counters.bytes_forwarded += payload
        if from_dir == "ingress":
            session.bytes_ingress += payload
            self.counters.bytes_ingress += payload
        else:
            session.bytes_egress += payload
            self.counters.bytes_egress += payload
        return [(data, destination)]

    # -- timers and admin

    def reap(self, now: float) -> list[uuid.UUID]:
        """Remove sessions with no datagram from either side for ``idle_s``; returns their ids."""
        gone = [tid for tid, s in self._sessions.items() if now - s.last_seen >= self._idle_s]
        for tid in gone:
            self._remove(tid)
        self.counters.sessions_reaped += len(gone)
        return gone

    def close(self, tunnel_id: uuid.UUID) -> bool:
        """Drop a session at once (admin DELETE / ``close_tunnel``); False when there was none."""
        if tunnel_id not in self._sessions:
            return False
        self._remove(tunnel_id)
        return True

    def _remove(self, tunnel_id: uuid.UUID) -> None:
        session = self._sessions.pop(tunnel_id)
        left = self._per_ip[session.creator_ip] - 1
        if left:
            self._per_ip[session.creator_ip] = left
        else:
            del self._per_ip[session.creator_ip]
