"""Shell completion of flow and output ids, asked of the edge.

`mp flow show <Tab>` offers the edge's flow ids, `mp output remove cam1 <Tab>`
the outputs of cam1. `cli.main.main()` calls `attach()` only when a shell asks
for completions (`_MP_COMPLETE` set), so a normal run pays nothing for it.

Which parameters complete is read off the Click tree, not listed here: an
argument or option shown as `FLOW` completes flow ids (except in `create`,
where FLOW is the new id), one shown as `OUTPUT` completes the output ids of the
FLOW typed before it. So `mp flow show|start|stop|restart|delete|update`,
`mp stats`, `mp events --flow` and `mp output list|add|remove` all complete. One shown as
`TUNNEL` completes tunnel ids (`mp tunnel show|delete`).

The edge is asked with the same settings a command would use (--url, --token,
client credentials, profile, environment), but each request waits at most
`TIMEOUT_S`. Anything that goes wrong (edge down, refused credentials, a bad
--url) gives no candidates and prints nothing: a shell's Tab must never show a
traceback or hang.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Final

TIMEOUT_S: Final = 0.8
"""The longest one completion request may wait (connect, then each read)."""

FLOW_METAVAR: Final = "FLOW"
OUTPUT_METAVAR: Final = "OUTPUT"
TUNNEL_METAVAR: Final = "TUNNEL"


def attach(command: Any) -> None:
    """Give every FLOW and OUTPUT parameter under `command` (a Click command or group) its completer."""
    for param in getattr(command, "params", []):
        if param.metavar == FLOW_METAVAR and command.name != "create":
            param._custom_shell_complete = complete_flow_ids
        elif param.metavar == OUTPUT_METAVAR:
            param._custom_shell_complete = complete_output_ids
        elif param.metavar == TUNNEL_METAVAR:
            param._custom_shell_complete = complete_tunnel_ids
    for sub in getattr(command, "commands", {}).values():
        attach(sub)


def complete_flow_ids(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    """The flow ids that start with `incomplete`, with the flow's name as help."""
    data = _get(ctx, "/api/v1/flows")
    flows = data.get("flows") if isinstance(data, dict) else None
    return _items(
        ((f.get("id"), f.get("name")) for f in flows or [] if isinstance(f, dict)),
        incomplete,
    )


def complete_output_ids(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    """The output ids of the FLOW given earlier on the line that start with `incomplete`."""
    flow_id = next((ctx.params.get(p.name) for p in ctx.command.params if p.metavar == FLOW_METAVAR and p.name), None)
    if not isinstance(flow_id, str) or not flow_id:
        return []
    from cli.client import quote

    data = _get(ctx, f"/api/v1/flows/{quote(flow_id)}")
    outputs = data.get("outputs") if isinstance(data, dict) else None
    return _items(
        ((o.get("id"), o.get("name")) for o in outputs or [] if isinstance(o, dict)),
        incomplete,
    )


def complete_tunnel_ids(ctx: Any, param: Any, incomplete: str) -> list[Any]:
    """The tunnel ids that start with `incomplete`, with the tunnel's name as help."""
    data = _get(ctx, "/api/v1/tunnels")  # a bare body: {tunnels: [...]}
    tunnels = data.get("tunnels") if isinstance(data, dict) else None
    return _items(
        ((t.get("id"), t.get("name")) for t in tunnels or [] if isinstance(t, dict)),
        incomplete,
    )


def _items(pairs: Any, incomplete: str) -> list[Any]:
    from typer._click.shell_completion import CompletionItem

    found = []
    for value, name in pairs:
        if isinstance(value, str) and value.startswith(incomplete):
            help_text = name if isinstance(name, str) and name and name != value else None
            found.append(CompletionItem(value, help=help_text))
    return found


def _get(ctx: Any, path: str) -> Any:
    """GET `path` from the edge the command line names; None on any failure, silently."""
    try:
        from cli.client import EdgeClient
        from cli.settings import Flags, resolve

        params = ctx.find_root().params
        flags = Flags(
            url=params.get("url"),
            token=params.get("token"),
            client_id=params.get("client_id"),
            client_secret=params.get("client_secret"),
            profile=params.get("profile"),
            timeout_s=params.get("timeout"),
        )
        settings = resolve(flags, os.environ)
        settings = dataclasses.replace(settings, timeout_s=min(settings.timeout_s, TIMEOUT_S))
        return EdgeClient(settings).get(path)
    except Exception:  # a completion never fails loudly: no candidates instead
        return None
