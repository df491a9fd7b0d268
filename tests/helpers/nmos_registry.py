"""A small IS-04 v1.3 Registration API for tests, written from the AMWA RAML and schemas.

Every POST body is validated against ``registrationapi-resource-post-request.json`` (through
the vendored schemas) and refused with 400 when it does not validate; referential integrity is
enforced (a resource whose parent is not registered is 400); heartbeats answer 200 with the
health time, or 404 for an unknown node. Tests can make it fail (``fail_with = 500``) or forget
everything (``forget()``, as garbage collection would).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from appliance.http.app import serve
from services.edge.nmos import schemas

BASE = "/x-nmos/registration/v1.3"
PARENT = {
    "device": "node_id",
    "source": "device_id",
    "flow": "source_id",
    "sender": "device_id",
    "receiver": "device_id",
}
PARENT_TYPE = {"device": "node", "source": "device", "flow": "source", "sender": "device", "receiver": "device"}


@dataclass
class NmosRegistry:
    """The registry's state, for tests to read (``log`` is every request, in order)."""

    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    log: list[tuple[str, str, int]] = field(default_factory=list)
    rejected: list[list[str]] = field(default_factory=list)
    fail_with: int | None = None
    heartbeats: int = 0
    url: str = ""
    changed: trio.Event = field(default_factory=trio.Event)

    def forget(self) -> None:
        self.resources.clear()

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {rid: body for (t, rid), body in self.resources.items() if t == kind}

    def _note(self, method: str, path: str, status: int) -> None:
        self.log.append((method, path, status))
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, predicate: Any, timeout: float = 15.0) -> None:
        with trio.fail_after(timeout):
            while not predicate():
                await self.changed.wait()


def _error(code: int, text: str) -> Response:
    return Response(
        json.dumps({"code": code, "error": text, "debug": None}), status=code, content_type="application/json"
    )


def build_registry_app(state: NmosRegistry) -> QuartTrio:
    app = QuartTrio("test-registry")

    @app.post(f"{BASE}/resource")
    async def post_resource() -> Response:
        if state.fail_with is not None:
            state._note("POST", "resource", state.fail_with)
            return _error(state.fail_with, "failing on purpose")
        body = json.loads(await request.get_data())
        problems = schemas.problems(schemas.IS04, "registrationapi-resource-post-request.json", body)
        kind, data = body.get("type"), body.get("data") or {}
        if not problems and kind in PARENT:
            parent_id = data.get(PARENT[kind])
            if (PARENT_TYPE[kind], parent_id) not in state.resources:
                problems = [f"{PARENT[kind]}: parent not registered"]
        if problems:
            state.rejected.append(problems)
            state._note("POST", f"resource {kind}", 400)
            return _error(400, "; ".join(problems))
        key = (str(kind), str(data["id"]))
        status = 200 if key in state.resources else 201
        state.resources[key] = data
        state._note("POST", f"resource {kind}", status)
        return Response(json.dumps(data), status=status, content_type="application/json")

    @app.delete(f"{BASE}/resource/<kind>/<resource_id>")
    async def delete_resource(kind: str, resource_id: str) -> Response:
        singular = kind.rstrip("s")
        if (singular, resource_id) not in state.resources:
            state._note("DELETE", f"{singular}", 404)
            return _error(404, "not registered")
        del state.resources[(singular, resource_id)]
        if singular == "node":  # children go with their parent (IS-04 "Referential Integrity")
            for key in [k for k in state.resources if k[0] != "node"]:
                del state.resources[key]
        state._note("DELETE", singular, 204)
        return Response("", status=204)

    @app.post(f"{BASE}/health/nodes/<node_id>")
    async def heartbeat(node_id: str) -> Response:
        if state.fail_with is not None:
            state._note("POST", "health", state.fail_with)
            return _error(state.fail_with, "failing on purpose")
        if ("node", node_id) not in state.resources:
            state._note("POST", "health", 404)
            return _error(404, "node not registered")
        state.heartbeats += 1
        state._note("POST", "health", 200)
        return Response(json.dumps({"health": str(int(trio.current_time()))}), content_type="application/json")

    return app


async def run_registry(
    state: NmosRegistry,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[NmosRegistry] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``state``'s registry on ``host`` (``port`` 0: a free one); reports it started."""

    async def started(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(build_registry_app(state), host, port, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(started)
        state.url = str(binds[0]).replace("0.0.0.0", "127.0.0.1")
        task_status.started(state)
