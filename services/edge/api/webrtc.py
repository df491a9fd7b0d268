"""WHIP and WHEP routes (edge interface §4 "WHIP and WHEP routes", interop.md 4, RFC 9725).

- ``POST /api/v1/flows/{id}/whip``: a publisher's SDP offer for the flow's ``webrtc`` input;
  ``POST /api/v1/flows/{id}/whep``: a viewer's offer for the flow's (first) ``webrtc`` output in
  ``whep_server`` mode. ``Content-Type: application/sdp`` (else 415); 201 with the answer
  (``application/sdp``), ``Location: /api/v1/flows/{id}/whip|whep/{session_id}`` and an ``ETag``.
- ``DELETE .../whip|whep/{session_id}``: ends the session (200); the peer sees its connection close.
- ``PATCH .../whip|whep/{session_id}``: trickle ICE (RFC 9725 §4.3.1,
  ``application/trickle-ice-sdpfrag``, ``If-Match``): 204; an ICE restart is refused 422.

**Who may.** When the flow's input (WHIP) or WHEP output sets a ``bearer_token``, the request
must present exactly that token (``Authorization: Bearer``; else 401): it is what an encoder or a
player is configured with. Otherwise the route is an admin route (edge interface §4), open when
auth is off. Tokens are compared in constant time and never echoed.

**Errors** use the envelope: 404 (unknown flow, or a flow without such an input or output, or an
unknown session), 409 (the flow is not running), 503 (viewer limit, with ``Retry-After``; or the
webrtc worker restarting), 400 (an offer that cannot be answered: no H.264 video).
"""

from __future__ import annotations

import hmac
import time
from typing import Literal

from quart import Blueprint, Response, request

from appliance import auth, errors
from appliance.http.envelope import ok
from appliance.models.config import FlowConfig, WebrtcInput, WebrtcOutput
from services.edge.api.routes import edge
from services.edge.webrtc import http as webrtc_http

bp: Blueprint = Blueprint("edge_webrtc", __name__)

Role = Literal["whip", "whep"]


def _endpoint_token(flow: FlowConfig, role: Role) -> str | None:
    """The bearer token guarding ``flow``'s WHIP input or WHEP output; NotFound without one."""
    if role == "whip":
        if not isinstance(flow.input, WebrtcInput):
            raise errors.NotFound(f"flow {flow.id!r} has no WHIP input (input type 'webrtc')")
        return flow.input.bearer_token
    for output in flow.outputs:
        if isinstance(output, WebrtcOutput) and output.mode == "whep_server":
            return output.bearer_token
    raise errors.NotFound(f"flow {flow.id!r} has no WHEP output (a 'webrtc' output in whep_server mode)")


def _authorise(token: str | None) -> None:
    """The flow's own token when it sets one, else the admin rule of the API."""
    if token is None:
        settings = edge().config.auth
        if settings is None:
            return
        header = request.headers.get("Authorization")
        principal = auth.verify_token(settings, auth.bearer_token(header), int(time.time()))
        auth.require_role(principal, "admin")
        return
    presented = auth.bearer_token(request.headers.get("Authorization")) or ""
    if not hmac.compare_digest(presented.encode(), token.encode()):
        raise errors.AuthRequired("a valid bearer token is required")


def _flow(flow_id: str, role: Role) -> FlowConfig:
    flow = edge().flow(flow_id)
    _authorise(_endpoint_token(flow, role))
    return flow


async def _offer(flow_id: str, role: Role) -> Response:
    flow = _flow(flow_id, role)
    sdp = await webrtc_http.read_body(webrtc_http.SDP, "an SDP offer")
    if not edge().engine.is_running(flow.id):
        raise errors.Conflict(f"flow {flow.id!r} is not running")
    reply = await webrtc_http.ask(edge().webrtc.request({"op": "offer", "flow_id": flow.id, "role": role, "sdp": sdp}))
    if not reply.get("ok"):
        return webrtc_http.refusal(reply)
    return webrtc_http.answer(reply, f"/api/v1/flows/{flow.id}/{role}")


async def _delete(flow_id: str, role: Role, session_id: str) -> Response:
    flow = _flow(flow_id, role)
    message = {"op": "delete", "flow_id": flow.id, "role": role, "session_id": session_id}
    return webrtc_http.session_gone(await webrtc_http.ask(edge().webrtc.request(message))) or ok(None)


async def _patch(flow_id: str, role: Role, session_id: str) -> Response:
    flow = _flow(flow_id, role)
    body = await webrtc_http.read_body(webrtc_http.TRICKLE, "an SDP fragment")
    message = {
        "op": "patch",
        "flow_id": flow.id,
        "role": role,
        "session_id": session_id,
        "if_match": request.headers.get("If-Match"),
        "body": body,
    }
    return webrtc_http.session_gone(await webrtc_http.ask(edge().webrtc.request(message))) or Response("", status=204)


@bp.post("/api/v1/flows/<flow_id>/whip")
async def whip_offer(flow_id: str) -> Response:
    return await _offer(flow_id, "whip")


@bp.post("/api/v1/flows/<flow_id>/whep")
async def whep_offer(flow_id: str) -> Response:
    return await _offer(flow_id, "whep")


@bp.delete("/api/v1/flows/<flow_id>/whip/<session_id>")
async def whip_delete(flow_id: str, session_id: str) -> Response:
    return await _delete(flow_id, "whip", session_id)


@bp.delete("/api/v1/flows/<flow_id>/whep/<session_id>")
async def whep_delete(flow_id: str, session_id: str) -> Response:
    return await _delete(flow_id, "whep", session_id)


@bp.patch("/api/v1/flows/<flow_id>/whip/<session_id>")
async def whip_patch(flow_id: str, session_id: str) -> Response:
    return await _patch(flow_id, "whip", session_id)


@bp.patch("/api/v1/flows/<flow_id>/whep/<session_id>")
async def whep_patch(flow_id: str, session_id: str) -> Response:
    return await _patch(flow_id, "whep", session_id)
