"""The HTTP side of a WHIP/WHEP exchange, shared by the API's routes (``api/webrtc.py``) and the
status page's watch (``status/app.py``): reading an offer, asking the webrtc worker, and turning
its reply into the response (RFC 9725 §4.2: 201, ``application/sdp``, ``Location``, ``ETag``).

Quart request context only; the decisions (which flow, who may) stay with the callers.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Final

from quart import Response, request

from appliance import errors
from appliance.http.envelope import fail
from services.edge.webrtc.supervisor import WebrtcUnavailable

SDP: Final = "application/sdp"
TRICKLE: Final = "application/trickle-ice-sdpfrag"
MAX_SDP_BYTES: Final = 64 * 1024


def media_type() -> str:
    """The request's ``Content-Type`` without its parameters, lower case."""
    return (request.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()


async def read_body(content_type: str, what: str) -> str:
    """The request body as text: 415 for another content type, 413 over ``MAX_SDP_BYTES``, 400
    when it is not UTF-8 (the body is never echoed)."""
    if media_type() != content_type:
        raise errors.UnsupportedMediaType(f"Content-Type must be {content_type}")
    raw = await request.get_data(cache=True)
    body = raw if isinstance(raw, bytes) else raw.encode()
    if len(body) > MAX_SDP_BYTES:
        raise errors.PayloadTooLarge(f"{what} is at most {MAX_SDP_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.InvalidInput(f"the body is not {what}") from None


async def ask(pending: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """The worker's reply; 503 while it is not running."""
    try:
        return await pending
    except WebrtcUnavailable as exc:
        raise errors.ServiceUnavailable(str(exc)) from None


def refusal(reply: dict[str, Any]) -> Response:
    """The worker's refusal as the envelope, with its status (and ``Retry-After``)."""
    status = reply.get("status")
    headers = reply.get("headers")
    return fail(
        str(reply.get("error") or "WebRTC session refused"),
        status if isinstance(status, int) and 400 <= status < 600 else 500,
        {str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else None,
    )


def answer(reply: dict[str, Any], location_prefix: str, *, patchable: bool = True) -> Response:
    """201 with the SDP answer, ``Location: {location_prefix}/{session_id}``, its ``ETag``, and
    ``Accept-Patch`` when the route takes trickle ICE (RFC 9725 §4.3.1)."""
    response = Response(str(reply["sdp"]), status=201, content_type=SDP)
    response.headers["Location"] = f"{location_prefix}/{reply['session_id']}"
    if reply.get("etag"):
        response.headers["ETag"] = str(reply["etag"])
    if patchable:
        response.headers["Accept-Patch"] = TRICKLE
    return response


def session_gone(reply: dict[str, Any]) -> Response | None:
    """None when the worker ended or patched the session; else the error (404 when the worker
    has no such target: the flow's registration went away, so neither has it the session)."""
    if reply.get("ok"):
        return None
    if reply.get("status") == 409:
        raise errors.NotFound("session not found")
    return refusal(reply)


__all__ = ["MAX_SDP_BYTES", "SDP", "TRICKLE", "answer", "ask", "media_type", "read_body", "refusal", "session_gone"]
