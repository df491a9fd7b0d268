"""IS-04 v1.3 Node API (``/x-nmos/node/v1.3/``, interop.md 5), and the ``/x-nmos/`` root.

Public routes (edge-http-interface.md 5.3): nothing here uses the API's ``guarded``. Each
request builds the resources from the service's config and running state
(``services.edge.nmos.model``); the ``VersionTracker`` in ``app.config`` stamps the versions.

Every route answers with and without its trailing slash (the app has ``strict_slashes`` off and
the rules end in ``/``, so there is no redirect). Every response under ``/x-nmos/`` (the
Connection API's too) carries the CORS headers, and an error there has the NMOS body
``{code, error, debug}``: an envelope error of the app's handlers (the 404 of an unknown path,
a 405, a 413...) is rewritten, so no catch-all route shadows the Connection API's 405s.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import trio
from quart import Blueprint, Response, current_app, request

from appliance.models.stats import FlowState
from services.edge.nmos.model import (
    HostInfo,
    Interface,
    NmosResources,
    Running,
    VersionTracker,
    build_resources,
)

__all__ = ["bp", "error_response", "host_addresses", "host_interfaces", "nmos_resources", "primary_address"]

bp = Blueprint("nmos_node", __name__)
_View = Callable[..., Awaitable[Response]]

TRACKER_KEY: Final = "NMOS_VERSION_TRACKER"
SYS_NET: Final = Path("/sys/class/net")
PROC_INET6: Final = Path("/proc/net/if_inet6")
_SIOCGIFADDR: Final = 0x8915
_ARPHRD_LOOPBACK: Final = "772"
_IDLE_OUTPUT_STATES: Final = frozenset({"idle", "stopped", "failed", "error"})
CORS_HEADERS: Final = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, PUT, POST, PATCH, DELETE, OPTIONS, HEAD",
    "Access-Control-Allow-Headers": "Content-Type, Accept, Authorization",
    "Access-Control-Max-Age": "3600",
}
_COLLECTIONS: Final = ("sources", "flows", "devices", "senders", "receivers")


# --------------------------------------------------------------------------- host facts (IO)


def host_interfaces(sys_net: Path = SYS_NET) -> tuple[Interface, ...]:
    """The host's interfaces with a MAC, by name, loopback left out (``/sys/class/net``)."""
    found = []
    try:
        names = sorted(entry.name for entry in sys_net.iterdir())
    except OSError:
        return ()
    for name in names:
        try:
            if (sys_net / name / "type").read_text().strip() == _ARPHRD_LOOPBACK:
                continue
            mac = (sys_net / name / "address").read_text().strip().lower()
        except OSError:
            continue
        if len(mac.split(":")) == 6:
            found.append(Interface(name, mac))
    return tuple(found)


def host_addresses(family: int = 4, proc_inet6: Path = PROC_INET6) -> list[str]:
    """The host's global addresses: IPv4 (one per interface, ``SIOCGIFADDR``) or IPv6
    (``/proc/net/if_inet6``, global scope), loopback and link-local left out."""
    found: list[str] = []
    if family == 6:
        try:
            lines = proc_inet6.read_text().splitlines()
        except OSError:
            return []
        for line in lines:
            fields = line.split()
            if len(fields) >= 6 and fields[3] == "00":  # scope: global
                found.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
        return found
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = ipaddress.IPv4Address(packed[20:24])
            if not address.is_loopback and not address.is_link_local:
                found.append(str(address))
    return found


def primary_address(family: int = 4) -> str | None:
    """The local address of the default route (a UDP ``connect`` to a documentation address
    only looks the route up; nothing is sent), None without one."""
    target = ("2001:db8::1", 9) if family == 6 else ("192.0.2.1", 9)
    try:
        with socket.socket(socket.AF_INET6 if family == 6 else socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            return str(probe.getsockname()[0])
    except OSError:
        return None


def _host_info() -> HostInfo:
    service = current_app.config["EDGE_SERVICE"]
    scheme, host, port = service.listening or ("http", service.listen_at_start[0], service.listen_at_start[1])
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        wildcard = False
    others: tuple[str, ...] = ()
    if wildcard:
        # Listening on every address: the href is the host's primary address (stable, so the
        # node's version does not move with the client), else the one this client reached; the
        # endpoints list every address of the host, so a client finds the one it used.
        families = (6, 4) if ":" in host else (4,)  # "::" is dual-stack
        server = request.scope.get("server")
        host = primary_address(families[0]) or (str(server[0]) if server else host)
        others = tuple(address for family in families for address in host_addresses(family))
    return HostInfo(socket.gethostname(), host, int(port), host_interfaces(), protocol=scheme, other_hosts=others)


def _running() -> Running:
    snapshot = current_app.config["EDGE_SERVICE"].snapshot()
    flows = frozenset(f.flow_id for f in snapshot.flows if f.state is FlowState.RUNNING)
    outputs = frozenset(
        (f.flow_id, o.output_id)
        for f in snapshot.flows
        if f.flow_id in flows
        for o in f.outputs
        if o.state not in _IDLE_OUTPUT_STATES
    )
    return Running(flows, outputs)


def _tracker() -> VersionTracker:
    tracker = current_app.config.get(TRACKER_KEY)
    if tracker is None:
        service = current_app.config["EDGE_SERVICE"]
        since_boot_ns = int((trio.current_time() - service.started_at) * 1_000_000_000)
        tracker = VersionTracker(time.time_ns() - since_boot_ns)
        current_app.config[TRACKER_KEY] = tracker
    assert isinstance(tracker, VersionTracker)
    return tracker


def nmos_resources() -> NmosResources:
    """The service's IS-04 resources now, versions stamped (for this API and the IS-05 one)."""
    service = current_app.config["EDGE_SERVICE"]
    built = build_resources(service.config, _running(), _host_info(), version=service.version)
    return _tracker().stamp(built, time.time_ns())


# --------------------------------------------------------------------------- responses


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, mimetype="application/json")


def error_response(code: int, error: str, debug: str | None = None) -> Response:
    """The NMOS error body (error.json)."""
    return _json({"code": code, "error": error, "debug": debug}, code)


@bp.after_app_request
async def _nmos_headers(response: Response) -> Response:
    if not request.path.startswith("/x-nmos"):
        return response
    for name, value in CORS_HEADERS.items():
        response.headers[name] = value
    wanted = request.headers.get("Access-Control-Request-Headers")
    if wanted:
        response.headers["Access-Control-Allow-Headers"] = f"{CORS_HEADERS['Access-Control-Allow-Headers']}, {wanted}"
    if response.status_code >= 400 and response.mimetype == "application/json":
        # The app's handlers answer with the envelope; NMOS wants {code, error, debug}.
        try:
            body = json.loads(await response.get_data())
        except ValueError:
            return response
        if isinstance(body, dict) and body.get("success") is False:
            nmos = error_response(response.status_code, str(body.get("error", "")))
            for name, value in response.headers.items():
                if name.lower() not in ("content-length", "content-type"):
                    nmos.headers[name] = value
            return nmos
    return response


# --------------------------------------------------------------------------- routes


def _get(rule: str, *, method: str = "GET") -> Callable[[_View], _View]:
    """Register ``rule`` (ending in ``/``) and its form without the slash: both answer, no
    redirect (werkzeug matches a bare form against a slashed rule for its methods, but then
    answers 404 instead of 405 to another method and an empty ``Allow`` to OPTIONS)."""

    def register(view: _View) -> _View:
        bp.add_url_rule(rule, view_func=view, methods=[method])
        bp.add_url_rule(rule.rstrip("/"), endpoint=f"{view.__name__}_bare", view_func=view, methods=[method])
        return view

    return register


@_get("/x-nmos/")
async def nmos_root() -> Response:
    return _json(["node/", "connection/"])


@_get("/x-nmos/node/")
async def node_versions() -> Response:
    return _json(["v1.3/"])


@_get("/x-nmos/node/v1.3/")
async def node_root() -> Response:
    return _json(["self/", "sources/", "flows/", "devices/", "senders/", "receivers/"])


@_get("/x-nmos/node/v1.3/self/")
async def node_self() -> Response:
    return _json(nmos_resources().node)


@_get("/x-nmos/node/v1.3/<any(sources, flows, devices, senders, receivers):kind>/")
async def collection(kind: str) -> Response:
    return _json(list(nmos_resources().by_kind[kind].values()))


@_get("/x-nmos/node/v1.3/<any(sources, flows, devices, senders, receivers):kind>/<resource_id>/")
async def resource(kind: str, resource_id: str) -> Response:
    body = nmos_resources().by_kind[kind].get(resource_id.lower())
    if body is None:
        return error_response(404, f"no {kind[:-1]} {resource_id}")
    return _json(body)


@_get("/x-nmos/node/v1.3/receivers/<resource_id>/target/", method="PUT")
async def receiver_target(resource_id: str) -> Response:
    """Deprecated in IS-04 v1.3 (IS-05 replaces it): the RAML's 501, after the 404 check."""
    if resource_id.lower() not in nmos_resources().by_kind["receivers"]:
        return error_response(404, f"no receiver {resource_id}")
    return error_response(501, "receiver target is deprecated in IS-04 v1.3: use the IS-05 Connection API")
