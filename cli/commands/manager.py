"""`mp manager status`: the edge's link to its manager (`GET /api/v1/manager`, beyond the interface).

The answer is parsed with `appliance.models.manager_link.ManagerLinkStatus` (imported in the
command: pydantic is too slow an import for every start of `mp`), so a table is only ever
printed from a well-formed status; `-o json` prints the route's `data` object as it came.
"""

from typing import Any, Final

import typer

from cli.context import FormatOption, JsonOption, state
from cli.render import resolve_format

app = typer.Typer(help="The edge's link to its manager.", no_args_is_help=True, rich_markup_mode=None)

MANAGER_PATH: Final = "/api/v1/manager"
STATE_STYLE: Final = {"connected": "green", "waiting": "yellow", "disabled": "dim"}
STATE_NOTE: Final = {
    "disabled": "the link is off: manager.enabled is false or there is no URL",
    "connecting": "opening TCP, TLS and the WebSocket",
    "registering": "sent the registration token, waiting for register_ack",
    "authenticating": "sent the node id and secret, waiting for auth_ok",
    "waiting": "the last attempt failed; retrying with backoff",
}


def _stamp(when: Any) -> tuple[str, str]:
    """`("2026-11-27 09:12:03Z", "5m12s")`: an aware datetime in UTC, and how long ago it was."""
    from datetime import UTC, datetime

    from cli.render import duration

    utc = when.astimezone(UTC)
    ago = max(0.0, (datetime.now(UTC) - utc).total_seconds())
    return utc.strftime("%Y-%m-%d %H:%M:%SZ"), duration(ago)


def link_table(link: Any, colour: bool) -> str:
    """The status as `key: value` lines (`link` is a ManagerLinkStatus)."""
    from cli.render import paint

    name = str(link.state)
    note = STATE_NOTE.get(name)
    shown = paint(name, STATE_STYLE.get(name), colour) + (f"  ({note})" if note else "")
    if link.registered:
        registered = "yes"
    elif link.has_registration_token:
        registered = "no (will register with its registration token)"
    else:
        registered = "no (no registration token: run the setup wizard or set manager.registration_token)"
    lines = [
        f"state:         {shown}",
        f"manager URL:   {link.manager_url or '-'}",
        f"node id:       {link.node_id or '-'}",
        f"registered:    {registered}",
    ]
    if link.connected_since is not None:
        since, held = _stamp(link.connected_since)
        lines.append(f"connected:     since {since} (for {held})")
    if link.next_attempt_in_secs is not None:
        lines.append(f"next attempt:  in {link.next_attempt_in_secs:.1f} s")
    if link.last_error is not None:
        when = ""
        if link.last_error_at is not None:
            at, ago = _stamp(link.last_error_at)
            when = f"  ({at}, {ago} ago)"
        lines.append(f"last error:    {paint(link.last_error, 'red', colour)}{when}")
    else:
        lines.append("last error:    -")
    dropped = paint(f"{link.events_dropped} dropped", "yellow" if link.events_dropped else None, colour)
    lines.append(f"events:        {link.events_queued} queued for the manager, {dropped}")
    return "\n".join(lines)


def _parse(data: Any) -> Any:
    from pydantic import ValidationError

    from appliance.models.manager_link import ManagerLinkStatus
    from cli.errors import Failure

    try:
        return ManagerLinkStatus.model_validate(data)
    except ValidationError:
        raise Failure(f"the edge's answer to GET {MANAGER_PATH} is not a manager link status") from None


@app.command("status")
def status(ctx: typer.Context, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """The manager link: state, manager URL, node id, since when connected, last error, queued events.

    \b
    Once:     mp manager status
    Scripts:  mp manager status -o json | jq -r .state

    States: disabled, connecting, registering, authenticating, connected, waiting
    (the next attempt is due in a few seconds: backoff 1 to 60 s). Any role may
    read it. Exit 0 whenever the edge answers, whatever the state.
    """
    from cli.render import emit

    chosen = resolve_format(fmt, as_json)
    data = state(ctx).client().get(MANAGER_PATH, not_found_hint="this mp-edge has no manager link: update it")
    link = _parse(data)
    emit(data, chosen, lambda _data, colour: link_table(link, colour))
