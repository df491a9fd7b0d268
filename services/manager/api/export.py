"""``GET /api/v1/export`` and ``POST /api/v1/import`` (interop.md 7.5): admin and above.

The export is ``{version: 1, exported_at, users, nodes, settings}``: the user records of
``/api/v1/users``, the node fields of interop.md 7.2, and every setting with defaults filled
in. It carries no password hash, node secret, registration token or digest, AI key or
session: those records are built field by field from the public fields only.
``mp-manager export --output FILE`` writes the same JSON (:func:`build_export`).

Import answers 501 ``{error: "import not implemented"}`` once the caller is authorised.
"""

from __future__ import annotations

import datetime as dt
from typing import Final, Literal

from pydantic import BaseModel
from quart import Blueprint, Response

from appliance.http.envelope import bare_fail, json_response
from services.manager.api.auth_routes import require, service
from services.manager.api.nodes import NodeOut
from services.manager.service import RuntimeSettings, Timestamp, UserOut
from services.manager.store import Role, Store

__all__ = ["EXPORT_VERSION", "Export", "bp", "build_export"]

bp = Blueprint("manager_export", __name__)

EXPORT_VERSION: Final = 1


class Export(BaseModel):
    """The export document."""

    version: Literal[1] = EXPORT_VERSION
    exported_at: Timestamp
    users: list[UserOut]
    nodes: list[NodeOut]  # the same records GET /api/v1/nodes answers
    settings: RuntimeSettings


async def build_export(store: Store, now: dt.datetime) -> Export:
    """The export of everything in ``store``, stamped ``now``."""
    users = [UserOut.from_record(user) for user in await store.list_users()]
    nodes = [NodeOut.from_record(node) for node in await store.list_nodes()]
    settings = RuntimeSettings.from_stored(await store.get_settings())
    return Export(exported_at=now, users=users, nodes=nodes, settings=settings)


def export_json(export: Export) -> bytes:
    """The document as the route and the CLI write it: UTF-8 JSON, indented, newline-terminated."""
    return (export.model_dump_json(indent=2) + "\n").encode("utf-8")


@bp.get("/api/v1/export")
@require(Role.ADMIN)
async def export_all() -> Response:
    """The export document; a browser saves it as a file."""
    document = await build_export(service().store, dt.datetime.now(dt.UTC))
    stamp = document.exported_at.strftime("%Y%m%dT%H%M%SZ")
    headers = {
        "Content-Disposition": f'attachment; filename="mediaplane-manager-export-{stamp}.json"',
        "Cache-Control": "no-store",
    }
    return json_response(document, headers=headers)


@bp.post("/api/v1/import")
@require(Role.ADMIN)
async def import_all() -> Response:
    """Not built: 501."""
    return bare_fail("import not implemented", 501)
