"""Login, logout and the guard every authenticated route goes through (interop.md 7.1, 13).

- ``POST /api/v1/auth/login`` (public): ``{username, password}``; success and error bodies
  of interop.md 7.1 (``{success, csrf_token, user, error?}``), the ``session`` and
  ``csrf_token`` cookies.
- ``POST /api/v1/auth/logout``: revokes the session, expires both cookies, ``{success:true}``.
- :func:`require` marks a view with the least role it needs; :func:`guard_request` (a
  ``before_request`` hook that ``register_api`` puts before the body reader) then checks,
  in this order: the session (the ``session`` cookie first, else ``Authorization: Bearer``;
  401), CSRF on POST/PUT/PATCH/DELETE (403), the role (403). The body is read after, so
  413 and 400 come later, as interop.md 13 orders them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, StrictStr, TypeAdapter
from quart import Blueprint, Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from appliance import errors
from appliance.http.app import read_json_object, validate
from appliance.http.envelope import bare_fail, json_response, status_for
from services.manager import auth
from services.manager.service import LOGIN_WINDOW, SERVICE_CONFIG_KEY, LoginResult, ManagerService, Principal, UserOut
from services.manager.settings import TlsMode
from services.manager.store import Role

__all__ = ["bp", "client_ip", "current_principal", "guard_request", "require", "service"]

bp = Blueprint("manager_auth", __name__)

F = TypeVar("F", bound=Callable[..., Any])
_REQUIRED_ROLE: Final = "_mediaplane_required_role"


def service() -> ManagerService:
    """The service of the app answering the current request."""
    found = current_app.config[SERVICE_CONFIG_KEY]
    assert isinstance(found, ManagerService)
    return found


def require(role: Role) -> Callable[[F], F]:
    """Marks a view as needing an authenticated caller of at least ``role``."""

    def mark(view: F) -> F:
        setattr(view, _REQUIRED_ROLE, role)
        return view

    return mark


def current_principal() -> Principal:
    """The caller of a view marked with :func:`require` (set by the guard)."""
    principal = g.get("principal")
    assert isinstance(principal, Principal)
    return principal


def client_ip() -> str:
    """The client IP for rate limits (interop.md 13).

    ``direct``: the socket's peer. ``behind_proxy``: the last ``X-Forwarded-For`` entry,
    the one the proxy in front appended, else the peer.
    """
    peer = request.remote_addr or "unknown"
    if service().tls_mode is TlsMode.BEHIND_PROXY:
        # Every header line, in order (RFC 9110 §5.3: repeated lines are one comma list). A proxy
        # such as HAProxy (``option forwardfor``) appends its own *line* after any the client
        # sent; ``headers.get`` returned only the first line, the client's, so a client could
        # pick its own "IP" and get round the login limit (found by the fleet e2e).
        forwarded = ",".join(request.headers.getlist("X-Forwarded-For"))
        last = forwarded.rsplit(",", 1)[-1].strip()
        if last:
            return last[:64]
    return peer


def _session_token() -> str:
    cookie = request.cookies.get(auth.SESSION_COOKIE)
    if cookie:
        return cookie
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    raise errors.AuthRequired("authentication required")


async def guard_request() -> Response | None:
    """Authenticates and authorises a request to a view marked with :func:`require`."""
    view = current_app.view_functions.get(request.endpoint) if request.endpoint else None
    needed = getattr(view, _REQUIRED_ROLE, None)
    if not isinstance(needed, Role):
        return None
    try:
        principal = await service().authenticate(_session_token())
        auth.check_csrf(request.method, request.headers.get(auth.CSRF_HEADER), request.cookies.get(auth.CSRF_COOKIE))
        if not auth.has_role(principal.role, needed):
            raise errors.NotAllowed(f"this needs the {needed.value} role or higher")
    except errors.ApplianceError as exc:
        return await _refuse(exc)
    g.principal = principal
    return None


async def _refuse(exc: errors.ApplianceError) -> Response:
    status = status_for(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    try:
        # quart-trio 0.12: a body left unread can hang the next request on the connection.
        await request.get_data(cache=True)
    except HTTPException:
        headers["Connection"] = "close"
    return bare_fail(exc.message, status, headers)


# --- login and logout --------------------------------------------------------------------


class LoginRequest(BaseModel):
    """``POST /api/v1/auth/login``."""

    model_config = ConfigDict(extra="forbid")

    username: StrictStr
    password: StrictStr


_LOGIN: Final = TypeAdapter(LoginRequest)


def _login_error(message: str, status: int) -> Response:
    response = json_response({"success": False, "csrf_token": None, "user": None, "error": message}, status)
    if status == 429:
        # The limit counts attempts in a sliding 60 s window (interop.md 7.1): after 60 s none of
        # them counts any more. The sign-in page shows this wait rather than failing silently.
        response.headers["Retry-After"] = str(int(LOGIN_WINDOW.total_seconds()))
    return response


def _cookie(name: str, value: str, max_age: int, *, http_only: bool) -> str:
    """``name=value; [HttpOnly; ][Secure; ]SameSite=Lax; Path=/; Max-Age=N`` (interop.md 7.1, 1.3)."""
    parts = [f"{name}={value}"]
    if http_only:
        parts.append("HttpOnly")
    if service().tls_mode is TlsMode.DIRECT:
        parts.append("Secure")
    parts += ["SameSite=Lax", "Path=/", f"Max-Age={max_age}"]
    return "; ".join(parts)


@bp.post("/api/v1/auth/login")
async def login() -> Response:
    """Checks the credentials; sets the ``session`` and ``csrf_token`` cookies."""
    try:
        body = validate(_LOGIN, await read_json_object())
        result: LoginResult = await service().login(body.username, body.password, client_ip())
    except errors.ApplianceError as exc:
        return _login_error(exc.message, status_for(exc))
    max_age = int(result.lifetime.total_seconds())
    response = json_response(
        {"success": True, "csrf_token": result.csrf_token, "user": UserOut.login_view(result.user)}
    )
    response.headers.add("Set-Cookie", _cookie(auth.SESSION_COOKIE, result.session_jwt, max_age, http_only=True))
    response.headers.add("Set-Cookie", _cookie(auth.CSRF_COOKIE, result.csrf_token, max_age, http_only=False))
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.post("/api/v1/auth/logout")
@require(Role.VIEWER)
async def logout() -> Response:
    """Revokes the session and expires both cookies."""
    await service().logout(current_principal())
    response = json_response({"success": True})
    response.headers.add("Set-Cookie", _cookie(auth.SESSION_COOKIE, "", 0, http_only=True))
    response.headers.add("Set-Cookie", _cookie(auth.CSRF_COOKIE, "", 0, http_only=False))
    return response
