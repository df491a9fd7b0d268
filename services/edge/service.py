"""EdgeService: owns the configuration and the flows' lifecycle; decides.

Routes translate HTTP to these calls; the manager link (a later issue) calls the
same methods, so every rule (404, 409, persistence order) lives here once.
Mutations are serialised by one lock. A change is persisted before it is
applied, so a failed write leaves both the file and the running state as they
were (``PersistFailed`` → 500).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import Any, Final

import trio

from appliance import errors
from appliance.config.store import EdgeConfigStore, ensure_jwt_secret, merge_kept_secrets, public_config
from appliance.models.config import AppConfig, FlowConfig, ManagerConfig, OutputConfig, SrtInput, SrtOutput
from appliance.models.stats import FlowState, StatsSnapshot
from services.edge.engine.srt_io import check_supported as check_srt_supported
from services.edge.engine.supervisor import WORKER_NICE, WORKER_REALTIME, Engine, EngineError
from services.edge.stats import StatsAggregator

_log = logging.getLogger("mediaplane.edge")

# The flow lifecycle (interop.md 11) as data (style H4): which states an
# operation may leave from. The API's 409s come from this table.
_STARTABLE: Final = frozenset({FlowState.IDLE, FlowState.STOPPED, FlowState.ERROR})
_STOPPABLE: Final = frozenset({FlowState.RUNNING})


class FlowNotFound(errors.NotFound):
    def __init__(self, flow_id: str) -> None:
        super().__init__(f"flow '{flow_id}' not found")


class OutputNotFound(errors.NotFound):
    def __init__(self, flow_id: str, output_id: str) -> None:
        super().__init__(f"output '{output_id}' not found in flow '{flow_id}'")


class EngineFailed(errors.Internal):
    """The engine could not do what was asked (500, the engine's reason in the text)."""


SUPPORTED_INPUTS: Final = frozenset({"rtp", "udp", "srt"})
SUPPORTED_OUTPUTS: Final = frozenset({"rtp", "udp", "srt"})


def check_supported(flow: FlowConfig) -> None:
    """InvalidInput for input or output kinds this build's engine does not carry yet."""
    if flow.input.type not in SUPPORTED_INPUTS:
        raise errors.InvalidInput(f"input type '{flow.input.type}' is not supported by this edge yet")
    if isinstance(flow.input, SrtInput):
        check_srt_supported(flow.input)  # 400 for what the installed libsrt cannot do
    for output in flow.outputs:
        check_output_supported(output)


def check_output_supported(output: OutputConfig) -> None:
    if output.type not in SUPPORTED_OUTPUTS:
        raise errors.InvalidInput(f"output type '{output.type}' is not supported by this edge yet")
    if isinstance(output, SrtOutput):
        check_srt_supported(output)


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
    ) -> None:
        self.store = store
        self.config = config
        self.version = version
        self.started_at = trio.current_time()
        self.stats = StatsAggregator(version, self.started_at)
        self.engine = Engine(
            workers=workers,
            on_stats=self._on_counters,
            on_flow_failed=self._on_flow_failed,
            on_workers_lost=self._on_workers_lost,
            log_level=log_level,
            pin_cpus=pin_cpus,
            worker_nice=worker_nice,
            worker_realtime=worker_realtime,
        )
        self._lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self.snapshot_listeners: list[Callable[[StatsSnapshot], None]] = []
        for flow in config.flows:
            self.stats.runtime(flow.id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the engine and every enabled flow, then tick stats until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.engine.run)
            async with self._lock:
                for flow in self.config.flows:
                    if flow.enabled:
                        await self._start(flow, raise_errors=False)
            nursery.start_soon(self._tick)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await self.engine.shutdown()

    async def _tick(self) -> None:
        """Once a second: one snapshot pushed to every listener (WebSocket clients)."""
        while True:
            await trio.sleep(1.0)
            if not self.snapshot_listeners:
                continue
            snapshot = self.snapshot()
            for listener in list(self.snapshot_listeners):
                listener(snapshot)

    # ------------------------------------------------------------------ engine callbacks

    def _on_counters(self, flows: dict[str, dict[str, Any]]) -> None:
        self.stats.on_counters(flows, trio.current_time())

    def _on_flow_failed(self, flow_id: str, error: str) -> None:
        runtime = self.stats.runtime(flow_id)
        runtime.state, runtime.error = FlowState.ERROR, error
        runtime.reset_counters()
        _log.error("flow %s: %s", flow_id, error)

    def _on_workers_lost(self, flow_ids: list[str]) -> None:
        for flow_id in flow_ids:
            self._on_flow_failed(flow_id, "engine worker exited")
        if self._nursery is not None:
            self._nursery.start_soon(self._restart_lost, flow_ids)

    async def _restart_lost(self, flow_ids: list[str]) -> None:
        # The supervisor restarts the worker; give it a moment, then bring the flows back.
        await trio.sleep(1.0)
        async with self._lock:
            for flow_id in flow_ids:
                flow = self.config.flow(flow_id)
                if flow is not None and self.stats.runtime(flow_id).state is FlowState.ERROR:
                    await self._start(flow, raise_errors=False)

    # ------------------------------------------------------------------ queries

    def flow(self, flow_id: str) -> FlowConfig:
        flow = self.config.flow(flow_id)
        if flow is None:
            raise FlowNotFound(flow_id)
        return flow

    def state_of(self, flow_id: str) -> FlowState:
        return self.stats.runtime(flow_id).state

    def active_flows(self) -> int:
        return sum(1 for f in self.config.flows if self.state_of(f.id) is FlowState.RUNNING)

    def uptime_secs(self) -> int:
        return int(trio.current_time() - self.started_at)

    def snapshot(self) -> StatsSnapshot:
        return self.stats.build(self.config.flows, trio.current_time())

    def public_config(self) -> dict[str, Any]:
        return public_config(self.config)

    # ------------------------------------------------------------------ lifecycle

    async def _start(self, flow: FlowConfig, *, raise_errors: bool = True) -> None:
        runtime = self.stats.runtime(flow.id)
        runtime.state, runtime.error = FlowState.STARTING, None
        runtime.reset_counters()
        try:
            await self.engine.start_flow(flow)
        except EngineError as exc:
            runtime.state, runtime.error = FlowState.ERROR, str(exc)
            _log.error("flow %s failed to start: %s", flow.id, exc)
            if raise_errors:
                raise EngineFailed(f"flow '{flow.id}' failed to start: {exc}") from exc
            return
        runtime.state, runtime.started_at = FlowState.RUNNING, trio.current_time()
        _log.info("flow %s started", flow.id)

    async def _stop(self, flow_id: str, final_state: FlowState = FlowState.STOPPED) -> None:
        runtime = self.stats.runtime(flow_id)
        try:
            await self.engine.stop_flow(flow_id)
        except EngineError as exc:
            runtime.state, runtime.error = FlowState.ERROR, str(exc)
            raise EngineFailed(f"flow '{flow_id}' failed to stop: {exc}") from exc
        runtime.state, runtime.started_at = final_state, None
        runtime.reset_counters()
        _log.info("flow %s stopped", flow_id)

    async def start_flow(self, flow_id: str) -> None:
        async with self._lock:
            flow = self.flow(flow_id)
            state = self.state_of(flow_id)
            if state not in _STARTABLE:
                raise errors.Conflict(f"flow '{flow_id}' is already running")
            await self._start(flow)

    async def stop_flow(self, flow_id: str) -> None:
        async with self._lock:
            self.flow(flow_id)
            if self.state_of(flow_id) not in _STOPPABLE:
                raise errors.Conflict(f"flow '{flow_id}' is not running")
            await self._stop(flow_id)

    async def restart_flow(self, flow_id: str) -> None:
        async with self._lock:
            flow = self.flow(flow_id)
            if self.engine.is_running(flow_id):
                await self._stop(flow_id)
            await self._start(flow)

    # ------------------------------------------------------------------ configuration changes

    async def _persist(self, config: AppConfig) -> None:
        await trio.to_thread.run_sync(self.store.save, config)
        self.config = config

    async def create_flow(self, flow: FlowConfig) -> FlowConfig:
        async with self._lock:
            if self.config.flow(flow.id) is not None:
                raise errors.Conflict(f"flow '{flow.id}' already exists")
            check_supported(flow)
            await self._persist(self.config.model_copy(update={"flows": [*self.config.flows, flow]}))
            self.stats.runtime(flow.id).state = FlowState.IDLE
            if flow.enabled:
                await self._start(flow)
            return flow

    async def update_flow(self, flow_id: str, flow: FlowConfig) -> FlowConfig:
        """Replace a flow; a running one is stopped, replaced and restarted if enabled."""
        flow = flow.model_copy(update={"id": flow_id})  # the path id wins over the body's
        async with self._lock:
            self.flow(flow_id)
            check_supported(flow)
            flows = [flow if f.id == flow_id else f for f in self.config.flows]
            was_running = self.engine.is_running(flow_id)
            await self._persist(self.config.model_copy(update={"flows": flows}))
            if was_running:
                await self._stop(flow_id)
                if flow.enabled:
                    await self._start(flow)
            return flow

    async def delete_flow(self, flow_id: str) -> None:
        async with self._lock:
            self.flow(flow_id)
            flows = [f for f in self.config.flows if f.id != flow_id]
            await self._persist(self.config.model_copy(update={"flows": flows}))
            if self.engine.is_running(flow_id):
                try:
                    await self._stop(flow_id)
                except EngineFailed:
                    _log.error("flow %s deleted but its engine stop failed", flow_id)
            self.stats.forget(flow_id)

    async def add_output(self, flow_id: str, output: OutputConfig) -> OutputConfig:
        async with self._lock:
            flow = self.flow(flow_id)
            if flow.output(output.id) is not None:
                raise errors.Conflict(f"output '{output.id}' already exists in flow '{flow_id}'")
            check_output_supported(output)
            new_flow = flow.model_copy(update={"outputs": [*flow.outputs, output]})
            flows = [new_flow if f.id == flow_id else f for f in self.config.flows]
            previous = self.config
            await self._persist(self.config.model_copy(update={"flows": flows}))
            if self.engine.is_running(flow_id):
                try:
                    await self.engine.add_output(flow_id, output)
                except EngineError as exc:
                    await self._persist(previous)  # roll the file back: the output never ran
                    raise EngineFailed(f"output '{output.id}' failed to start: {exc}") from exc
            return output

    async def remove_output(self, flow_id: str, output_id: str) -> None:
        async with self._lock:
            flow = self.flow(flow_id)
            if flow.output(output_id) is None:
                raise OutputNotFound(flow_id, output_id)
            if self.engine.is_running(flow_id):
                try:
                    await self.engine.remove_output(flow_id, output_id)
                except EngineError as exc:
                    raise EngineFailed(f"output '{output_id}' failed to stop: {exc}") from exc
            new_flow = flow.model_copy(update={"outputs": [o for o in flow.outputs if o.id != output_id]})
            flows = [new_flow if f.id == flow_id else f for f in self.config.flows]
            await self._persist(self.config.model_copy(update={"flows": flows}))

    async def replace_config(self, new_config: AppConfig) -> dict[str, Any]:
        """PUT /api/v1/config: stop all, replace (keeping omitted secrets), persist, start enabled."""
        async with self._lock:
            for flow in new_config.flows:
                check_supported(flow)
            merged = ensure_jwt_secret(merge_kept_secrets(new_config, self.config))  # interop.md 2.1
            if merged.node_id is None:
                merged = merged.model_copy(update={"node_id": self.config.node_id})
            return await self._apply(merged, persist=True)

    async def reload_config(self) -> dict[str, Any]:
        """POST /api/v1/config/reload: re-read both files and apply them."""
        async with self._lock:
            loaded = ensure_jwt_secret(await trio.to_thread.run_sync(self.store.read))
            persist = loaded.server.auth is not None and self.config.server.auth != loaded.server.auth
            for flow in loaded.flows:
                check_supported(flow)
            return await self._apply(loaded, persist=persist)

    async def _apply(self, config: AppConfig, *, persist: bool) -> dict[str, Any]:
        if persist:
            await self._persist(config)  # first: a failed write changes nothing
        for flow_id in [f.id for f in self.config.flows if self.engine.is_running(f.id)]:
            await self._stop(flow_id)
        self.config = config
        for flow_id in list(self.stats.flows):
            if config.flow(flow_id) is None:
                self.stats.forget(flow_id)
        failed = []
        for flow in config.flows:
            self.stats.runtime(flow.id)
            if flow.enabled:
                await self._start(flow, raise_errors=False)
                if self.state_of(flow.id) is FlowState.ERROR:
                    failed.append(flow.id)
        if failed:
            raise EngineFailed("configuration applied, but these flows failed to start: " + ", ".join(failed))
        return public_config(config)

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
        async with self._lock:
            config = build_setup_config(self.config, body)
            await self._persist(config)


_SETUP_KEYS: Final = frozenset(
    {"manager_url", "listen_addr", "listen_port", "accept_self_signed_cert", "registration_token", "device_name"}
)


def build_setup_config(current: AppConfig, body: dict[str, Any]) -> AppConfig:
    """The checks of interop.md 3, in its order; the patched copy of ``current``."""
    from pydantic import ValidationError

    from appliance.http.envelope import describe_validation_error

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

    data = current.model_dump()
    if addr is not None:
        data["server"]["listen_addr"] = addr
    if port is not None:
        data["server"]["listen_port"] = port
    if "device_name" in body:
        trimmed = (device_name or "").strip()
        data["device_name"] = trimmed or None
    old = current.manager or ManagerConfig()
    new_token = token.strip() if isinstance(token, str) and token.strip() else None
    changed = url != old.url or new_token is not None
    data["manager"] = {
        "enabled": True,
        "url": url,
        "accept_self_signed_cert": self_signed,
        "cert_fingerprint": old.cert_fingerprint,
        "registration_token": new_token if new_token is not None else old.registration_token,
        "node_id": None if changed else old.node_id,
        "node_secret": None if changed else old.node_secret,
    }
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        raise errors.InvalidInput(f"Validation failed: {describe_validation_error(exc)}") from None


def _is_ip(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
