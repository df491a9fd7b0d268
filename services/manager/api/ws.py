"""``/ws/node``: the WebSocket every edge and relay keeps open to the manager (interop.md 6).

The route only accepts the socket and hands it to the :class:`~services.manager.hub.NodeHub`,
which runs the protocol (style.md H8). Credentials come in the first frame, never in the query,
so the handshake itself needs no authentication. quart cancels the handler when the node goes
away; the hub records the node offline in a shielded ``finally``.
"""

from __future__ import annotations

from typing import Final, cast

from quart import Blueprint, current_app, websocket
from quart_trio import QuartTrio

from services.manager.hub import NodeHub

__all__ = ["HUB_KEY", "bp", "node_hub", "register_hub"]

HUB_KEY: Final = "MANAGER_NODE_HUB"

bp = Blueprint("node_ws", __name__)


def register_hub(app: QuartTrio, hub: NodeHub) -> None:
    """Serve ``/ws/node`` on ``app`` with ``hub`` (found by routes through :func:`node_hub`)."""
    app.config[HUB_KEY] = hub
    app.register_blueprint(bp)


@bp.before_app_serving
async def start_hub() -> None:
    """Starts the hub's report writer in the app's nursery once serving (cancelled with it)."""
    app = cast(QuartTrio, current_app._get_current_object())  # type: ignore[attr-defined]
    hub = app.config.get(HUB_KEY)
    if isinstance(hub, NodeHub):
        app.nursery.start_soon(hub.run)


@bp.after_app_serving
async def flush_hub() -> None:
    """Writes what the nodes reported last (the offline marks of the sockets just closed)."""
    hub = current_app.config.get(HUB_KEY)
    if isinstance(hub, NodeHub):
        await hub.reports.flush()


def node_hub() -> NodeHub:
    """The hub of the app answering the current request or WebSocket."""
    hub = current_app.config[HUB_KEY]
    assert isinstance(hub, NodeHub)
    return hub


class _QuartNodeSocket:
    """quart's current ``websocket`` as the hub's ``NodeSocket``.

    A node that goes away cancels the handler, so ``receive`` never has to report it.
    """

    async def receive(self) -> str | bytes:
        return await websocket.receive()

    async def send(self, frame: str) -> None:
        await websocket.send(frame)

    async def close(self, code: int, reason: str) -> None:
        await websocket.close(code, reason)


@bp.websocket("/ws/node")
async def node_socket() -> None:
    """A node's connection: ``auth`` first, within 10 s, then the protocol of interop.md 6."""
    hub = node_hub()
    await websocket.accept()
    await hub.serve(_QuartNodeSocket())
