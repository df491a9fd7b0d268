"""EdgeService: owns the configuration and the flows' lifecycle; decides.

Routes translate HTTP to these calls; the manager link calls the same methods, so
every rule (404, 409, persistence order) lives here once. Mutations are serialised
by one lock and, once they hold it, shielded from cancellation: a client that
disconnects mid-request cannot strand a flow half-started (the engine's own command
timeout bounds the wait). Every mutation validates the whole resulting
configuration (the model's limits, the kinds this engine runs, the listening-address
clash rule) before it is persisted, and a change is persisted before it is applied,
so a refused or failed write leaves both the file and the running state as they were.

States change only through ``FlowLifecycle.fire`` (``lifecycle.py``); each change is
one event on the bus (``events.py``), beside the engine's own events.

Tunnels (interop.md 2.6) follow the same rules (one lock, validated, persisted before they
are applied); ``TunnelSupervisor`` runs them in the tunnel worker process and reports their
state, which is the worker's (``Connecting``, ``Waiting``, ``Connected``, ``Failed``), or
``Stopped`` for a disabled tunnel.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import shlex
import sys
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Final

import trio
from pydantic import SecretStr, ValidationError

from appliance import errors
from appliance.config.store import EdgeConfigStore, ensure_jwt_secret, merge_kept_secrets, public_config
from appliance.http.envelope import describe_validation_error
from appliance.manager_client import ALLOW_INSECURE_ENV, ManagerClient
from appliance.models.config import AppConfig, FlowConfig, ManagerConfig, OutputConfig, TunnelConfig, UdpOutput
from appliance.models.events import Event, EventCategory, StoredEvent, critical, info, warning
from appliance.models.kinds import find_clash
from appliance.models.stats import FlowCounters, FlowState, StatsSnapshot, TunnelSummary
from services.edge.config_diff import plan_config_change
from services.edge.engine.kinds import check_output_supported, check_supported
from services.edge.engine.supervisor import WORKER_NICE, WORKER_REALTIME, Engine, EngineError
from services.edge.events import EventBus
from services.edge.lifecycle import FlowLifecycle, Trigger
from services.edge.manager_link import EdgeLinkHost
from services.edge.nmos.node import NmosNode
from services.edge.rtmps_cert import rtmps_files
from services.edge.stats import StatsAggregator
from services.edge.tunnels.supervisor import TunnelError, TunnelSupervisor
from services.edge.webrtc.supervisor import WebrtcSupervisor

_log = logging.getLogger("mediaplane.edge")
RESTART_LOST_AFTER_S = 1.0  # the supervisor restarts a dead worker; then its flows come back
# POST /setup/restart (docs/edge.md): mp-edge stops cleanly and exits with this status. The unit
# has Restart=on-failure (a clean exit 0 is not restarted) and RestartPreventExitStatus=2 only,
# so systemd starts it again after RestartSec. 75 is EX_TEMPFAIL: "try again".
RESTART_EXIT_STATUS: Final = 75
RESTART_COMMAND: Final = "systemctl restart mp-edge"
RESTART_DELAY_S: Final = 0.2  # the 202 goes out before the API stops
SETUP_DISABLED: Final = "Setup wizard is disabled on this node"
WATCH_OUTPUT_ID: Final = "mp-status-watch"  # the hidden tap of a flow watched on the status page


class FlowNotFound(errors.NotFound):
    def __init__(self, flow_id: str) -> None:
        super().__init__(f"flow '{flow_id}' not found")


class OutputNotFound(errors.NotFound):
    def __init__(self, flow_id: str, output_id: str) -> None:
        super().__init__(f"output '{output_id}' not found in flow '{flow_id}'")


class TunnelNotFound(errors.NotFound):
    def __init__(self, tunnel_id: str) -> None:
        super().__init__(f"tunnel '{tunnel_id}' not found")


def tunnel_key(tunnel_id: str) -> str:
    """A tunnel id as the config spells it (``str(uuid.UUID)``: lower case, hyphens); any
    other text is returned as it is (it then matches no tunnel: 404)."""
    try:
        return str(uuid.UUID(tunnel_id))
    except ValueError:
        return tunnel_id


class EngineFailed(errors.Internal):
    """The engine could not do what was asked (500, the engine's reason in the text)."""


def validate_config(config: AppConfig, changed: Iterable[str] | None = None) -> AppConfig:
    """The whole configuration checked as it would be persisted, or the error to answer.

    - the model again, from scratch (``model_copy`` does not validate: the 1,024-flow and
      64-output limits and every cross-field rule hold for the result, so a node never
      writes a config.json it would refuse at its next start) → 400;
    - the kinds this engine runs (``changed`` flows only, or all) → 400;
    - no two listening addresses clash (``appliance.models.kinds.find_clash``) → 409
      naming the flow that holds the address.
    """
    try:
        config = AppConfig.model_validate(config.model_dump())
    except ValidationError as exc:
        raise errors.InvalidInput(f"Validation failed: {describe_validation_error(exc)}") from None
    changed_ids = set(changed) if changed is not None else None
    for flow in config.flows:
        if changed_ids is None or flow.id in changed_ids:
            check_supported(flow)
    clash = find_clash(config.flows, changed_ids)
    if clash is not None:
        raise errors.Conflict(clash.message())
    return config


class EdgeService:
    """The edge's state and decisions. Build it, then ``await run(...)`` it in a nursery."""

    def __init__(
        self,
        store: EdgeConfigStore,
        config: AppConfig,
        *,
        version: str,
        workers: int,
        log_level: str,
        pin_cpus: bool = False,
        worker_nice: int = WORKER_NICE,
        worker_realtime: int = WORKER_REALTIME,
        tunnel_runner: str | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.version = version
        self.started_at = trio.current_time()
        self.events = EventBus()
        self.lifecycle = FlowLifecycle(self.events.publish, trio.current_time)
        self.stats = StatsAggregator(version, self.started_at, self.lifecycle)
        self.webrtc = WebrtcSupervisor(log_level=log_level, on_watch_idle=self._on_watch_idle)
        # Watch (status page): one offer or teardown at a time per flow, so that the tap is added
        # once and the viewer cap holds for concurrent offers; the port each flow's tap sends to.
        self._watch_locks: dict[str, trio.Lock] = {}
        self._watch_taps: dict[str, int] = {}
        self.engine = Engine(
            workers=workers,
            on_stats=self._on_counters,
            on_flow_failed=self._on_flow_failed,
            on_workers_lost=self._on_workers_lost,
            on_event=self.events.publish,
            log_level=log_level,
            pin_cpus=pin_cpus,
            worker_nice=worker_nice,
            worker_realtime=worker_realtime,
            webrtc_socket=self.webrtc.socket_path,
        )
        self.stats.worker_of = self.engine.worker_index_of
        # tunnel_runner: "module:attribute" of the runner factory the tunnel worker loads
        # (None: services.edge.tunnels.runner:TunnelRunner; tests give a fake).
        # RTMPS inputs serve server.tls's pair, else one generated beside the config at first use.
        self.engine.rtmp_tls = lambda: rtmps_files(self.config, self.store.config_dir)
        self.tunnel_supervisor = TunnelSupervisor(
            on_event=self.events.publish, software_version=version, log_level=log_level, runner=tunnel_runner
        )
        self.nmos = NmosNode(self)
        """IS-04/IS-05 resources (one version tracker from boot) and registration (issue 17)."""
        self._lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self.snapshot_listeners: list[Callable[[StatsSnapshot], None]] = []
        # The manager link (services/edge/manager_link.py) runs with link_config: the block
        # read at start, followed by every persisted change except the setup wizard's, which
        # takes effect at restart (interop.md 3).
        self.link_config: ManagerConfig | None = config.manager
        self.allow_insecure = os.environ.get(ALLOW_INSECURE_ENV) == "1"
        self.manager_link = ManagerClient(EdgeLinkHost(self), allow_insecure=self.allow_insecure)
        # What is in force in this process, for the wizard's GET /setup/runtime: main sets
        # ``listening`` (scheme, address, port) and ``stop_process`` once the API listens.
        self.listen_at_start = (config.server.listen_addr, config.server.listen_port)
        self.listening: tuple[str, str, int] | None = None
        self.stop_process: Callable[[], None] | None = None
        self.exit_status = 0  # RESTART_EXIT_STATUS once POST /setup/restart asked for it
        self.events.listeners.append(self._to_manager)
        for flow in config.flows:
            self.lifecycle.add(flow.id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the engine and every enabled flow, then tick stats until cancelled.

        Enabled tunnels start in the background (the tunnel worker is spawned for them), so
        the API does not wait for the tunnel worker's imports."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.webrtc.run)
            await nursery.start(self.engine.run)
            await nursery.start(self.tunnel_supervisor.run)
            async with self._lock:
                for flow in self.config.flows:
                    if flow.enabled:
                        await self._start(flow, raise_errors=False)
            nursery.start_soon(self._start_tunnels_at_boot)
            nursery.start_soon(self._tick)
            nursery.start_soon(self.manager_link.run)
            await nursery.start(self.nmos.run)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await self.engine.shutdown()
                    await self.tunnel_supervisor.shutdown()
                    await self.webrtc.shutdown()

    async def _start_tunnels_at_boot(self) -> None:
        async with self._mutating():
            for tunnel in self.config.tunnels:
                if tunnel.enabled:
                    await self._start_tunnel(tunnel, raise_errors=False)

    async def _tick(self) -> None:
        """Once a second: one snapshot pushed to every listener (WebSocket clients)."""
        while True:
            await trio.sleep(1.0)
            if not self.snapshot_listeners:
                continue
            snapshot = self.snapshot()
            for listener in list(self.snapshot_listeners):
                listener(snapshot)

    @asynccontextmanager
    async def _mutating(self) -> AsyncIterator[None]:
        """One mutation at a time; once it holds the lock, a cancelled request does not cut it short."""
        async with self._lock:
            with trio.CancelScope(shield=True):
                yield

    def publish(self, event: Event) -> None:
        """An event of the control process onto the bus."""
        self.events.publish(event)

    def _to_manager(self, event: StoredEvent) -> None:
        # interop.md 6 "Node client": every event goes to the manager, queued while the link is down.
        if self.link_config is not None and self.link_config.enabled:
            self.manager_link.enqueue_event(event)

    # ------------------------------------------------------------------ engine callbacks

    def _on_counters(self, flows: dict[str, FlowCounters]) -> None:
        self.stats.on_counters(flows, trio.current_time())

    def _on_flow_failed(self, flow_id: str, error: str) -> None:
        if self.lifecycle.allows(flow_id, Trigger.FAILED):
            self.lifecycle.fire(flow_id, Trigger.FAILED, error)
        _log.error("flow %s: %s", flow_id, error)

    # ------------------------------------------------------------------ watch (status page)

    async def watch_offer(self, flow_id: str, sdp: str) -> dict[str, Any]:
        """A status-page viewer's WHEP offer for ``flow_id``: the webrtc worker's reply (``ok``,
        ``status``, ``sdp``, ``session_id``...). The flow's TS reaches the worker through a hidden
        tap (``WATCH_OUTPUT_ID``, a ``udp`` output to the worker's port, like the thumbnails'),
        which ``_on_watch_idle`` removes when the last viewer leaves (or the first one's offer is
        refused). Offers for one flow are handled one at a time: the worker counts a viewer only
        once its answer is made, so concurrent offers would pass the viewer cap together."""
        self.flow(flow_id)  # 404
        async with self._watch_locks.setdefault(flow_id, trio.Lock()):
            if not self.engine.is_running(flow_id):
                raise errors.Conflict(f"flow {flow_id!r} is not running")
            opened = await self.webrtc.request({"op": "watch_open", "flow_id": flow_id})
            if not opened.get("ok"):
                return opened
            await self._watch_tap(flow_id, int(opened["media_port"]))
            return await self.webrtc.request({"op": "offer", "flow_id": flow_id, "role": "watch", "sdp": sdp})

    async def _watch_tap(self, flow_id: str, port: int) -> None:
        """The tap to the worker's ``port``: added when missing, left alone (the viewers already
        watching keep an uninterrupted stream) when it runs to that port, replaced otherwise
        (a restarted webrtc worker listens on a new port)."""
        tap = UdpOutput(type="udp", id=WATCH_OUTPUT_ID, name="status page watch", dest_addr=f"127.0.0.1:{port}", dscp=0)
        try:
            await self.engine.add_output(flow_id, tap)
        except EngineError:
            if self._watch_taps.get(flow_id) == port:
                return  # running already (it exists: the add was refused)
            with contextlib.suppress(EngineError):
                await self.engine.remove_output(flow_id, WATCH_OUTPUT_ID)
            try:
                await self.engine.add_output(flow_id, tap)
            except EngineError as exc:
                self._watch_taps.pop(flow_id, None)
                raise errors.Internal(f"cannot tap the flow: {exc}") from exc
        self._watch_taps[flow_id] = port

    def _want_webrtc(self, *kinds: Any) -> None:
        """Start the webrtc worker when one of ``kinds`` (an input or outputs) needs it."""
        if any(getattr(kind, "type", None) in ("webrtc", "whep") for kind in kinds):
            self.webrtc.want()

    def _on_watch_idle(self, flow_id: str) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._end_watch, flow_id)

    async def _end_watch(self, flow_id: str) -> None:
        """The last viewer left: close the worker's watch and remove the tap, unless a new viewer
        came in the meantime (the worker keeps a watch that has sessions: ``busy``)."""
        async with self._watch_locks.setdefault(flow_id, trio.Lock()):
            try:
                reply = await self.webrtc.request({"op": "watch_close", "flow_id": flow_id})
            except Exception:  # the worker is gone (its watches with it) or restarting
                reply = {}
            if reply.get("busy"):
                return
            self._watch_taps.pop(flow_id, None)
            with contextlib.suppress(EngineError):
                await self.engine.remove_output(flow_id, WATCH_OUTPUT_ID)

    def _on_workers_lost(self, flow_ids: list[str]) -> None:
        for flow_id in flow_ids:
            self._on_flow_failed(flow_id, "engine worker exited")
        if self._nursery is not None:
            self._nursery.start_soon(self._restart_lost, flow_ids)

    async def _restart_lost(self, flow_ids: list[str]) -> None:
        # The supervisor restarts the worker; give it a moment, then bring the flows back.
        await trio.sleep(RESTART_LOST_AFTER_S)
        async with self._mutating():
            for flow_id in flow_ids:
                flow = self.config.flow(flow_id)
                if (
                    flow is not None
                    and self.lifecycle.state(flow_id) is FlowState.ERROR
                    and not self.engine.is_running(flow_id)
                ):
                    await self._start(flow, raise_errors=False)

    # ------------------------------------------------------------------ queries

    def flow(self, flow_id: str) -> FlowConfig:
        flow = self.config.flow(flow_id)
        if flow is None:
            raise FlowNotFound(flow_id)
        return flow

    def state_of(self, flow_id: str) -> FlowState:
        return self.lifecycle.state(flow_id)

    def active_flows(self) -> int:
        return self.lifecycle.count(FlowState.RUNNING)

    def uptime_secs(self) -> int:
        return int(trio.current_time() - self.started_at)

    def snapshot(self) -> StatsSnapshot:
        snapshot = self.stats.build(self.config.flows, trio.current_time())
        return snapshot.model_copy(update={"tunnels": self.tunnels()})

    def public_config(self) -> dict[str, Any]:
        return public_config(self.config)

    # ------------------------------------------------------------------ lifecycle

    async def _start(self, flow: FlowConfig, *, raise_errors: bool = True) -> None:
        self.lifecycle.fire(flow.id, Trigger.START)
        try:
            self._want_webrtc(flow.input, *flow.outputs)
            await self.engine.start_flow(flow)
        except EngineError as exc:
            self.lifecycle.fire(flow.id, Trigger.START_FAILED, str(exc))
            _log.error("flow %s failed to start: %s", flow.id, exc)
            if raise_errors:
                raise EngineFailed(f"flow '{flow.id}' failed to start: {exc}") from exc
            return
        except BaseException:
            # Only a shutdown cancels a start (mutations are shielded): never leave Starting behind.
            self.lifecycle.fire(flow.id, Trigger.START_FAILED, "start abandoned")
            raise
        self.lifecycle.fire(flow.id, Trigger.STARTED)

    async def _stop(self, flow_id: str) -> None:
        """Stop what the engine runs for ``flow_id`` (the lifecycle follows when it is known)."""
        try:
            await self.engine.stop_flow(flow_id)
        except EngineError as exc:
            if self.lifecycle.allows(flow_id, Trigger.STOP_FAILED):
                self.lifecycle.fire(flow_id, Trigger.STOP_FAILED, str(exc))
            raise EngineFailed(f"flow '{flow_id}' failed to stop: {exc}") from exc
        if self.lifecycle.allows(flow_id, Trigger.STOP):
            self.lifecycle.fire(flow_id, Trigger.STOP)

    async def _retire(self, flow_id: str) -> None:
        """A flow removed from the config: stopped if it runs, forgotten, and one event."""
        if self.engine.is_running(flow_id):
            try:
                await self._stop(flow_id)
            except EngineFailed:
                _log.error("flow %s deleted but its engine stop failed", flow_id)
        self.lifecycle.forget(flow_id)
        self.stats.forget(flow_id)
        self.publish(info(EventCategory.FLOW, "flow deleted", flow_id=flow_id))

    async def start_flow(self, flow_id: str) -> None:
        async with self._mutating():
            flow = self.flow(flow_id)
            self.lifecycle.require(flow_id, Trigger.START)
            await self._start(flow)
            _log.info("change: flow started flow=%s", flow_id)

    async def stop_flow(self, flow_id: str) -> None:
        async with self._mutating():
            self.flow(flow_id)
            self.lifecycle.require(flow_id, Trigger.STOP)
            await self._stop(flow_id)
            _log.info("change: flow stopped flow=%s", flow_id)

    async def restart_flow(self, flow_id: str) -> None:
        async with self._mutating():
            flow = self.flow(flow_id)
            if self.engine.is_running(flow_id):
                await self._stop(flow_id)
            await self._start(flow)
            _log.info("change: flow restarted flow=%s", flow_id)

    # ------------------------------------------------------------------ configuration changes

    async def _persist(self, config: AppConfig, *, follow_link: bool = True) -> None:
        await trio.to_thread.run_sync(self.store.save, config)
        self.config = config
        if follow_link and config.manager != self.link_config:
            self.link_config = config.manager
            self.manager_link.reconfigure()  # a new URL, credentials or on/off: connect afresh

    def _with_flows(self, flows: list[FlowConfig], changed: Iterable[str]) -> AppConfig:
        return validate_config(self.config.model_copy(update={"flows": flows}), changed)

    async def create_flow(self, flow: FlowConfig) -> FlowConfig:
        async with self._mutating():
            if self.config.flow(flow.id) is not None:
                raise errors.Conflict(f"flow '{flow.id}' already exists")
            new = self._with_flows([*self.config.flows, flow], [flow.id])
            await self._persist(new)
            _log.info("change: flow created flow=%s", flow.id)
            self.lifecycle.add(flow.id)
            self.publish(info(EventCategory.FLOW, "flow created", flow_id=flow.id))
            if flow.enabled:
                await self._start(flow)
            return flow

    async def update_flow(self, flow_id: str, flow: FlowConfig) -> FlowConfig:
        """Replace a flow; a running one is stopped, replaced and restarted if enabled."""
        flow = flow.model_copy(update={"id": flow_id})  # the path id wins over the body's
        async with self._mutating():
            self.flow(flow_id)
            new = self._with_flows([flow if f.id == flow_id else f for f in self.config.flows], [flow_id])
            await self._persist(new)
            _log.info("change: flow updated flow=%s", flow_id)
            self.publish(info(EventCategory.FLOW, "flow updated", flow_id=flow_id))
            if self.engine.is_running(flow_id):
                await self._stop(flow_id)
                if flow.enabled:
                    await self._start(flow)
            return flow

    async def delete_flow(self, flow_id: str) -> None:
        async with self._mutating():
            self.flow(flow_id)
            await self._persist(
                self.config.model_copy(update={"flows": [f for f in self.config.flows if f.id != flow_id]})
            )
            _log.info("change: flow deleted flow=%s", flow_id)
            await self._retire(flow_id)

    async def add_output(self, flow_id: str, output: OutputConfig) -> OutputConfig:
        async with self._mutating():
            flow = self.flow(flow_id)
            if flow.output(output.id) is not None:
                raise errors.Conflict(f"output '{output.id}' already exists in flow '{flow_id}'")
            check_output_supported(output)
            new_flow = flow.model_copy(update={"outputs": [*flow.outputs, output]})
            previous = self.config
            await self._persist(self._with_flows([new_flow if f.id == flow_id else f for f in previous.flows], []))
            if self.engine.is_running(flow_id):
                try:
                    self._want_webrtc(output)
                    await self.engine.add_output(flow_id, output)
                except EngineError as exc:
                    await self._persist(previous)  # roll the file back: the output never ran
                    self.publish(
                        warning(
                            EventCategory.FLOW,
                            f"output '{output.id}' failed to start: {exc}",
                            flow_id=flow_id,
                            output_id=output.id,
                        )
                    )
                    raise EngineFailed(f"output '{output.id}' failed to start: {exc}") from exc
            _log.info("change: output added flow=%s output=%s", flow_id, output.id)
            self.publish(info(EventCategory.FLOW, f"output '{output.id}' added", flow_id=flow_id, output_id=output.id))
            return output

    async def remove_output(self, flow_id: str, output_id: str) -> None:
        async with self._mutating():
            flow = self.flow(flow_id)
            if flow.output(output_id) is None:
                raise OutputNotFound(flow_id, output_id)
            if self.engine.is_running(flow_id):
                try:
                    await self.engine.remove_output(flow_id, output_id)
                except EngineError as exc:
                    raise EngineFailed(f"output '{output_id}' failed to stop: {exc}") from exc
            new_flow = flow.model_copy(update={"outputs": [o for o in flow.outputs if o.id != output_id]})
            await self._persist(
                self.config.model_copy(
                    update={"flows": [new_flow if f.id == flow_id else f for f in self.config.flows]}
                )
            )
            _log.info("change: output removed flow=%s output=%s", flow_id, output_id)
            self.publish(
                info(EventCategory.FLOW, f"output '{output_id}' removed", flow_id=flow_id, output_id=output_id)
            )

    async def replace_config(self, new_config: AppConfig) -> dict[str, Any]:
        """PUT /api/v1/config: stop all, replace (keeping omitted secrets), persist, start enabled."""
        async with self._mutating():
            merged = ensure_jwt_secret(merge_kept_secrets(new_config, self.config))  # interop.md 2.1
            if merged.node_id is None:
                merged = merged.model_copy(update={"node_id": self.config.node_id})
            return await self._apply(validate_config(merged), persist=True, change="config replaced")

    async def reload_config(self) -> dict[str, Any]:
        """POST /api/v1/config/reload: re-read both files and apply them."""
        async with self._mutating():
            loaded = ensure_jwt_secret(await trio.to_thread.run_sync(self.store.read))
            persist = loaded.server.auth is not None and self.config.server.auth != loaded.server.auth
            return await self._apply(validate_config(loaded), persist=persist, change="config reloaded")

    async def _apply(self, config: AppConfig, *, persist: bool, change: str) -> dict[str, Any]:
        """Stop every flow the engine runs (not what the old config lists: that is where a
        dropped flow used to keep running), take ``config``, start its enabled flows. Tunnels
        are diffed (``_apply_tunnels``): one that did not change keeps running."""
        old = self.config
        if persist:
            await self._persist(config)  # first: a failed write changes nothing
        _log.info("change: %s flows=%d", change, len(config.flows))
        for flow_id in sorted(self.engine.running_flows()):
            try:
                await self._stop(flow_id)
            except EngineFailed as exc:
                _log.error("config apply: %s", exc.message)
        self.config = config
        kept = {flow.id for flow in config.flows}
        for flow_id in self.lifecycle.ids():
            if flow_id not in kept:
                self.lifecycle.forget(flow_id)
                self.stats.forget(flow_id)
        failed = []
        for flow in config.flows:
            self.lifecycle.add(flow.id)
            if flow.enabled:
                await self._start(flow, raise_errors=False)
                if self.state_of(flow.id) is FlowState.ERROR:
                    failed.append(flow.id)
        failed += await self._apply_tunnels(old, config)
        if failed:
            raise EngineFailed("configuration applied, but these flows failed to start: " + ", ".join(failed))
        return public_config(config)

    async def apply_config_change(self, new_config: AppConfig) -> dict[str, Any]:
        """The manager's ``update_config`` (interop.md 6): diffed, not replaced wholesale.

        Secrets are merged as ``replace_config`` does (interop.md 2.7), the whole result is
        validated (400/409 as over REST) and persisted first; then the plan of
        ``services.edge.config_diff`` is carried out: deleted flows are stopped and
        forgotten, replaced flows (input or any non-output field changed) are stopped and
        started again if enabled, outputs-only changes are made hot on a running flow (it
        keeps running; on a flow that is not running the file is all there is to change),
        created flows are started if enabled. Unchanged flows are never touched. Tunnels
        likewise (interop.md 6): removed ones stopped, changed ones restarted, added ones
        started if enabled, unchanged ones untouched.

        Order: every stop and output removal first, then the starts and output additions,
        so an address one flow gives up can be taken by another in the same change. A flow
        or output that fails to start does not stop the rest; they are all listed in one
        ``EngineFailed`` at the end (the configuration stays applied, as with ``_apply``).
        """
        async with self._mutating():
            merged = ensure_jwt_secret(merge_kept_secrets(new_config, self.config))  # interop.md 2.1, 2.7
            if merged.node_id is None:
                merged = merged.model_copy(update={"node_id": self.config.node_id})
            changed = plan_config_change(self.config, merged).changed_flow_ids
            config = validate_config(merged, changed)
            plan = plan_config_change(self.config, config)
            old = self.config
            await self._persist(config)  # first: a failed write changes nothing
            _log.info(
                "change: config from the manager applied flows=%d created=%d deleted=%d restarted=%d "
                "outputs_changed=%d",
                len(config.flows),
                len(plan.created),
                len(plan.deleted),
                len(plan.replaced),
                len(plan.output_changes),
            )
            failed: list[str] = []

            for flow_id in plan.deleted:
                await self._retire(flow_id)

            for flow in plan.replaced:
                self.publish(info(EventCategory.FLOW, "flow updated", flow_id=flow.id))
                if self.engine.is_running(flow.id):
                    try:
                        await self._stop(flow.id)
                    except EngineFailed as exc:  # the engine dropped it all the same
                        _log.error("config change: %s", exc.message)

            hot = {change.flow_id for change in plan.output_changes if self.engine.is_running(change.flow_id)}
            for change in plan.output_changes:
                for output_id in change.removed:
                    if change.flow_id in hot:
                        try:
                            await self.engine.remove_output(change.flow_id, output_id)
                        except EngineError as exc:
                            _log.error("flow %s: output %s failed to stop: %s", change.flow_id, output_id, exc)
                            failed.append(f"{change.flow_id} (output '{output_id}' failed to stop: {exc})")
                    self.publish(
                        info(
                            EventCategory.FLOW,
                            f"output '{output_id}' removed",
                            flow_id=change.flow_id,
                            output_id=output_id,
                        )
                    )

            for flow in plan.replaced:
                if flow.enabled:
                    await self._start(flow, raise_errors=False)
                    if self.state_of(flow.id) is FlowState.ERROR:
                        failed.append(flow.id)

            for change in plan.output_changes:
                for output in change.added:
                    if change.flow_id in hot:
                        try:
                            self._want_webrtc(output)
                            await self.engine.add_output(change.flow_id, output)
                        except EngineError as exc:
                            self.publish(
                                warning(
                                    EventCategory.FLOW,
                                    f"output '{output.id}' failed to start: {exc}",
                                    flow_id=change.flow_id,
                                    output_id=output.id,
                                )
                            )
                            failed.append(f"{change.flow_id} (output '{output.id}' failed to start: {exc})")
                            continue
                    self.publish(
                        info(
                            EventCategory.FLOW,
                            f"output '{output.id}' added",
                            flow_id=change.flow_id,
                            output_id=output.id,
                        )
                    )

            for flow in plan.created:
                self.lifecycle.add(flow.id)
                self.publish(info(EventCategory.FLOW, "flow created", flow_id=flow.id))
                if flow.enabled:
                    await self._start(flow, raise_errors=False)
                    if self.state_of(flow.id) is FlowState.ERROR:
                        failed.append(flow.id)

            failed += await self._apply_tunnels(old, config)

            self.publish(
                info(
                    EventCategory.CONFIG,
                    "config from the manager applied",
                    flows_created=[flow.id for flow in plan.created],
                    flows_deleted=list(plan.deleted),
                    flows_restarted=[flow.id for flow in plan.replaced],
                    flows_outputs_changed=[change.flow_id for change in plan.output_changes],
                    tunnels_added=list(plan.tunnels_added),
                    tunnels_removed=list(plan.tunnels_removed),
                    tunnels_changed=list(plan.tunnels_changed),
                )
            )
            if failed:
                raise EngineFailed("configuration applied, but these flows failed to start: " + ", ".join(failed))
            return public_config(self.config)

    # ------------------------------------------------------------------ tunnels (interop.md 2.6)

    def _tunnel_config(self, tunnel_id: str) -> TunnelConfig:
        key = tunnel_key(tunnel_id)
        tunnel = next((t for t in self.config.tunnels if str(t.id) == key), None)
        if tunnel is None:
            raise TunnelNotFound(tunnel_id)
        return tunnel

    def _summary(self, tunnel: TunnelConfig) -> TunnelSummary:
        tunnel_id = str(tunnel.id)
        return TunnelSummary(
            id=tunnel_id,
            name=tunnel.name,
            enabled=tunnel.enabled,
            protocol=tunnel.protocol,
            mode=tunnel.mode,
            direction=tunnel.direction,
            transport=tunnel.transport,
            state=self.tunnel_supervisor.state(tunnel_id),
            local_addr=tunnel.local_addr,
            relay_addr=tunnel.relay_addr if tunnel.mode == "relay" else None,
            stats=self.tunnel_supervisor.counters(tunnel_id),
        )

    def tunnels(self) -> list[TunnelSummary]:
        """Every configured tunnel's summary, in configuration order (never a secret)."""
        return [self._summary(tunnel) for tunnel in self.config.tunnels]

    def tunnel(self, tunnel_id: str) -> TunnelSummary:
        """One tunnel's summary; TunnelNotFound (404)."""
        return self._summary(self._tunnel_config(tunnel_id))

    def _edge_id(self) -> str | None:
        # interop.md 8.2 ``identify``: the manager's node id, once the edge is registered.
        manager = self.link_config or self.config.manager
        return str(manager.node_id) if manager is not None and manager.node_id is not None else None

    async def _start_tunnel(self, tunnel: TunnelConfig, *, raise_errors: bool = True) -> None:
        try:
            await self.tunnel_supervisor.start_tunnel(tunnel, edge_id=self._edge_id())
        except TunnelError as exc:
            _log.error("tunnel %s failed to start: %s", tunnel.id, exc)
            self.publish(
                critical(
                    EventCategory.TUNNEL,
                    f"tunnel '{tunnel.name}' failed to start: {exc}",
                    tunnel_id=str(tunnel.id),
                    tunnel_name=tunnel.name,
                    state="Failed",
                    reason=str(exc),
                )
            )
            if raise_errors:
                raise EngineFailed(f"tunnel '{tunnel.id}' failed to start: {exc}") from exc

    async def _stop_tunnel(self, tunnel_id: str) -> None:
        try:
            await self.tunnel_supervisor.stop_tunnel(tunnel_id)
        except TunnelError as exc:  # the worker is gone or stuck: it runs nothing we know of
            _log.error("tunnel %s: stop failed: %s", tunnel_id, exc)

    async def _apply_tunnels(self, old: AppConfig, new: AppConfig) -> list[str]:
        """Tunnels from ``old`` to ``new``: removed and changed ones stopped, then added and
        changed ones started if enabled; unchanged ones untouched. The ids that failed to start."""
        plan = plan_config_change(old, new)
        for tunnel_id in (*plan.tunnels_removed, *plan.tunnels_changed):
            await self._stop_tunnel(tunnel_id)  # a no-op for one that does not run
        by_id = {str(t.id): t for t in new.tunnels}
        failed = []
        for tunnel_id in (*plan.tunnels_added, *plan.tunnels_changed):
            tunnel = by_id[tunnel_id]
            if tunnel.enabled:
                try:
                    await self._start_tunnel(tunnel)
                except EngineFailed:
                    failed.append(f"tunnel {tunnel_id}")
        return failed

    async def create_tunnel(self, tunnel: TunnelConfig) -> TunnelConfig:
        """Validate, persist (secrets to secrets.json, interop.md 2.7) and start if enabled.

        Conflict (409) when the id exists; EngineFailed (500) when the tunnel worker refuses
        it (the tunnel stays configured, ``Failed``)."""
        async with self._mutating():
            tunnel_id = str(tunnel.id)
            if any(str(t.id) == tunnel_id for t in self.config.tunnels):
                raise errors.Conflict(f"tunnel '{tunnel_id}' already exists")
            new = validate_config(self.config.model_copy(update={"tunnels": [*self.config.tunnels, tunnel]}), [])
            await self._persist(new)
            _log.info("change: tunnel created tunnel=%s", tunnel_id)
            self.publish(info(EventCategory.TUNNEL, f"tunnel '{tunnel.name}' created", tunnel_id=tunnel_id))
            if tunnel.enabled:
                await self._start_tunnel(tunnel)
            return tunnel

    async def delete_tunnel(self, tunnel_id: str) -> None:
        """Stop (if it runs) and remove a tunnel, its secrets with it; TunnelNotFound (404)."""
        async with self._mutating():
            tunnel = self._tunnel_config(tunnel_id)
            key = str(tunnel.id)
            await self._persist(
                self.config.model_copy(update={"tunnels": [t for t in self.config.tunnels if str(t.id) != key]})
            )
            _log.info("change: tunnel deleted tunnel=%s", key)
            await self._stop_tunnel(key)
            self.publish(info(EventCategory.TUNNEL, f"tunnel '{tunnel.name}' deleted", tunnel_id=key))

    # ------------------------------------------------------------------ setup wizard (interop.md 3)

    def setup_status(self) -> dict[str, Any]:
        manager = self.config.manager
        return {
            "listen_addr": self.config.server.listen_addr,
            "listen_port": self.config.server.listen_port,
            "manager_url": manager.url if manager is not None else None,
            "accept_self_signed_cert": manager.accept_self_signed_cert if manager is not None else False,
            "registration_token": None,
            "device_name": self.config.device_name,
            "setup_enabled": self.config.setup_enabled,
        }

    async def save_setup(self, body: dict[str, Any]) -> None:
        """Apply the wizard's form to a copy of the config and persist it (effective at restart)."""
        async with self._mutating():
            old_url = self.config.manager.url if self.config.manager is not None else None
            config = build_setup_config(self.config, body)
            await self._persist(config, follow_link=False)  # interop.md 3: effective at restart
            new_token = isinstance(body.get("registration_token"), str) and bool(body["registration_token"].strip())
            _log.info(  # ids and yes/no only: never the URL (it may carry a query), the token or the body
                "change: setup saved listen=%s manager_changed=%s new_token=%s (effective at restart)",
                _host_port(config.server.listen_addr, config.server.listen_port),
                "yes" if config.manager is not None and config.manager.url != old_url else "no",
                "yes" if new_token else "no",
            )

    def setup_runtime(self) -> dict[str, Any]:
        """What is in force in this process, beside what ``setup_status`` says is saved (beyond
        interop.md 3, whose ``/setup/status`` keys are fixed): the address and port the API listens
        on and where they came from, how to restart, whether ``MEDIAPLANE_ALLOW_INSECURE=1`` is set,
        and the saved ``cert_fingerprint`` (the form's value, which ``/setup/status`` cannot carry)."""
        scheme, addr, port = self.listening or ("http", *self.listen_at_start)
        systemd = under_systemd()
        manager = self.config.manager
        return {
            "scheme": scheme,
            "listen_addr": addr,
            "listen_port": port,
            "listen_from": "config.json" if (addr, port) == self.listen_at_start else "command line",
            "systemd": systemd,
            "restart_command": RESTART_COMMAND if systemd else shlex.join(sys.argv),
            "allow_insecure": self.allow_insecure,
            "cert_fingerprint": manager.cert_fingerprint if manager is not None else None,
        }

    def request_restart(self) -> None:
        """POST /setup/restart: stop cleanly, then exit ``RESTART_EXIT_STATUS`` so systemd starts
        mp-edge again (the unit's Restart=on-failure). Only while the wizard is on (403), only under
        systemd (409: nobody would start it again); a second request while stopping is a no-op."""
        if not self.config.setup_enabled:
            raise errors.NotAllowed(SETUP_DISABLED)
        if not under_systemd() or self.stop_process is None or self._nursery is None:
            raise errors.Conflict(
                "mp-edge is not running under systemd, so nothing would start it again: stop it and start it yourself"
            )
        if self.exit_status == RESTART_EXIT_STATUS:
            return
        self.exit_status = RESTART_EXIT_STATUS
        _log.info(
            "change: restart requested from the setup wizard (exit status %d: systemd starts mp-edge again)",
            RESTART_EXIT_STATUS,
        )
        self._nursery.start_soon(self._stop_soon)

    async def _stop_soon(self) -> None:
        await trio.sleep(RESTART_DELAY_S)
        if self.stop_process is not None:
            self.stop_process()

    # ------------------------------------------------------------------ the manager link (interop.md 6)

    async def save_manager_credentials(self, node_id: str, node_secret: SecretStr) -> None:
        """A ``register_ack``: node id to config.json, the secret to secrets.json, the token
        cleared, the wizard off (interop.md 6 "Credential persistence").

        A failed write is reported (a ``config`` warning) and the credentials are kept in
        memory, so this run stays connected; the file is written again at the next change.
        """
        async with self._mutating():
            current = self.link_config or self.config.manager or ManagerConfig()
            manager = current.model_copy(
                update={"node_id": uuid.UUID(node_id), "node_secret": node_secret, "registration_token": None}
            )
            self.link_config = manager  # before _persist: this is not a change to reconnect for
            file_manager = (self.config.manager or current).model_copy(
                update={"node_id": manager.node_id, "node_secret": node_secret, "registration_token": None}
            )
            new = self.config.model_copy(update={"manager": file_manager, "setup_enabled": False})
            _log.info("change: manager credentials saved node=%s", manager.node_id)
            try:
                await self._persist(new, follow_link=False)
            except errors.PersistFailed as exc:
                self.config = new
                self.publish(warning(EventCategory.CONFIG, f"persisting the manager credentials failed: {exc.message}"))
                _log.error("persisting the manager credentials failed: %s", exc.message)

    async def rotate_manager_secret(self, new_secret: SecretStr) -> None:
        """``rotate_secret``: the new secret persisted before the ack (PersistFailed: the ack
        fails and the old secret stays). The manager accepts both until it has the ack, so a
        lost ack cannot lock the node out (interop.md 6)."""
        async with self._mutating():
            current = self.link_config or self.config.manager
            if current is None:
                raise errors.InvalidInput("the manager link is not configured")
            manager = current.model_copy(update={"node_secret": new_secret})
            file_manager = (self.config.manager or current).model_copy(update={"node_secret": new_secret})
            await self._persist(self.config.model_copy(update={"manager": file_manager}), follow_link=False)
            self.link_config = manager  # the next connection uses it; this one stays up
            _log.info("change: manager secret rotated node=%s", manager.node_id)


# cert_fingerprint is beyond interop.md 3 (docs/edge.md): the wizard pins a self-signed manager.
_SETUP_KEYS: Final = frozenset(
    {
        "manager_url",
        "listen_addr",
        "listen_port",
        "accept_self_signed_cert",
        "registration_token",
        "device_name",
        "cert_fingerprint",
    }
)
MANAGER_URL_RULE: Final = (
    "a manager URL is wss://HOST[:PORT]/PATH, with a host (no user name or password) and a port 1-65535"
)
FINGERPRINT_RULE: Final = (
    "cert_fingerprint must be the SHA-256 of the manager's certificate: 32 hex pairs (AB:CD:...) or 64 hex digits"
)
_HOSTNAME_RE: Final = re.compile(
    r"(?!.{254})[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
)
_FINGERPRINT_LABEL_RE: Final = re.compile(r"^\s*(?:sha-?256\s+)?fingerprint\s*=\s*", re.IGNORECASE)
_FINGERPRINT_PAIRS_RE: Final = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){31}")
_FINGERPRINT_HEX_RE: Final = re.compile(r"[0-9a-fA-F]{64}")


def build_setup_config(current: AppConfig, body: dict[str, Any]) -> AppConfig:
    """The checks of interop.md 3, in its order; the patched copy of ``current``."""
    unknown = sorted(set(body) - _SETUP_KEYS)
    if unknown:
        raise errors.InvalidInput(f"unknown key: {unknown[0]}")
    url = body.get("manager_url")
    if not isinstance(url, str) or not url.strip():
        raise errors.InvalidInput("manager_url is required")
    url = url.strip()
    if not url.startswith("wss://"):
        raise errors.InvalidInput("TLS is required: manager_url must start with wss://")
    token = body.get("registration_token")
    device_name = body.get("device_name")
    if len(url) > 2048:
        raise errors.InvalidInput("manager_url must be at most 2048 characters")
    if token is not None and (not isinstance(token, str) or len(token) > 4096):
        raise errors.InvalidInput("registration_token must be a string of at most 4096 characters")
    if device_name is not None and (not isinstance(device_name, str) or len(device_name) > 256):
        raise errors.InvalidInput("device_name must be a string of at most 256 characters")
    port = body.get("listen_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise errors.InvalidInput("listen_port must be 1-65535")
    addr = body.get("listen_addr")
    if addr is not None and not _is_ip(addr):
        raise errors.InvalidInput("listen_addr must be an IP address literal")
    self_signed = body.get("accept_self_signed_cert", False)
    if not isinstance(self_signed, bool):
        raise errors.InvalidInput("accept_self_signed_cert must be a boolean")
    old = current.manager or ManagerConfig()
    # interop.md 3 keeps cert_fingerprint; the key (an extension) sets it, null or blank clears it.
    pin = _setup_fingerprint(body["cert_fingerprint"]) if "cert_fingerprint" in body else old.cert_fingerprint

    data = current.model_dump()
    if addr is not None:
        data["server"]["listen_addr"] = addr
    if port is not None:
        data["server"]["listen_port"] = port
    if "device_name" in body:
        trimmed = (device_name or "").strip()
        data["device_name"] = trimmed or None
    new_token = token.strip() if isinstance(token, str) and token.strip() else None
    changed = url != old.url or new_token is not None
    data["manager"] = {
        "enabled": True,
        "url": url,
        "accept_self_signed_cert": self_signed,
        "cert_fingerprint": pin,
        "registration_token": new_token if new_token is not None else old.registration_token,
        "node_id": None if changed else old.node_id,
        "node_secret": None if changed else old.node_secret,
    }
    try:
        config = AppConfig.model_validate(data)
    except ValidationError as exc:
        raise errors.InvalidInput(f"Validation failed: {describe_validation_error(exc)}") from None
    # Part of the "patched config fails validation" row of interop.md 3 (so its order holds), checked
    # here rather than in the model: a node whose config.json holds such a URL still starts and runs
    # its flows (the link reports the URL), where a model check would stop it at boot.
    if not manager_url_is_usable(url):
        raise errors.InvalidInput(f"Validation failed: manager.url: {MANAGER_URL_RULE}")
    return config


def manager_url_is_usable(url: str) -> bool:
    """``wss://HOST[:PORT]/PATH``: a host name or IP literal, no user info, a port 1-65535 when given."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # ValueError: not a number, or above 65535
    except ValueError:
        return False
    host = parts.hostname
    if parts.scheme != "wss" or not host or "@" in parts.netloc or parts.netloc.endswith(":") or port == 0:
        return False
    return _is_ip(host) or _HOSTNAME_RE.fullmatch(host) is not None


def _setup_fingerprint(value: object) -> str | None:
    """The wizard's ``cert_fingerprint`` in the form the link checks (upper-case pairs), or None.

    Takes what the manager shows (``fingerprint_sha256``), what ``openssl x509 -fingerprint
    -sha256`` prints (its ``sha256 Fingerprint=`` label included) or 64 bare hex digits."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise errors.InvalidInput(FINGERPRINT_RULE)
    text = _FINGERPRINT_LABEL_RE.sub("", value).strip()
    if not text:
        return None
    if not (_FINGERPRINT_PAIRS_RE.fullmatch(text) or _FINGERPRINT_HEX_RE.fullmatch(text)):
        raise errors.InvalidInput(FINGERPRINT_RULE)
    digits = text.replace(":", "").upper()
    return ":".join(digits[i : i + 2] for i in range(0, 64, 2))


def under_systemd() -> bool:
    """Started by systemd: it sets ``INVOCATION_ID`` for every unit, ``NOTIFY_SOCKET`` for Type=notify."""
    return bool(os.environ.get("INVOCATION_ID") or os.environ.get("NOTIFY_SOCKET"))


def _host_port(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _is_ip(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
