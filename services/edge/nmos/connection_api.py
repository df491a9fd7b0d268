"""IS-05 v1.1 Connection API (``/x-nmos/connection/v1.1/``, interop.md 5). Being built (issue 17)."""

from __future__ import annotations

from quart import Blueprint

__all__ = ["bp"]

bp = Blueprint("nmos_connection", __name__)
