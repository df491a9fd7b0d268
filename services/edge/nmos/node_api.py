"""IS-04 v1.3 Node API (``/x-nmos/node/v1.3/``, interop.md 5). Being built (issue 17)."""

from __future__ import annotations

from quart import Blueprint

__all__ = ["bp"]

bp = Blueprint("nmos_node", __name__)
