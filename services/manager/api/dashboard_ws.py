"""``/ws/dashboard``: the browsers' push-only stream of ``dashboard_update`` (interop.md 6).

- The session (the ``session`` cookie first, else ``Authorization: Bearer``, as the REST guard)
  is checked BEFORE the upgrade: no session, a bad, expired or revoked one, or an unusable user
  gets a plain HTTP 401 ``{"error": …}`` with ``WWW-Authenticate: Bearer``, and no socket.
- After the upgrade the route only forwards the frames of its
  :class:`~services.manager.dashboard.Subscription`; client frames are read and dropped (quart-trio
  stops reading the socket, close frames included, when its small inbox is full).
- Every :data:`REAUTH_INTERVAL_S` the session is checked again: a session revoked (logout, a new
  password, a disabled user) closes the socket with 1008, and a viewer's changed
  ``allowed_node_ids`` apply from the next update.
- A user below admin sees only its ``allowed_node_ids`` (null: every node), as on every route.

The stream itself (:class:`~services.manager.dashboard.DashboardStream`) starts with the app
(``before_app_serving``) when a node hub is registered (``api.ws.register_hub``); without one the
route answers 503 after the session check.
"""

from __future__ import annotations

import logging
from typing import Final, cast
from uuid import UUID

import trio
from quart import Blueprint, Response, current_app, websocket
from quart_trio import QuartTrio

from appliance import errors
from appliance.http.envelope import bare_fail, status_for
from services.manager import auth
from services.manager.api.auth_routes import service
from services.manager.api.ws import HUB_KEY
from services.manager.auth import visible_node_ids
from services.manager.dashboard import DashboardStream, Subscription
from services.manager.hub import NodeHub
from services.manager.service import ManagerService, Principal
from services.manager.store import NodeRecord

__all__ = ["REAUTH_INTERVAL_S", "STREAM_KEY", "bp", "dashboard_stream", "visible_nodes"]

_log = logging.getLogger("mediaplane.manager.dashboard")

STREAM_KEY: Final = "MANAGER_DASHBOARD_STREAM"
REAUTH_INTERVAL_S: Final = 15.0
POLICY_VIOLATION: Final = 1008  # RFC 6455 §7.4.1

bp = Blueprint("dashboard_ws", __name__)


def dashboard_stream() -> DashboardStream | None:
    """The stream of the current app, or None when it has none (no node hub)."""
    found = current_app.config.get(STREAM_KEY)
    return found if isinstance(found, DashboardStream) else None


def visible_nodes(principal: Principal) -> frozenset[UUID] | None:
    """The node ids a caller may see (``auth.visible_node_ids``; None: all)."""
    return visible_node_ids(principal.user)


@bp.before_app_serving
async def start_stream() -> None:
    """Starts the stream in the app's nursery once serving, if the app has a node hub."""
    app = cast(QuartTrio, current_app._get_current_object())  # type: ignore[attr-defined]
    hub = app.config.get(HUB_KEY)
    if not isinstance(hub, NodeHub):
        return
    manager = service()

    async def interval_ms() -> int:
        return (await manager.runtime_settings()).stats_broadcast_interval_ms  # live (interop.md 7.5)

    stream = DashboardStream(_StoreRows(manager), hub, interval_ms=interval_ms)
    app.config[STREAM_KEY] = stream
    app.nursery.start_soon(stream.run)


class _StoreRows:
    """The service's store, looked up on each read: the store is attached after the app is
    built, and test apps may serve without one until a browser subscribes."""

    def __init__(self, manager: ManagerService) -> None:
        self._manager = manager

    async def list_nodes(self) -> list[NodeRecord]:
        return await self._manager.store.list_nodes()


def _session_token() -> str | None:
    cookie = websocket.cookies.get(auth.SESSION_COOKIE)
    if cookie:
        return cookie
    scheme, _, token = websocket.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


async def _authenticate() -> Principal | Response:
    token = _session_token()
    try:
        if token is None:
            raise errors.AuthRequired("authentication required")
        return await service().authenticate(token)
    except errors.ApplianceError as exc:
        status = status_for(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
        return bare_fail(exc.message, status, headers)


@bp.websocket("/ws/dashboard")
async def dashboard_socket() -> Response | None:
    """A browser's stream: 401 before the upgrade without a live session, then push-only."""
    principal = await _authenticate()
    if isinstance(principal, Response):
        return principal
    stream = dashboard_stream()
    if stream is None:
        return bare_fail("the dashboard stream is not running", 503)
    token = _session_token()
    assert token is not None
    await websocket.accept()
    with stream.subscribe(visible_nodes(principal)) as sub:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_ignore_client_frames)
            nursery.start_soon(_recheck_session, token, sub, nursery.cancel_scope)
            async for frame in sub:
                await websocket.send(frame)
            nursery.cancel_scope.cancel()
    return None


async def _ignore_client_frames() -> None:
    while True:
        await websocket.receive()  # push-only: dropped unread


async def _recheck_session(token: str, sub: Subscription, scope: trio.CancelScope) -> None:
    while True:
        await trio.sleep(REAUTH_INTERVAL_S)
        try:
            principal = await service().authenticate(token)
        except errors.AuthRequired:
            _log.info("dashboard socket closed: its session ended")
            await websocket.close(POLICY_VIOLATION, "session ended")
            scope.cancel()
            return
        except errors.ApplianceError:
            continue  # a store hiccup: keep the socket, try again later
        sub.visible = visible_nodes(principal)
