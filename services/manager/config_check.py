"""Checking an edge config on the manager before it is sent (the dashboard's config editor).

The manager holds the edge's own configuration model (``appliance.models.config``), so it can
say, before anything reaches the node, what the edge would refuse: the same paths and messages
as the edge's 400, never a value (``appliance.http.envelope.validation_problems``). Nothing is
changed or normalised: the check only answers (interop.md 13: configs are relayed verbatim).

The config a browser edits is the one the node reported, with its infrastructure secrets left
out (interop.md 2.7: stripped means omitted); the edge keeps its stored ones when a config
leaves them out. So a complaint that only says such a secret is missing is not one: tunnels are
checked one by one and those complaints dropped.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from appliance.http.envelope import validation_problems
from appliance.models.config import TUNNEL_SECRET_FIELDS, AppConfig, TunnelConfig

__all__ = ["edge_config_problems"]

_APP: Final = TypeAdapter(AppConfig)
_TUNNEL: Final = TypeAdapter(TunnelConfig)


def edge_config_problems(config: dict[str, Any]) -> list[dict[str, str]]:
    """``[{path, message}]``: what the edge would refuse in ``config``; empty when nothing."""
    problems: list[tuple[str, str]] = []
    tunnels = config.get("tunnels")
    rest = {key: value for key, value in config.items() if key != "tunnels"}
    try:
        # JSON mode, as the edge reads the update_config it is sent.
        _APP.validate_json(json.dumps(rest))
    except ValidationError as exc:
        problems += validation_problems(exc)
    if isinstance(tunnels, list):
        seen: set[object] = set()
        for index, tunnel in enumerate(tunnels):
            try:
                _TUNNEL.validate_json(json.dumps(tunnel))
            except ValidationError as exc:
                problems += [
                    (path, message)
                    for path, message in validation_problems(exc, prefix=f"tunnels.{index}")
                    if not any(secret in message or path.endswith(secret) for secret in TUNNEL_SECRET_FIELDS)
                ]
            tunnel_id = tunnel.get("id") if isinstance(tunnel, dict) else None
            if isinstance(tunnel_id, str):
                if tunnel_id in seen:
                    problems.append((f"tunnels.{index}.id", "duplicate tunnel id"))
                seen.add(tunnel_id)
    elif tunnels is not None:
        problems.append(("tunnels", "must be a list"))
    return [{"path": path, "message": message} for path, message in problems]
