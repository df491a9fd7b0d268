"""``RelayService``: the relay process's state and its one set of answers (REST, manager, metrics).

It composes the parts and owns nothing protocol-specific itself:

- the tunnel table (``control.RelayTunnels``, sans-IO) and the QUIC plane around it
  (``quic_relay.QuicRelay``; tests pass a stand-in through :data:`QuicFactory`);
- the native UDP plane (``native_plane.NativePlane``) and its socket driver
  (``native_driver.NativeDriver``); a port that cannot be bound drops the ``udp-relay``
  capability and the relay runs with QUIC only (interop.md 9);
- the manager link (``appliance.manager_client.ManagerClient`` with ``manager_link.RelayLinkHost``);
- uptime, and a sampler that once a second takes the forwarded-byte counter for
  ``total_bandwidth_bps`` and notes when the manager link went down.

:meth:`stats`, :meth:`health`, :meth:`tunnel_list`, :meth:`edge_list` and :meth:`session_list` are
the REST shapes of the relay interface §2; the routes, the manager commands and the metrics all
read them, so the three never disagree. What each counter counts is in ``docs/relay.md``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

import trio
from pydantic import SecretStr

from appliance import errors
from appliance.manager_client import ALLOW_INSECURE_ENV, ManagerClient
from appliance.models.config import ManagerConfig, split_host_port
from appliance.models.manager_link import LinkState
from appliance.protocol import EventPayload
from appliance.quic import open_udp_socket
from appliance.relayproto import BindAuthorization, bind_allowed
from services.relay.config import RelayConfig, RelayConfigStore
from services.relay.control import (
    BindRejected,
    ConnectionClosed,
    LegBound,
    LegReleased,
    RelayTunnels,
    TunnelRemoved,
    TunnelStatus,
)
from services.relay.native_driver import NativeDriver, RegisterRefused, bind_native_socket
from services.relay.native_plane import Direction, NativePlane, Session

__all__ = ["TUNNEL_NOT_FOUND", "UDP_SESSION_NOT_FOUND", "QuicFactory", "QuicPlane", "RelayService"]

_log = logging.getLogger("mediaplane.relay")

SAMPLE_INTERVAL_S: Final = 1.0
"""The reporting window of ``total_bandwidth_bps`` (and the stats cadence of interop.md 6)."""
CAPABILITY_UDP_RELAY: Final = "udp-relay"
TUNNEL_NOT_FOUND: Final = "Tunnel '{}' not found"
UDP_SESSION_NOT_FOUND: Final = "UDP session '{}' not found"
EDGE_NOT_FOUND: Final = "Edge '{}' is not connected"
ADMIN_CLOSED: Final = "closed by the relay administrator"


# --------------------------------------------------------------------------- what the QUIC plane offers
class TrafficCounters(Protocol):
    """``quic_relay.QuicTraffic``: relay-wide lifetime counters of the QUIC plane."""

    bytes_ingress: int
    bytes_egress: int
    bytes_forwarded: int
    udp_datagrams: int
    tcp_streams_total: int
    tcp_streams_active: int


class TunnelCounters(Protocol):
    """``quic_relay.TunnelTraffic``: one tunnel's counters."""

    bytes_ingress: int
    bytes_egress: int
    tcp_streams_total: int
    tcp_streams_active: int
    udp_datagrams_total: int


class QuicPlane(Protocol):
    """What the service uses of ``quic_relay.QuicRelay``."""

    @property
    def traffic(self) -> TrafficCounters: ...

    def tunnel_traffic(self, tunnel_id: str) -> TunnelCounters: ...

    def edges(self) -> list[tuple[str, str]]: ...

    def disconnect_edge(self, edge_id: str) -> bool: ...

    def close_tunnel(self, tunnel_id: str, reason: str = ...) -> bool: ...

    async def serve(self, sock: trio.socket.SocketType, *, task_status: trio.TaskStatus[Any] = ...) -> None: ...


QuicFactory = Callable[[RelayTunnels, bytes | None, bytes | None, Callable[[object], None]], QuicPlane]
"""``(tunnels, certificate_pem, private_key_pem, on_event) -> QuicPlane``."""


def default_quic_factory(
    tunnels: RelayTunnels, cert: bytes | None, key: bytes | None, on_event: Callable[[object], None]
) -> QuicPlane:
    """``quic_relay.QuicRelay`` on trio's clock, so the table's times and the service's agree."""
    from services.relay.quic_relay import QuicRelay

    return QuicRelay(tunnels, certificate_pem=cert, private_key_pem=key, on_event=on_event, clock=trio.current_time)


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_tunnel_id(text: str) -> uuid.UUID:
    """A tunnel id as the REST path carries it; InvalidInput (400) otherwise (no value echoed)."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise errors.InvalidInput("invalid tunnel id: expected a UUID") from None


def _session_status(session: Session) -> str:
    ingress, egress = session.ingress.address is not None, session.egress.address is not None
    if ingress and egress:
        return "active"
    if egress:
        return "waiting_ingress"
    if ingress:
        return "waiting_egress"
    return "empty"


def _addr(address: tuple[str, int] | None) -> str | None:
    return None if address is None else _shown(*address)


class RelayService:
    """The relay: ``await nursery.start(service.run)``, then read it or send it commands."""

    def __init__(
        self,
        store: RelayConfigStore,
        *,
        version: str,
        quic_factory: QuicFactory = default_quic_factory,
    ) -> None:
        self.store = store
        self.config: RelayConfig = store.config
        self.version = version
        self.tunnels = RelayTunnels(
            software_version=version,
            require_bind_auth=self.config.require_bind_auth,
            max_tunnels_per_connection=self.config.max_tunnels_per_connection,
            max_connections_per_ip=self.config.max_connections_per_ip,
        )
        self.plane = NativePlane(self._verify_native_bind, max_sessions_per_ip=self.config.max_connections_per_ip)
        self._quic_factory = quic_factory
        self.quic: QuicPlane | None = None
        self.native: NativeDriver | None = None
        self.quic_bound: str | None = None
        self.udp_bound: str | None = None
        self.link_config: ManagerConfig | None = self.config.manager
        self.allow_insecure = os.environ.get(ALLOW_INSECURE_ENV) == "1"
        from services.relay.manager_link import RelayLinkHost

        self.manager_link = ManagerClient(RelayLinkHost(self), allow_insecure=self.allow_insecure)
        self.started_at = trio.current_time()
        self.bandwidth_bps = 0
        self._last_sample: tuple[float, int] | None = None
        self._link_down_since: float | None = None
        self._persist_lock = trio.Lock()

    # ------------------------------------------------------------------ running
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the planes, start every task, report started; runs until cancelled.

        Raises OSError when the QUIC port cannot be bound (the relay is useless without it);
        the UDP-plane port only costs the ``udp-relay`` capability.
        """
        config = self.config
        self.started_at = trio.current_time()
        self._link_down_since = self.started_at
        async with trio.open_nursery() as nursery:
            cert, key = self._tls_pair()
            self.quic = self._quic_factory(self.tunnels, cert, key, self.on_quic_event)
            sock = await _bind_udp(config.quic_addr)
            name = sock.getsockname()
            self.quic_bound = _shown(name[0], name[1])
            await nursery.start(self.quic.serve, sock)
            if config.udp_relay_enabled:
                try:
                    native_sock = bind_native_socket(config.udp_relay_addr)
                except OSError as exc:
                    _log.warning(
                        "cannot bind the native UDP plane on %s (%s): running without %s",
                        config.udp_relay_addr,
                        exc.strerror or type(exc).__name__,
                        CAPABILITY_UDP_RELAY,
                    )
                else:
                    self.native = NativeDriver(self.plane, native_sock, on_register_refused=self.on_register_refused)
                    self.udp_bound = self.native.local_address
                    await nursery.start(self.native.run)
            nursery.start_soon(self._sample)
            nursery.start_soon(self.manager_link.run)
            task_status.started()

    def _tls_pair(self) -> tuple[bytes | None, bytes | None]:
        config = self.config
        if config.tls_cert_path is None or config.tls_key_path is None:
            return None, None  # QuicRelay generates a self-signed certificate in memory
        try:
            return Path(config.tls_cert_path).read_bytes(), Path(config.tls_key_path).read_bytes()
        except OSError as exc:
            raise errors.ConfigFileError(
                f"cannot read the TLS certificate or key: {exc.filename}: {exc.strerror}"
            ) from None

    async def _sample(self) -> None:
        """Once a second: the forwarded-byte delta (``total_bandwidth_bps``) and the link's state."""
        while True:
            now = trio.current_time()
            forwarded = self.bytes_forwarded()
            if self._last_sample is not None:
                then, before = self._last_sample
                elapsed = now - then
                if elapsed > 0:
                    self.bandwidth_bps = int((forwarded - before) * 8 / elapsed)
            self._last_sample = (now, forwarded)
            self._note_link(now)
            await trio.sleep(SAMPLE_INTERVAL_S)

    def _note_link(self, now: float) -> None:
        if self.manager_link.connected.is_set():
            self._link_down_since = None
        elif self._link_down_since is None:
            self._link_down_since = now

    # ------------------------------------------------------------------ bind checks
    def _verify_native_bind(self, tunnel_id: uuid.UUID, direction: Direction, token: str | None) -> bool:
        """interop.md 8.4 for a native ``register``: the same authorizations as QUIC binds."""
        return bind_allowed(
            self.tunnels.authorization(str(tunnel_id)),
            direction,
            token,
            require_bind_auth=self.tunnels.require_bind_auth,
        )

    # ------------------------------------------------------------------ events (interop.md 11)
    def on_quic_event(self, event: object) -> None:
        """QuicRelay's ``on_event``: the manager-worthy ones become ``edge``/``tunnel`` events."""
        kind = type(event).__name__
        if kind == "EdgeConnected":
            self.publish("info", "edge", f"edge connected from {getattr(event, 'remote_addr', '?')}")
        elif kind == "EdgeDisconnected":
            edge_id = getattr(event, "edge_id", None) or getattr(event, "remote_addr", "?")
            self.publish("warning", "edge", f"edge {edge_id} disconnected")
        elif isinstance(event, LegBound):
            if event.ready:
                self.publish("info", "tunnel", f"tunnel {event.tunnel_id} ready")
        elif isinstance(event, BindRejected):
            self.publish(
                "critical", "tunnel", f"bind rejected for tunnel {event.tunnel_id} ({event.direction}): {event.reason}"
            )
        elif isinstance(event, LegReleased):
            self.publish(
                "warning", "tunnel", f"tunnel {event.tunnel_id} down: {event.direction} leg gone ({event.reason})"
            )
        elif isinstance(event, TunnelRemoved):
            self.publish("info", "tunnel", f"tunnel {event.tunnel_id} removed")
        elif isinstance(event, ConnectionClosed):
            _log.info("QUIC connection %s closed: %s", event.connection_id, event.reason)
        else:
            _log.debug("QUIC plane: %s", kind)

    def on_register_refused(self, refused: RegisterRefused) -> None:
        severity = "critical" if refused.reason == "auth" else "warning"
        why = "bind authentication failed" if refused.reason == "auth" else refused.reason.replace("_", " ")
        self.publish(
            severity,
            "tunnel",
            f"native UDP register refused for tunnel {refused.tunnel_id} ({refused.direction}) "
            f"from {refused.source}: {why}",
        )

    def publish(self, severity: str, category: str, message: str) -> None:
        """Log an event and queue it for the manager (queued whatever the link's state)."""
        level = {"info": logging.INFO, "warning": logging.WARNING}.get(severity, logging.ERROR)
        _log.log(level, "event %s/%s: %s", category, severity, message)
        self.manager_link.enqueue_event(EventPayload(severity=severity, category=category, message=message))

    # ------------------------------------------------------------------ reads (relay interface §2)
    def uptime_secs(self) -> int:
        return int(trio.current_time() - self.started_at)

    def bytes_forwarded(self) -> int:
        quic = self.quic.traffic.bytes_forwarded if self.quic is not None else 0
        return quic + self.plane.counters.bytes_forwarded

    def active_tunnels(self) -> int:
        return sum(1 for entry in self.tunnels.tunnels.values() if entry.status is TunnelStatus.READY)

    def connected_edges(self) -> int:
        return self.tunnels.active_connections

    @property
    def capabilities(self) -> list[str]:
        return [CAPABILITY_UDP_RELAY] if self.native is not None else []

    def stats(self) -> dict[str, int]:
        """``GET /api/v1/stats`` (relay interface §2): both planes added up (docs/relay.md)."""
        native = self.plane.counters
        traffic = self.quic.traffic if self.quic is not None else None
        counters = self.tunnels.counters
        return {
            "uptime_secs": self.uptime_secs(),
            "connected_edges": self.connected_edges(),
            "total_tunnels": self.tunnels.total_tunnels,
            "active_tunnels": self.active_tunnels(),
            "total_bytes_ingress": (traffic.bytes_ingress if traffic else 0) + native.bytes_ingress,
            "total_bytes_egress": (traffic.bytes_egress if traffic else 0) + native.bytes_egress,
            "total_bytes_forwarded": self.bytes_forwarded(),
            "total_bandwidth_bps": self.bandwidth_bps,
            "total_tcp_streams": traffic.tcp_streams_total if traffic else 0,
            "active_tcp_streams": traffic.tcp_streams_active if traffic else 0,
            "total_udp_datagrams": (traffic.udp_datagrams if traffic else 0) + native.datagrams_forwarded,
            "peak_tunnels": counters.peak_tunnels,
            "peak_edges": counters.peak_connections,
            "connections_total": counters.connections_total,
        }

    def manager_configured(self) -> bool:
        manager = self.link_config
        return manager is not None and manager.enabled

    def manager_connected(self) -> bool:
        return self.manager_link.connected.is_set()

    def manager_health(self) -> dict[str, Any] | None:
        """The Health ``manager`` object; None (omitted) when no manager is configured."""
        if not self.manager_configured():
            return None
        connected = self.manager_connected()
        now = trio.current_time()
        if connected:
            self._link_down_since = None
        elif self._link_down_since is None:
            self._link_down_since = now
        down_since = self._link_down_since
        return {
            "connected": connected,
            "disconnected_secs": 0 if connected or down_since is None else int(now - down_since),
            "reconnecting": not connected and self.manager_link.status().state is not LinkState.DISABLED,
        }

    def health(self) -> dict[str, Any]:
        """``GET /health`` (relay interface §2); ``manager`` only when one is configured."""
        sessions = self.plane.sessions()
        body: dict[str, Any] = {
            "status": "ok",
            "version": self.version,
            "uptime_secs": self.uptime_secs(),
            "connected_edges": self.connected_edges(),
            "total_tunnels": self.tunnels.total_tunnels,
            "active_tunnels": self.active_tunnels(),
            "udp_sessions_total": len(sessions),
            "udp_sessions_active": sum(1 for session in sessions if session.ready),
        }
        manager = self.manager_health()
        if manager is not None:
            body["manager"] = manager
        return body

    def tunnel_list(self) -> list[dict[str, Any]]:
        """``GET /api/v1/tunnels`` entries (relay interface §2, interop.md 13)."""
        now = trio.current_time()
        result = []
        for tunnel_id, entry in sorted(self.tunnels.tunnels.items()):
            traffic = self.quic.tunnel_traffic(tunnel_id) if self.quic is not None else None
            result.append(
                {
                    "tunnel_id": tunnel_id,
                    "protocol": entry.protocol,
                    "status": entry.status.value,  # the interface's words (relay interface §3)
                    "ingress_edge_id": entry.ingress_edge_id,
                    "egress_edge_id": entry.egress_edge_id,
                    "ingress_remote_addr": entry.ingress.remote_addr if entry.ingress else None,
                    "egress_remote_addr": entry.egress.remote_addr if entry.egress else None,
                    "stats": {
                        "bytes_ingress": traffic.bytes_ingress if traffic else 0,
                        "bytes_egress": traffic.bytes_egress if traffic else 0,
                        "tcp_streams_total": traffic.tcp_streams_total if traffic else 0,
                        "tcp_streams_active": traffic.tcp_streams_active if traffic else 0,
                        "udp_datagrams_total": traffic.udp_datagrams_total if traffic else 0,
                        "uptime_secs": int(now - entry.created_at),
                    },
                }
            )
        return result

    def edge_list(self) -> list[dict[str, str]]:
        """``GET /api/v1/edges`` entries."""
        edges = self.quic.edges() if self.quic is not None else []
        return [{"edge_id": edge_id, "remote_addr": remote_addr} for edge_id, remote_addr in edges]

    def session_list(self) -> list[dict[str, Any]]:
        """``GET /api/v1/udp-sessions`` entries (relay interface §2)."""
        now = trio.current_time()
        return [
            {
                "tunnel_id": str(session.tunnel_id),
                "transport": "udp",
                "status": _session_status(session),
                "ingress_addr": _addr(session.ingress.address),
                "egress_addr": _addr(session.egress.address),
                "bytes_ingress": session.bytes_ingress,
                "bytes_egress": session.bytes_egress,
                "datagrams": session.datagrams,
                "uptime_secs": int(now - session.created),
            }
            for session in sorted(self.plane.sessions(), key=lambda s: str(s.tunnel_id))
        ]

    def public_config(self) -> dict[str, Any]:
        """``get_config``: the running config (flags applied, the link's current credentials)
        with every secret left out (interop.md 6)."""
        return self.config.model_copy(update={"manager": self.link_config}).public()

    # ------------------------------------------------------------------ changes
    def _close_live_tunnel(self, tunnel_id: str, reason: str) -> bool:
        if self.quic is not None:
            return self.quic.close_tunnel(tunnel_id, reason)
        # Without the QUIC plane no leg can be bound; the table is still the one truth.
        return self.tunnels.close_tunnel(tunnel_id, reason) is not None

    def delete_tunnel(self, text: str) -> str:
        """Admin DELETE (relay interface §3): the authorization revoked, the live entry removed,
        ``tunnel_down`` to every bound leg. InvalidInput for a bad UUID, NotFound when neither
        an entry nor an authorization existed. Answers the canonical id."""
        tunnel_id = str(_parse_tunnel_id(text))
        revoked = self.tunnels.revoke_tunnel(tunnel_id)
        closed = self._close_live_tunnel(tunnel_id, ADMIN_CLOSED)
        if not (revoked or closed):
            raise errors.NotFound(TUNNEL_NOT_FOUND.format(tunnel_id))
        _log.info(
            "change: tunnel %s deleted (authorization revoked: %s, live entry closed: %s)", tunnel_id, revoked, closed
        )
        return tunnel_id

    def delete_udp_session(self, text: str) -> str:
        """Admin DELETE / ``close_udp_session``: the native session removed at once."""
        tunnel_id = _parse_tunnel_id(text)
        if not self.plane.close(tunnel_id):
            raise errors.NotFound(UDP_SESSION_NOT_FOUND.format(tunnel_id))
        _log.info("change: UDP session %s closed", tunnel_id)
        return str(tunnel_id)

    def close_tunnel(self, text: str) -> None:
        """``close_tunnel``: like the admin DELETE on the live entry, the authorization kept
        (interop.md 13)."""
        tunnel_id = str(_parse_tunnel_id(text))
        if not self._close_live_tunnel(tunnel_id, "closed by the manager"):
            raise errors.NotFound(TUNNEL_NOT_FOUND.format(tunnel_id))
        _log.info("change: tunnel %s closed by the manager", tunnel_id)

    def disconnect_edge(self, edge_id: str) -> None:
        if self.quic is None or not self.quic.disconnect_edge(edge_id):
            raise errors.NotFound(EDGE_NOT_FOUND.format(edge_id))
        _log.info("change: edge %s disconnected by the manager", edge_id)

    def authorize_tunnel(self, tunnel_id: str, ingress_token: SecretStr, egress_token: SecretStr) -> None:
        """``authorize_tunnel`` (interop.md 8.4): overwrites any earlier entry."""
        canonical = str(_parse_tunnel_id(tunnel_id))
        self.tunnels.authorize_tunnel(
            BindAuthorization(canonical, ingress_token.get_secret_value(), egress_token.get_secret_value())
        )
        _log.info("change: tunnel %s authorized", canonical)

    def revoke_tunnel(self, tunnel_id: str) -> None:
        canonical = str(_parse_tunnel_id(tunnel_id))
        if not self.tunnels.revoke_tunnel(canonical):
            raise errors.NotFound(f"Tunnel '{canonical}' has no authorization")
        _log.info("change: tunnel %s authorization revoked", canonical)

    # ------------------------------------------------------------------ manager credentials
    async def save_manager_credentials(self, node_id: str, node_secret: SecretStr) -> None:
        """``register_ack`` (interop.md 1.2): relay.json rewritten at 0600 with ``manager.node_id``
        and ``manager.node_secret``, ``registration_token`` cleared. A failed write is logged and
        reported; the credentials stay in memory so this run keeps its link."""
        async with self._persist_lock:
            current = self.link_config or ManagerConfig()
            self.link_config = current.model_copy(
                update={"node_id": uuid.UUID(node_id), "node_secret": node_secret, "registration_token": None}
            )
            new = self.store.with_credentials(node_id, node_secret)
            try:
                await trio.to_thread.run_sync(self.store.save, new)
            except errors.PersistFailed as exc:
                _log.error("persisting the manager credentials failed: %s", exc.message)
                self.publish("warning", "manager", f"persisting the manager credentials failed: {exc.message}")
                return
            _log.info("change: manager credentials saved to %s node=%s", self.store.path, node_id)

    async def rotate_manager_secret(self, new_secret: SecretStr) -> None:
        """``rotate_secret``: persisted before the ack (PersistFailed: the ack fails, the old
        secret stays); the next connection uses it."""
        async with self._persist_lock:
            if self.link_config is None:
                raise errors.InvalidInput("the manager link is not configured")
            await trio.to_thread.run_sync(self.store.save, self.store.with_secret(new_secret))
            self.link_config = self.link_config.model_copy(update={"node_secret": new_secret})
            _log.info("change: manager secret rotated node=%s", self.link_config.node_id)


async def _bind_udp(address: str) -> trio.socket.SocketType:
    """The QUIC socket, with the 2 MB send and receive buffers of the relay spec (section 8)."""
    host, port = split_host_port(address)
    return open_udp_socket((host.strip("[]"), port))
