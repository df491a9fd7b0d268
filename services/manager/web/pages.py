"""The dashboard's page routes (issue 21): ``/login``, ``/fleet``, ``/nodes/<id>``, ``/events``,
``/tunnels``, ``/assistant``, ``/users``, ``/settings``, and their static files.

- A page needs the ``session`` cookie (pages are for browsers; a Bearer client uses the API).
  Without a valid session the answer is 303 to ``/login?next=<path>``; a user below the page's
  role gets a 403 page. Both checks are the API's own (``ManagerService.authenticate``,
  ``auth.has_role``); the API refuses again whatever a page shows.
- Pages carry no data of their own beyond who is signed in: their scripts read the API.
- ``/assets/<path>``: this package's ``static/`` directory; ``/vendor/<path>``: the files of
  :data:`VENDORED`, from :func:`vendor_dir` (``make vendor``'s output). Every answer carries a
  strict Content-Security-Policy: scripts and styles from this origin only, nothing inline.
"""

from __future__ import annotations

import logging
import mimetypes
import os
import re
import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Final
from urllib.parse import quote

from quart import Blueprint, Response, redirect, render_template, request
from quart_trio import QuartTrio

from appliance import __version__, errors
from services.manager import auth
from services.manager.api.auth_routes import service
from services.manager.service import Principal
from services.manager.store import Role

__all__ = ["CSP", "PAGES", "VENDORED", "Page", "bp", "register_web", "vendor_dir"]

_log = logging.getLogger("mediaplane.manager.web")

bp = Blueprint("manager_web", __name__, template_folder="templates")

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""Scripts, styles and sockets from this origin only (CSP Level 3 ``'self'`` covers ``wss:`` to it)."""

VENDORED: Final = frozenset({"uplot/dist/uPlot.iife.min.js", "uplot/dist/uPlot.min.css", "uplot/LICENSE"})
"""The npm files the pages load (``tools/npm-assets.json`` pins them and their digests)."""
VENDOR_ENV: Final = "MEDIAPLANE_VENDOR_DIR"
SYSTEM_VENDOR_DIR: Final = Path("/usr/share/mediaplane/vendor/npm")
"""Where the appliance image puts ``make vendor``'s output (image/mkosi.postinst.chroot)."""
_SOURCE_VENDOR_DIR: Final = Path(__file__).resolve().parents[3] / "build" / "vendor" / "npm"
_TEXT_TYPES: Final = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
_SAFE_PATH: Final = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


@dataclass(frozen=True, slots=True)
class Page:
    """One page of the navigation: its path, its label and the least role that sees it."""

    name: str
    label: str
    role: Role


PAGES: Final = (
    Page("fleet", "Fleet", Role.VIEWER),
    Page("events", "Events", Role.VIEWER),
    Page("tunnels", "Tunnels", Role.VIEWER),
    Page("assistant", "Assistant", Role.OPERATOR),
    Page("users", "Users", Role.ADMIN),
    Page("settings", "Settings", Role.ADMIN),
)
_BY_NAME: Final = {page.name: page for page in PAGES}


def register_web(app: QuartTrio) -> None:
    """Adds the page routes to ``app`` and logs once when the vendored scripts are missing."""
    app.register_blueprint(bp)
    missing = sorted(name for name in VENDORED if not (vendor_dir() / name).is_file())
    if missing:
        _log.warning("dashboard: vendored files missing in %s (%s): run make vendor", vendor_dir(), ", ".join(missing))


@cache
def vendor_dir() -> Path:
    """``$MEDIAPLANE_VENDOR_DIR``, else the source tree's ``build/vendor/npm`` when it exists,
    else the image's ``/usr/share/mediaplane/vendor/npm``."""
    configured = os.environ.get(VENDOR_ENV)
    if configured:
        return Path(configured)
    if _SOURCE_VENDOR_DIR.is_dir():
        return _SOURCE_VENDOR_DIR
    return SYSTEM_VENDOR_DIR


# --------------------------------------------------------------------------- who is asking
async def _signed_in() -> Principal | None:
    token = request.cookies.get(auth.SESSION_COOKIE)
    if not token:
        return None
    try:
        return await service().authenticate(token)
    except errors.ApplianceError:
        return None


def _to_login() -> Response:
    target = request.full_path.rstrip("?") if request.query_string else request.path
    response = redirect(f"/login?next={quote(target, safe='/')}", 303)
    response.headers["Cache-Control"] = "no-store"
    return response  # type: ignore[return-value]


def _html(body: str, status: int = 200) -> Response:
    response = Response(body, status=status, content_type="text/html; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = CSP
    response.headers["Referrer-Policy"] = "same-origin"
    return response


async def _render(
    page: str, principal: Principal, *, status: int = 200, context: dict[str, str] | None = None
) -> Response:
    role = principal.role
    user = principal.user
    nav = [item for item in PAGES if auth.has_role(role, item.role)]
    body = await render_template(
        f"{page}.html",
        page=page,
        nav=nav,
        version=__version__,
        username=user.username,
        display_name=user.display_name or user.username,
        role=role.value,
        can_operate=auth.has_role(role, Role.OPERATOR),
        can_admin=auth.has_role(role, Role.ADMIN),
        is_super=role is Role.SUPER_ADMIN,
        **(context or {}),
    )
    return _html(body, status)


async def _page(name: str, context: dict[str, str] | None = None) -> Response:
    principal = await _signed_in()
    if principal is None:
        return _to_login()
    needed = _BY_NAME[name].role if name in _BY_NAME else Role.VIEWER
    if not auth.has_role(principal.role, needed):
        return await _render("forbidden", principal, status=403, context={"needed": needed.value})
    return await _render(name, principal, context=context)


# --------------------------------------------------------------------------- pages
@bp.get("/")
async def index() -> Response:
    return redirect("/fleet", 303)  # type: ignore[return-value]


@bp.get("/login")
async def login_page() -> Response:
    return _html(await render_template("login.html", version=__version__))


@bp.get("/fleet")
async def fleet() -> Response:
    return await _page("fleet")


@bp.get("/nodes/<node_id>")
async def node(node_id: str) -> Response:
    try:
        parsed = uuid.UUID(node_id)
    except ValueError:
        principal = await _signed_in()
        if principal is None:
            return _to_login()
        return await _render("not_found", principal, status=404)
    return await _page("node", {"node_id": str(parsed)})


@bp.get("/events")
async def events() -> Response:
    return await _page("events")


@bp.get("/tunnels")
async def tunnels() -> Response:
    return await _page("tunnels")


@bp.get("/assistant")
async def assistant() -> Response:
    return await _page("assistant")


@bp.get("/users")
async def users() -> Response:
    return await _page("users")


@bp.get("/settings")
async def settings() -> Response:
    return await _page("settings")


# --------------------------------------------------------------------------- files
def _file(data: bytes, name: str) -> Response:
    suffix = Path(name).suffix
    content_type = _TEXT_TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "text/plain; charset=utf-8"
    response = Response(data, status=200, content_type=content_type)
    response.headers["Cache-Control"] = "no-cache"  # revalidated: an upgrade's new script is taken at once
    response.headers["Content-Security-Policy"] = CSP
    return response


def _missing() -> Response:
    return Response("not found", status=404, content_type="text/plain; charset=utf-8")


@bp.get("/assets/<path:name>")
async def static_file(name: str) -> Response:
    if not _SAFE_PATH.fullmatch(name) or ".." in name.split("/"):
        return _missing()
    found = resources.files("services.manager.web").joinpath("static", *name.split("/"))
    if not found.is_file():
        return _missing()
    return _file(found.read_bytes(), name)


@bp.get("/vendor/<path:name>")
async def vendor_file(name: str) -> Response:
    if name not in VENDORED:
        return _missing()
    try:
        data = (vendor_dir() / name).read_bytes()
    except OSError:
        return _missing()
    return _file(data, name)
