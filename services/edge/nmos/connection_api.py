"""IS-05 v1.1 Connection API (``/x-nmos/connection/v1.1/``, interop.md 5).

Public (no auth), NMOS error bodies ``{code, error, debug}``, every collection with and without a
trailing slash. CORS (``*``) and OPTIONS come from the app-wide ``/x-nmos/`` hook of ``node_api``.
The rules live in ``connection`` (sans-IO); this module does the IO:

- ``activate_immediate`` applies at once: a sender's output is hot-swapped (remove, then add), a
  receiver's flow is updated and restarted, both through ``EdgeService`` (which persists the config);
  on failure the previous config is put back and the answer is 500.
- ``activate_scheduled_absolute`` / ``_relative`` answer 202 and apply at the due time in a task of
  the app's nursery; ``activation.mode: null`` cancels it; any other PATCH meanwhile is 423.
- ``master_enable`` is runtime-only: a sender's output is taken off the engine, a receiver's flow stops.

The staged and active state is the node's one ``Connections`` (``service.nmos.connections``), which
the IS-04 resources read too (a receiver's ``subscription.sender_id``, a sender's ``receiver_id``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import trio
from quart import Blueprint, Response, current_app, request
from quart.typing import ResponseReturnValue

from appliance import errors
from appliance.http.envelope import status_for
from appliance.models.config import FlowConfig, OutputConfig, RtpOutput
from appliance.models.kinds import input_kind, output_kind
from appliance.untrusted import load_json
from services.edge.engine.supervisor import EngineError
from services.edge.nmos import connection as c
from services.edge.nmos.node import Connections
from services.edge.nmos.schemas import IS05, problems
from services.edge.nmos.tai import parse_tai, tai_ns
from services.edge.service import EdgeService, validate_config

__all__ = ["bp"]

_log = logging.getLogger("mediaplane.edge.nmos")
BASE: Final = "/x-nmos/connection"
V: Final = f"{BASE}/v1.1"
_ROLES: Final = {"senders": "sender", "receivers": "receiver"}

bp = Blueprint("nmos_connection", __name__)
_F = TypeVar("_F", bound=Callable[..., Any])


class Locked(errors.ApplianceError):
    """A scheduled activation is pending (HTTP 423)."""


def _connections() -> Connections:
    return _service().nmos.connections


def _service() -> EdgeService:
    service = current_app.config["EDGE_SERVICE"]
    assert isinstance(service, EdgeService)
    return service


# --------------------------------------------------------------------------- responses


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status=status, content_type="application/json")


def _error(code: int, error: str, debug: str | None = None) -> Response:
    return _json({"code": code, "error": error, "debug": debug}, code)


@bp.errorhandler(errors.ApplianceError)
async def _appliance_error(exc: errors.ApplianceError) -> Response:
    code = 423 if isinstance(exc, Locked) else status_for(exc)
    return _error(code, exc.message)


@bp.errorhandler(c.PatchRejected)
async def _rejected(exc: c.PatchRejected) -> Response:
    return _error(400, "invalid request", "; ".join(exc.texts))


def _route(path: str, **kwargs: Any) -> Callable[[_F], _F]:
    """A route answering with and without the trailing slash (interop.md 5)."""
    return bp.route(path, strict_slashes=False, **kwargs)


# --------------------------------------------------------------------------- lookups


def _endpoints() -> dict[str, c.Endpoint]:
    config = _service().config
    if config.node_id is None:
        return {}
    found = c.endpoints(config.node_id, config.flows)
    for endpoint_id, (endpoint, _) in _connections().swapping.items():
        found.setdefault(endpoint_id, endpoint)
    _connections().state.forget_unknown(set(found))  # deleted flows and outputs leave no state behind
    return found


def _find(role_path: str, endpoint_id: str) -> c.Endpoint:
    role = _ROLES.get(role_path)
    endpoint = _endpoints().get(endpoint_id.rstrip("/")) if role else None
    if endpoint is None or endpoint.role != role:
        raise errors.NotFound(f"no {role or 'resource'} with this id")
    return endpoint


def _config_of(endpoint: c.Endpoint) -> tuple[FlowConfig, OutputConfig | None]:
    flow = _service().flow(endpoint.flow_id)
    output = flow.output(endpoint.output_id) if endpoint.output_id else None
    if endpoint.output_id and output is None and endpoint.id in _connections().swapping:
        output = _connections().swapping[endpoint.id][1]
    return flow, output


def _legs(endpoint: c.Endpoint) -> list[c.Leg]:
    service, st = _service(), _connections().state.of(endpoint.id)
    flow, output = _config_of(endpoint)
    enabled = service.engine.is_running(flow.id) and st.master_enable
    if output is not None:
        return c.sender_legs(output, enabled)
    return c.receiver_legs(flow, enabled)


def _constraints(endpoint: c.Endpoint) -> list[dict[str, Any]]:
    flow, output = _config_of(endpoint)
    return c.sender_constraints(output) if output is not None else c.receiver_constraints(flow)


def _now_tai_ns() -> int:
    return tai_ns(time.time_ns())


# --------------------------------------------------------------------------- listings


@_route(f"{BASE}/", methods=["GET"])
async def root() -> ResponseReturnValue:
    return _json(["v1.1/"])


@_route(f"{V}/", methods=["GET"])
async def version_root() -> ResponseReturnValue:
    return _json(["bulk/", "single/"])


@_route(f"{V}/single/", methods=["GET"])
async def single() -> ResponseReturnValue:
    return _json(["senders/", "receivers/"])


@_route(f"{V}/bulk/", methods=["GET"])
async def bulk() -> ResponseReturnValue:
    return _json(["senders/", "receivers/"])


@_route(f"{V}/single/<role_path>/", methods=["GET"])
async def collection(role_path: str) -> ResponseReturnValue:
    role = _ROLES.get(role_path)
    if role is None:
        raise errors.NotFound("no such collection")
    return _json([f"{e.id}/" for e in _endpoints().values() if e.role == role])


@_route(f"{V}/single/<role_path>/<endpoint_id>/", methods=["GET"])
async def resource(role_path: str, endpoint_id: str) -> ResponseReturnValue:
    endpoint = _find(role_path, endpoint_id)
    listing = ["constraints/", "staged/", "active/", "transportfile/", "transporttype/"]
    return _json(listing if endpoint.role == "sender" else [x for x in listing if x != "transportfile/"])


@_route(f"{V}/single/<role_path>/<endpoint_id>/constraints/", methods=["GET"])
async def constraints(role_path: str, endpoint_id: str) -> ResponseReturnValue:
    return _json(_constraints(_find(role_path, endpoint_id)))


@_route(f"{V}/single/<role_path>/<endpoint_id>/active/", methods=["GET"])
async def active(role_path: str, endpoint_id: str) -> ResponseReturnValue:
    endpoint = _find(role_path, endpoint_id)
    return _json(_connections().state.active_body(endpoint, _legs(endpoint)))


@_route(f"{V}/single/<role_path>/<endpoint_id>/transporttype/", methods=["GET"])
async def transporttype(role_path: str, endpoint_id: str) -> ResponseReturnValue:
    endpoint = _find(role_path, endpoint_id)
    flow, output = _config_of(endpoint)
    kind = output_kind(output.type) if output is not None else input_kind(flow.input.type)
    return _json(kind.nmos_transport)


@_route(f"{V}/single/<role_path>/<endpoint_id>/transportfile/", methods=["GET"])
async def transportfile(role_path: str, endpoint_id: str) -> ResponseReturnValue:
    endpoint = _find(role_path, endpoint_id)
    _, output = _config_of(endpoint)
    if not isinstance(output, RtpOutput):
        raise errors.NotFound("this sender has no transport file (not an rtp output)")
    activation_time = _connections().state.of(endpoint.id).activation.get("activation_time")
    session_version = parse_tai(activation_time) // 1_000_000_000 if activation_time else 1
    return Response(c.sender_sdp(output, endpoint.id, session_version), content_type="application/sdp")


# --------------------------------------------------------------------------- staged


async def _body() -> Any:
    raw = await request.get_data(cache=True)
    try:
        return load_json(raw)
    except Exception:
        raise c.PatchRejected(["malformed JSON body"]) from None


@_route(f"{V}/single/<role_path>/<endpoint_id>/staged/", methods=["GET", "PATCH"])
async def staged(role_path: str, endpoint_id: str) -> ResponseReturnValue:
    endpoint = _find(role_path, endpoint_id)
    if request.method == "GET":
        return _json(_connections().state.staged_body(endpoint, _legs(endpoint)))
    status, body = await _patch(endpoint, await _body())
    return _json(body, status)


async def _patch(endpoint: c.Endpoint, patch: Any) -> tuple[int, dict[str, Any]]:
    """Stage, activate or schedule ``patch`` on ``endpoint``: (HTTP status, body)."""
    conns = _connections()
    state = conns.state
    st = state.of(endpoint.id)
    legs = _legs(endpoint)
    activation = patch.get("activation") if isinstance(patch, dict) else None
    mode = activation.get("mode") if isinstance(activation, dict) else None
    if st.pending is not None:
        if not (isinstance(activation, dict) and "mode" in activation and mode is None):
            raise Locked("a scheduled activation is pending; cancel it with activation.mode null")
        found = problems(IS05, f"{endpoint.role}-stage-schema.json", patch)
        if found:
            raise c.PatchRejected(found)
        # Cancel it; the rest of this PATCH is staged as usual below.
        scope = conns.scopes.pop(endpoint.id, None)
        if scope is not None:
            scope.cancel()
        st.pending = None
    current = state.staged_body(endpoint, legs)
    merged = c.merge_patch(endpoint.role, current, patch, _constraints(endpoint))
    _check_config(*_mapped(endpoint, merged))  # the config rules hold before anything is staged (400)
    if mode is None:
        state.stage(endpoint, merged)
        return 200, state.staged_body(endpoint, legs)
    due, answer = c.activation_times(mode, activation.get("requested_time"), _now_tai_ns())  # type: ignore[union-attr]
    if mode == "activate_immediate":
        async with conns.lock:
            await _apply(endpoint, merged)
        state.activated(endpoint, merged, answer)
        state.rebase(endpoint, _legs(endpoint))
        _service().nmos.activated(endpoint.role, endpoint.id)  # the IS-04 subscription (and a registry) follows at once
        return 200, {**merged, "activation": answer}
    state.stage(endpoint, merged)
    st.pending = c.Pending(due, {**merged, "activation": answer})
    scope = trio.CancelScope()
    conns.scopes[endpoint.id] = scope
    current_app.nursery.start_soon(_scheduled, current_app._get_current_object(), endpoint, scope)  # type: ignore[attr-defined]
    return 202, {**merged, "activation": answer}


def _mapped(endpoint: c.Endpoint, body: dict[str, Any]) -> tuple[FlowConfig, OutputConfig | None]:
    """The config after ``body``'s legs: (new flow, new output or None for a receiver)."""
    flow, output = _config_of(endpoint)
    if output is not None:
        return flow, c.output_with_legs(output, body["transport_params"])
    return c.flow_with_legs(flow, body["transport_params"]), None


def _check_config(flow: FlowConfig, output: OutputConfig | None) -> None:
    """The whole config with this flow (or output) validated as the service will: PatchRejected if not.

    The texts are generic: the service's messages would name the addresses sent.
    """
    service = _service()
    if output is not None:
        flow = flow.model_copy(update={"outputs": [output if o.id == output.id else o for o in flow.outputs]})
    flows = [flow if f.id == flow.id else f for f in service.config.flows]
    try:
        validate_config(service.config.model_copy(update={"flows": flows}), [flow.id])
    except errors.Conflict:
        raise c.PatchRejected(["transport_params: an address is in use by another flow or output"]) from None
    except errors.InvalidInput:
        raise c.PatchRejected(["transport_params: the resulting configuration is invalid"]) from None


async def _scheduled(app: Any, endpoint: c.Endpoint, scope: trio.CancelScope) -> None:
    """Apply a pending activation at its due time (cancelled by ``mode: null``)."""
    async with app.app_context():
        conns = _service().nmos.connections
        st = conns.state.of(endpoint.id)
        pending = st.pending
        if pending is None:
            return
        with scope:
            await trio.sleep(max(0.0, (pending.due_tai_ns - _now_tai_ns()) / 1e9))
        if scope.cancelled_caught or st.pending is not pending:
            return
        conns.scopes.pop(endpoint.id, None)
        try:
            with trio.CancelScope(shield=True):
                async with conns.lock:
                    st.applying = pending.body  # ``active`` shows it from the due time on
                    await _apply(endpoint, pending.body)
        except Exception as exc:  # the answer went out already: log it, drop the pending activation
            _log.error("scheduled IS-05 activation of %s failed: %s", endpoint.id, exc)
            st.pending = None
            return
        finally:
            st.applying = None
        conns.state.activated(endpoint, pending.body, pending.body["activation"])
        _service().nmos.activated(endpoint.role, endpoint.id)
        try:
            conns.state.rebase(endpoint, _legs(endpoint))
        except errors.ApplianceError:  # the flow or output was deleted meanwhile
            pass


async def _apply(endpoint: c.Endpoint, body: dict[str, Any]) -> None:
    """Write the activated legs into the config and the running flow; roll back and raise Internal on failure."""
    service = _service()
    st = _connections().state.of(endpoint.id)
    flow, output = _config_of(endpoint)
    new_flow, new_output = _mapped(endpoint, body)
    enable = bool(body.get("master_enable", True))
    swapping = _connections().swapping
    try:
        if output is not None and new_output is not None:
            swapping[endpoint.id] = (endpoint, output)
            await _apply_sender(service, flow.id, output, new_output, enable, st.master_enable)
        else:
            await _apply_receiver(service, flow, new_flow, enable, st.master_enable)
    except (errors.ApplianceError, EngineError) as exc:
        message = exc.message if isinstance(exc, errors.ApplianceError) else str(exc)
        raise errors.Internal(f"activation failed, the previous parameters stay: {message}") from exc
    finally:
        swapping.pop(endpoint.id, None)


async def _apply_sender(
    service: EdgeService, flow_id: str, old: OutputConfig, new: OutputConfig, enable: bool, was_enabled: bool
) -> None:
    if new != old:
        parked = not was_enabled and service.engine.is_running(flow_id)
        if parked:
            # The engine does not run a parked output, but the service's swap removes it from the
            # engine first: put it back for the swap (it may send until the removal, milliseconds).
            await service.engine.add_output(flow_id, old)
        await service.remove_output(flow_id, old.id)
        try:
            await service.add_output(flow_id, new)
        except errors.ApplianceError:
            try:
                await service.add_output(flow_id, old)  # roll back to the previous output
                if parked:
                    await service.engine.remove_output(flow_id, old.id)  # and parked as it was
            except (errors.ApplianceError, EngineError) as again:
                _log.error("IS-05 rollback of output %s/%s failed: %s", flow_id, old.id, again)
            raise
        was_enabled = True  # add_output put it on the engine again when the flow runs
    if service.engine.is_running(flow_id):
        if not enable and was_enabled:
            await service.engine.remove_output(flow_id, old.id)  # runtime only: the config keeps it
        elif enable and not was_enabled:
            await service.engine.add_output(flow_id, new)


async def _apply_receiver(
    service: EdgeService, old: FlowConfig, new: FlowConfig, enable: bool, was_enabled: bool
) -> None:
    if new != old:
        was_running = service.engine.is_running(old.id)
        try:
            await service.update_flow(old.id, new)  # persists; a running flow restarts
        except errors.ApplianceError:
            try:
                await service.update_flow(old.id, old)
                if was_running and not service.engine.is_running(old.id):
                    await service.restart_flow(old.id)  # the failed start left it stopped
            except errors.ApplianceError as again:
                _log.error("IS-05 rollback of flow %s failed: %s", old.id, again.message)
            raise
    running = service.engine.is_running(old.id)
    if not enable and running:
        await service.stop_flow(old.id)  # runtime only: `enabled` in the config is unchanged
    elif enable and not was_enabled and not running and new.enabled:
        await service.start_flow(old.id)


# --------------------------------------------------------------------------- bulk


@_route(f"{V}/bulk/<role_path>/", methods=["GET", "POST"])
async def bulk_post(role_path: str) -> ResponseReturnValue:
    role = _ROLES.get(role_path)
    if role is None:
        raise errors.NotFound("no such collection")
    if request.method == "GET":
        return _error(405, "use POST on the bulk routes")
    body = await _body()
    found = problems(IS05, f"bulk-{role}-post-schema.json", body)
    if found:
        raise c.PatchRejected(found)
    answers: list[dict[str, Any]] = []
    for item in body:
        try:
            status, _ = await _patch(_find(role_path, item["id"]), item["params"])
            answers.append({"id": item["id"], "code": status})
        except c.PatchRejected as exc:
            answers.append({"id": item["id"], "code": 400, "error": "invalid request", "debug": "; ".join(exc.texts)})
        except errors.ApplianceError as exc:
            code = 423 if isinstance(exc, Locked) else status_for(exc)
            answers.append({"id": item["id"], "code": code, "error": exc.message, "debug": None})
    return _json(answers)
