"""The edge's side of its manager link: what ``appliance.manager_client.ManagerClient`` needs of it.

The client (TLS, auth, reconnection, the event queue) is shared with the relay; this module
is the edge's answer to each of its questions:

- **settings**: the ``manager`` block the link runs with (``EdgeService.link_config``: read at
  start, changed by registration, ``rotate_secret`` and a config change that touches it, not
  by the setup wizard, whose save takes effect at restart as interop.md 3 says);
- **credentials**: a ``register_ack`` is persisted at once: ``manager.node_id`` to
  ``config.json``, the secret to ``secrets.json``, the token cleared, ``setup_enabled: false``
  (interop.md 6 "Credential persistence");
- **stats and health**: built from the one stats snapshot the REST routes, the WebSocket
  stream and Prometheus read (interop.md 6 table);
- **commands**: each through the same ``EdgeService`` method its REST route calls, validated
  with the same models, so the ack's error text is the REST error text (interop.md 6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from pydantic import SecretStr, TypeAdapter

from appliance.config.store import fill_kept_secrets
from appliance.http.app import validate
from appliance.manager_client import CommandOutcome, LinkSettings, command_outcome
from appliance.models.config import AppConfig, FlowConfig, ManagerConfig, OutputConfig, TunnelConfig
from appliance.models.events import Event
from appliance.models.stats import HealthStatus
from appliance.protocol import (
    AddOutput,
    AnyAction,
    CreateFlow,
    CreateTunnel,
    DeleteFlow,
    DeleteTunnel,
    DeviceType,
    GetConfig,
    HealthPayload,
    NodeCredentials,
    RemoveOutput,
    RestartFlow,
    RotateSecret,
    StartFlow,
    StatsPayload,
    StopFlow,
    UpdateConfig,
    UpdateFlow,
    edge_health_payload,
    edge_stats_payload,
)

if TYPE_CHECKING:
    from services.edge.service import EdgeService

__all__ = ["EdgeLinkHost", "link_settings_of"]

_FLOW: Final = TypeAdapter(FlowConfig)
_OUTPUT: Final = TypeAdapter[OutputConfig](OutputConfig)
_APP_CONFIG: Final = TypeAdapter(AppConfig)
_TUNNEL: Final = TypeAdapter(TunnelConfig)


def link_settings_of(manager: ManagerConfig | None) -> LinkSettings | None:
    """The client's settings for a ``manager`` block; None when the link is off."""
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


class EdgeLinkHost:
    """The ``LinkHost`` of an ``EdgeService``."""

    device_type = DeviceType.EDGE

    def __init__(self, service: EdgeService) -> None:
        self._service = service
        self.software_version = service.version

    def link_settings(self) -> LinkSettings | None:
        return link_settings_of(self._service.link_config)

    async def persist_credentials(self, node_id: str, node_secret: SecretStr) -> None:
        await self._service.save_manager_credentials(node_id, node_secret)

    def stats_payload(self) -> StatsPayload:
        snapshot = self._service.snapshot()
        return edge_stats_payload(
            flows=snapshot.flows,
            tunnels=[tunnel.model_dump(mode="json") for tunnel in snapshot.tunnels],
            uptime_secs=snapshot.system.uptime_secs,
            active_flows=snapshot.system.active_flows,
            total_flows=snapshot.system.total_flows,
        )

    def health_payload(self) -> HealthPayload:
        service = self._service
        server = service.config.server
        health = HealthStatus(
            version=service.version,
            uptime_secs=service.uptime_secs(),
            active_flows=service.active_flows(),
            total_flows=len(service.config.flows),
        )
        shown = f"[{server.listen_addr}]" if ":" in server.listen_addr else server.listen_addr
        return edge_health_payload(health, api_addr=f"{shown}:{server.listen_port}", monitor_addr=None)

    def link_event(self, event: Event) -> None:
        self._service.publish(event)

    async def run_command(self, action: AnyAction) -> CommandOutcome:
        """Carry out one edge action (interop.md 6 "Edge actions"); errors become the ack's text."""
        return await command_outcome(self._run(action))

    async def _run(self, action: AnyAction) -> CommandOutcome:
        service = self._service
        match action:
            case GetConfig():
                return CommandOutcome(success=True, config=service.public_config())
            case CreateFlow(flow=raw):
                await service.create_flow(validate(_FLOW, dict(raw)))
            case UpdateFlow(flow_id=flow_id, flow=raw):
                service.flow(flow_id)  # 404 before the body, as the REST route
                body: dict[str, Any] = {**raw, "id": flow_id}
                await service.update_flow(flow_id, validate(_FLOW, body))
            case DeleteFlow(flow_id=flow_id):
                await service.delete_flow(flow_id)
            case StartFlow(flow_id=flow_id):
                await service.start_flow(flow_id)
            case StopFlow(flow_id=flow_id):
                await service.stop_flow(flow_id)
            case RestartFlow(flow_id=flow_id):
                await service.restart_flow(flow_id)
            case AddOutput(flow_id=flow_id, output=raw):
                service.flow(flow_id)
                await service.add_output(flow_id, validate(_OUTPUT, dict(raw)))
            case RemoveOutput(flow_id=flow_id, output_id=output_id):
                await service.remove_output(flow_id, output_id)
            case UpdateConfig(config=raw):
                # interop.md 2.7: stored secrets the manager was never shown are kept.
                body = fill_kept_secrets(dict(raw), service.config)
                await service.apply_config_change(validate(_APP_CONFIG, body))
            case RotateSecret(new_secret=new_secret):
                await service.rotate_manager_secret(new_secret)
            case CreateTunnel(tunnel=raw):
                await service.create_tunnel(validate(_TUNNEL, dict(raw)))
            case DeleteTunnel(tunnel_id=tunnel_id):
                await service.delete_tunnel(tunnel_id)
            case _:
                return CommandOutcome(success=False, error=f"Unknown command: {action.type}")
        return CommandOutcome(success=True)
