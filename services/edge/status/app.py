"""The monitor listener (interop.md 2 ``monitor``): a read-only status page, no auth.

A second quart-trio app on ``monitor.listen_addr:listen_port`` beside the API, only when
``monitor`` is set (read at start: a change takes effect at the next start). It serves

- ``GET /``: the page, rendered on the server (Jinja2), live through ``/ws``;
- ``GET /api/stats``: the same envelope and data as ``GET /api/v1/stats``;
- ``GET /ws``: a WebSocket pushing the page's live parts about every second, with the
  thumbnails a viewer has not seen yet (JSON text frames; client messages are ignored);
- ``GET /static/status.css`` and ``/static/status.js``: the page's own style and script;
- ``POST /watch/<flow_id>``: the page's "watch" button, a WHEP offer (RFC 9725) for the
  flow's picture and sound: ``Content-Type: application/sdp`` (else 415), at most 64 KiB
  (else 413); 201 with the answer (``application/sdp``) and
  ``Location: /watch/<flow_id>/<session_id>``. Errors in the envelope: 404 (unknown flow),
  409 (flow not running), 503 (viewer limit, with ``Retry-After``; or the webrtc worker
  restarting), 400 (an offer that cannot be answered);
- ``DELETE /watch/<flow_id>/<session_id>``: ends that viewer's session (200; 404 unknown).

It reads statistics only: never the configuration (it holds secrets) and nothing that
changes state. Thumbnails come from ``thumbnailer.Thumbnailer``. Watching is reading too,
which is why the unauthenticated listener takes a POST at all: a watch changes no state of
the flow (its configuration, outputs and stats are untouched; the copy of its TS goes
through a hidden tap, as the thumbnails' does, removed when the last viewer leaves), and
the viewers are capped per flow (``WATCH_MAX_VIEWERS``, 503 beyond), so an anonymous
viewer cannot load the edge more than a few viewers' encryption of the same packets.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Final

import trio
from quart import Response, websocket
from quart_trio import QuartTrio

from appliance.http.app import create_app, discard_client_messages, first_os_error, serve
from appliance.http.envelope import ok
from appliance.models.config import UdpOutput
from services.edge.service import EdgeService
from services.edge.status.hub import MonitorHub
from services.edge.status.thumbnailer import Thumbnailer
from services.edge.webrtc import http as webrtc_http

_log = logging.getLogger("mediaplane.edge.status")

STATIC: Final = {"status.css": "text/css; charset=utf-8", "status.js": "text/javascript; charset=utf-8"}
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def build_monitor_app(service: EdgeService, hub: MonitorHub) -> QuartTrio:
    app = create_app("mediaplane-edge-monitor")

    @app.after_request
    async def _headers(response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.get("/")
    async def page() -> Response:
        return Response(hub.page(), status=200, content_type="text/html; charset=utf-8")

    @app.get("/api/stats")
    async def stats() -> Response:
        return ok(service.snapshot())

    @app.get("/static/<name>")
    async def static_file(name: str) -> Response:
        content_type = STATIC.get(name)
        if content_type is None:
            return Response("not found", status=404, content_type="text/plain")
        body = resources.files("services.edge.status").joinpath("static", name).read_bytes()
        return Response(body, status=200, content_type=content_type)

    @app.post("/watch/<flow_id>")
    async def watch(flow_id: str) -> Response:
        sdp = await webrtc_http.read_body(webrtc_http.SDP, "an SDP offer")
        reply = await webrtc_http.ask(service.watch_offer(flow_id, sdp))  # NotFound 404, Conflict 409
        if not reply.get("ok"):
            return webrtc_http.refusal(reply)
        return webrtc_http.answer(reply, f"/watch/{flow_id}", patchable=False)

    @app.delete("/watch/<flow_id>/<session_id>")
    async def unwatch(flow_id: str, session_id: str) -> Response:
        service.flow(flow_id)  # 404
        message = {"op": "delete", "flow_id": flow_id, "role": "watch", "session_id": session_id}
        return webrtc_http.session_gone(await webrtc_http.ask(service.webrtc.request(message))) or ok(None)

    @app.websocket("/ws")
    async def ws() -> None:
        await websocket.accept()
        mailbox = hub.join()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(discard_client_messages, nursery.cancel_scope)
                while True:
                    frame = await mailbox.take()
                    await websocket.send(hub.message(frame, mailbox))
        finally:
            hub.leave(mailbox)

    return app


async def serve_monitor(
    service: EdgeService,
    host: str,
    port: int,
    *,
    shutdown_trigger: trio.Event,
    task_status: trio.TaskStatus[bool] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the status page until cancelled; reports True once listening, False when it cannot bind.

    A monitor port that cannot be bound is logged and the edge runs on without the page:
    the media and the API do not depend on it.
    """

    async def add_tap(flow_id: str, output: UdpOutput) -> None:
        await service.engine.add_output(flow_id, output)

    async def remove_tap(flow_id: str, output_id: str) -> None:
        await service.engine.remove_output(flow_id, output_id)

    thumbnailer = Thumbnailer(add_tap, remove_tap)
    hub = MonitorHub(service.snapshot, thumbnailer)
    app = build_monitor_app(service, hub)
    async with trio.open_nursery() as nursery:
        await nursery.start(thumbnailer.run)
        service.snapshot_listeners.append(hub.on_snapshot)
        try:
            try:
                await nursery.start(
                    lambda task_status: serve(
                        app, host, port, shutdown_trigger=shutdown_trigger.wait, task_status=task_status
                    )
                )
            except BaseException as exc:
                os_error = first_os_error(exc)
                if os_error is None:
                    raise
                shown = f"[{host}]" if ":" in host else host
                _log.error("status page: cannot listen on %s:%d: %s", shown, port, os_error.strerror or os_error)
                task_status.started(False)
                nursery.cancel_scope.cancel()
                return
            shown = f"[{host}]" if ":" in host else host
            _log.info("status page on http://%s:%d/", shown, port)
            task_status.started(True)
            await trio.sleep_forever()
        finally:
            service.snapshot_listeners.remove(hub.on_snapshot)
            nursery.cancel_scope.cancel()
