"""The relay's side of its manager link: what ``appliance.manager_client.ManagerClient`` needs of it.

The client (TLS, auth, reconnection, the event queue of 1,000) is shared with the edge; this
module answers its questions for a relay (``device_type`` ``relay``):

- **settings**: the ``manager`` block of ``relay.json`` (``RelayService.link_config``: read at
  start, changed by registration and ``rotate_secret``);
- **credentials**: a ``register_ack`` rewrites ``relay.json`` at 0600 with ``manager.node_id`` and
  ``manager.node_secret``, ``registration_token`` cleared (interop.md 1.2);
- **stats and health** (interop.md 6 table): the REST Stats object plus ``udp_sessions_active``;
  the REST Health object plus ``quic_addr``, ``public_quic_addr``, ``public_udp_addr`` and
  ``capabilities``;
- **commands** (interop.md 6 "Relay actions"): each through the same ``RelayService`` method the
  REST routes use, so an ack's error text is the REST error text; the ``list_*`` results are
  ``command_ack.data`` in the REST shapes. Anything else is ``Unknown command: <type>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import SecretStr

from appliance.manager_client import CommandOutcome, LinkSettings, command_outcome
from appliance.models.events import Event
from appliance.protocol import (
    AnyAction,
    AuthorizeTunnel,
    CloseTunnel,
    CloseUdpSession,
    DeviceType,
    DisconnectEdge,
    GetConfig,
    HealthPayload,
    ListEdges,
    ListTunnels,
    ListUdpSessions,
    NodeCredentials,
    RevokeTunnel,
    RotateSecret,
    StatsPayload,
)

if TYPE_CHECKING:
    from services.relay.service import RelayService

__all__ = ["RelayLinkHost"]


class RelayLinkHost:
    """The ``LinkHost`` of a ``RelayService``."""

    device_type = DeviceType.RELAY

    def __init__(self, service: RelayService) -> None:
        self._service = service
        self.software_version = service.version

    def link_settings(self) -> LinkSettings | None:
        manager = self._service.link_config
        if manager is None or not manager.enabled or manager.url is None:
            return None
        return LinkSettings(
            url=str(manager.url),
            credentials=NodeCredentials(
                node_id=str(manager.node_id) if manager.node_id is not None else None,
                node_secret=manager.node_secret,
                registration_token=manager.registration_token,
            ),
            accept_self_signed_cert=manager.accept_self_signed_cert,
            cert_fingerprint=manager.cert_fingerprint,
        )

    async def persist_credentials(self, node_id: str, node_secret: SecretStr) -> None:
        await self._service.save_manager_credentials(node_id, node_secret)

    def stats_payload(self) -> StatsPayload:
        service = self._service
        return StatsPayload({**service.stats(), "udp_sessions_active": service.health()["udp_sessions_active"]})

    def health_payload(self) -> HealthPayload:
        service = self._service
        config = service.config
        return HealthPayload(
            {
                **service.health(),
                "quic_addr": service.quic_bound or config.quic_addr,
                "public_quic_addr": config.public_quic_addr,
                "public_udp_addr": config.public_udp_addr,
                "capabilities": service.capabilities,
            }
        )

    def link_event(self, event: Event) -> None:
        """The link's own events (category ``manager``), queued like the relay's others."""
        self._service.publish(event.severity.value, event.category.value, event.message)

    async def run_command(self, action: AnyAction) -> CommandOutcome:
        """Carry out one relay action (interop.md 6); errors become the ack's text."""
        return await command_outcome(self._run(action))

    async def _run(self, action: AnyAction) -> CommandOutcome:
        service = self._service
        match action:
            case GetConfig():
                return CommandOutcome(success=True, config=service.public_config())
            case ListTunnels():
                return CommandOutcome(success=True, data={"tunnels": service.tunnel_list()})
            case ListEdges():
                return CommandOutcome(success=True, data={"edges": service.edge_list()})
            case ListUdpSessions():
                return CommandOutcome(success=True, data={"sessions": service.session_list()})
            case DisconnectEdge(edge_id=edge_id):
                service.disconnect_edge(edge_id)
            case CloseTunnel(tunnel_id=tunnel_id):
                service.close_tunnel(tunnel_id)
            case CloseUdpSession(tunnel_id=tunnel_id):
                service.delete_udp_session(tunnel_id)
            case AuthorizeTunnel(tunnel_id=tunnel_id, ingress_token=ingress, egress_token=egress):
                service.authorize_tunnel(tunnel_id, ingress, egress)
            case RevokeTunnel(tunnel_id=tunnel_id):
                service.revoke_tunnel(tunnel_id)
            case RotateSecret(new_secret=new_secret):
                await service.rotate_manager_secret(new_secret)
            case _:
                return CommandOutcome(success=False, error=f"Unknown command: {action.type}")
        return CommandOutcome(success=True)
