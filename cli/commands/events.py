"""`mp events [--since N] [--flow FLOW] [--follow]`: the edge's recent events, once or as they happen.

The edge keeps its last 1,000 events, numbered from 1 (`GET /api/v1/events`, an
extension of the interface). `--follow` polls that route every second with
`since=<last id seen>`; it needs neither trio nor a WebSocket, so it starts as
quickly as `mp flow list`.
"""

import sys
import time
from typing import Annotated, Any, Final, Optional

import typer

from cli.context import FormatOption, JsonOption, state
from cli.render import resolve_format

EVENTS_HEADERS: Final = ("ID", "TIME", "SEVERITY", "CATEGORY", "FLOW", "MESSAGE")
SEVERITY_STYLE: Final = {"info": None, "warning": "yellow", "critical": "bold red"}
POLL_S: Final = 1.0
RETRY_MAX_S: Final = 5.0
# Fixed widths of the --follow table (rows arrive one by one, so they cannot be measured first).
_FOLLOW_WIDTHS: Final = (6, 13, 8, 10, 16)


def _events_path(since: int) -> str:
    return f"/api/v1/events?since={since}"


def _one_line(text: Any) -> str:
    return str(text).replace("\r", "\\r").replace("\n", "\\n")


def event_row(event: dict[str, Any]) -> list[str]:
    """One table row of an event object: ID, TIME (UTC, from the timestamp), SEVERITY, CATEGORY, FLOW, MESSAGE."""
    stamp = str(event.get("timestamp") or "")
    return [
        str(event.get("id", "?")),
        stamp[11:] if len(stamp) > 11 else (stamp or "-"),  # 2026-11-27T09:12:03.412Z -> 09:12:03.412Z
        str(event.get("severity", "?")),
        str(event.get("category", "?")),
        str(event.get("flow_id") or "-"),
        _one_line(event.get("message", "")),
    ]


def events_table(events: Any, colour: bool) -> str:
    from cli.render import columns

    rows = [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
    return columns(
        EVENTS_HEADERS,
        [event_row(e) for e in rows],
        colour,
        row_styles=[SEVERITY_STYLE.get(str(e.get("severity"))) for e in rows],
        empty="no events",
    )


def _follow_line(cells: list[str] | tuple[str, ...], style: str | None, colour: bool) -> str:
    from cli.render import paint

    fixed = "  ".join(c.ljust(w) for c, w in zip(cells, _FOLLOW_WIDTHS, strict=False))
    return paint(f"{fixed}  {cells[-1]}".rstrip(), style, colour)


class _Printer:
    """Writes followed events as they come: JSON Lines, YAML documents, or table rows."""

    def __init__(self, fmt: str) -> None:
        from cli.render import colour_enabled

        self.fmt = fmt
        self.colour = colour_enabled(sys.stdout)
        self._header_done = False

    def show(self, events: list[dict[str, Any]]) -> None:
        from cli.render import dump_json, dump_yaml

        parts: list[str] = []
        if self.fmt == "table" and not self._header_done:
            parts.append(_follow_line(EVENTS_HEADERS, "bold", self.colour) + "\n")
            self._header_done = True
        for event in events:
            if self.fmt == "json":
                parts.append(dump_json(event, compact=True) + "\n")
            elif self.fmt == "yaml":
                parts.append("---\n" + dump_yaml(event))
            else:
                style = SEVERITY_STYLE.get(str(event.get("severity")))
                parts.append(_follow_line(event_row(event), style, self.colour) + "\n")
        if parts:
            sys.stdout.write("".join(parts))
            sys.stdout.flush()


def _answer(data: Any) -> tuple[list[dict[str, Any]], int]:
    """The events and `last_id` of a `GET /api/v1/events` answer."""
    if not isinstance(data, dict):
        from cli.errors import Failure

        raise Failure("the edge's answer to GET /api/v1/events is not an events object")
    events = [e for e in data.get("events") or [] if isinstance(e, dict)]
    last_id = data.get("last_id")
    return events, last_id if isinstance(last_id, int) else 0


def _follow(client: Any, since: int, flow_id: str | None, fmt: str) -> None:
    """Poll for new events until Ctrl-C (KeyboardInterrupt reaches `main`: exit 130).

    Each poll asks from the last event shown (one event of overlap): if that
    event comes back with another timestamp or message, or the edge's `last_id`
    went below it, the edge restarted and numbers from 1 again, so following
    starts over.
    """
    from cli.errors import ServiceUnreachable
    from cli.render import message

    printer = _Printer(fmt)
    seen = since
    anchor: tuple[Any, Any] | None = None  # (timestamp, message) of event `seen`, once one was shown
    retry_s = POLL_S
    unreachable = False
    first = True
    while True:
        try:
            events, last_id = _answer(client.get(_events_path(seen - 1 if anchor else seen)))
        except ServiceUnreachable as exc:
            if first:
                raise  # the edge is down from the start: say so at once (exit 1)
            if not unreachable:
                message(f"mp: {exc.message}; retrying…", "yellow")
                unreachable = True
            time.sleep(retry_s)
            retry_s = min(retry_s * 2, RETRY_MAX_S)
            continue
        first = False
        if unreachable:
            message("mp: the edge answers again", "yellow")
            unreachable, retry_s = False, POLL_S
        if anchor is not None:
            head = events[0] if events else None
            if last_id < seen or (
                head is not None
                and (
                    head.get("id", 0) < seen
                    or (head["id"] == seen and (head.get("timestamp"), head.get("message")) != anchor)
                )
            ):
                message("mp: the edge restarted; its events are numbered from 1 again", "yellow")
                seen, anchor = 0, None
                continue
            if head is not None and head["id"] == seen:
                events = events[1:]  # the overlap, shown already
            elif head is not None and (missed := int(head["id"]) - seen - 1) > 0:
                message(f"mp: {missed} events left the edge's ring before they could be read", "yellow")
        if events:
            newest = max(events, key=lambda e: int(e.get("id", 0)))
            seen, anchor = int(newest.get("id", 0)), (newest.get("timestamp"), newest.get("message"))
            printer.show([e for e in events if flow_id is None or e.get("flow_id") == flow_id])
        if last_id > seen:
            continue  # more than one page is waiting: fetch it now
        if _reader_gone():
            raise BrokenPipeError  # `| head -1` has exited: end now, not at the next event's write
        time.sleep(POLL_S)


def _reader_gone() -> bool:
    """True when stdout is a pipe whose reading end is closed (Linux reports POLLERR on it)."""
    import os
    import select
    import stat

    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: only POLLERR/POLLHUP, which are always reported
        return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))
    except (OSError, ValueError):
        return False


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def events(
    ctx: typer.Context,
    since: Annotated[
        int, typer.Option("--since", help="Only events with an id above N.", metavar="N", min=0, max=10**18 - 1)
    ] = 0,
    flow_id: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--flow", help="Only this flow's events.", metavar="FLOW"),
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep printing new events until Ctrl-C.")] = False,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
) -> None:
    """The edge's recent events: flow started or failed, SRT peer lost, leg switched...

    \b
    Once:     mp events                  mp events --flow cam1 -o json
    Live:     mp events --follow         (new events as they happen; Ctrl-C to quit)
    Scripts:  mp events --follow -o json | jq -r .message

    The edge keeps its last 1,000 events, numbered from 1 (they start again at 1
    when the edge restarts). --since N shows the events after id N. With -o json,
    one run prints a JSON list of event objects; --follow prints one object per
    line, flushed. --follow asks the edge every second; if the edge stops
    answering once followed, mp says so on stderr and keeps trying (an edge
    that does not answer at all is exit 1 at once).
    """
    from cli.render import emit

    st = state(ctx)
    chosen = resolve_format(fmt, as_json)
    client = st.client()
    if not follow:
        found, _ = _answer(client.get(_events_path(since)))
        emit([e for e in found if flow_id is None or e.get("flow_id") == flow_id], chosen, events_table)
        return
    try:
        _follow(client, since, flow_id, chosen)
    except BrokenPipeError:  # `| head -3` closed the pipe: a normal end, not an error
        _quiet_stdout()
