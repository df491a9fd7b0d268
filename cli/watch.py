"""`mp stats --watch`: follow the edge's WebSocket stats stream (edge interface 4, ws/stats).

The edge pushes a JSON array of flow statistics about once a second. On a
terminal (table format) rich Live redraws in place the `mp stats` table fitted to
the terminal's width (one row per flow, coloured by health), or with FLOW its
detail view (cli/commands/stats.py). Otherwise each update is printed as one
JSON object per line (the flow's object with FLOW, else `{"flows": [...]}`) and
flushed, so `mp stats --watch | jq` works. When the stream breaks after it has
worked once (the edge restarted), it reconnects with backoff; a first connection
that fails is an error, so a script learns at once that the edge is down.

trio, trio-websocket and rich.live are imported here only, never at start-up.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

from cli.errors import AuthNeeded, MpError, ServiceUnreachable
from cli.render import dump_json, dump_yaml, message

if TYPE_CHECKING:
    from cli.client import EdgeClient

RECONNECT_MAX_S = 5.0
STALL_S = 10.0
"""No frame for this long (or 5 intervals) means the link is dead: reconnect."""


def ws_url(base: str) -> str:
    scheme, rest = base.split("://", 1)
    return ("wss" if scheme == "https" else "ws") + "://" + rest.rstrip("/") + "/api/v1/ws/stats"


def frame_flows(text: str | bytes) -> list[dict[str, Any]]:
    """The flow statistics of one stream message (an array; `{flows: [...]}` is accepted too)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    if isinstance(data, dict):
        data = data.get("flows", data.get("data", []))
    return [f for f in data if isinstance(f, dict)] if isinstance(data, list) else []


class LineSink:
    """One JSON object (or YAML document, or plain table) per update, flushed."""

    def __init__(self, fmt: str, flow_id: str | None) -> None:
        self.fmt = fmt
        self.flow_id = flow_id

    def __enter__(self) -> LineSink:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def status(self, text: str | None) -> None:
        if text:
            message(f"mp: {text}", "yellow")

    def show(self, flows: list[dict[str, Any]]) -> None:
        payload: Any = (flows[0] if flows else None) if self.flow_id else {"flows": flows}
        if payload is None:
            return
        if self.fmt == "yaml":
            out = "---\n" + dump_yaml(payload)
        elif self.fmt == "table":
            from cli.commands.stats import stats_table

            out = stats_table({"flows": flows}, False) + "\n\n"
        else:
            out = dump_json(payload, compact=True) + "\n"
        sys.stdout.write(out)
        sys.stdout.flush()


class LiveSink:
    """The stats table (or one flow's detail view), fitted to the terminal, redrawn in place (rich Live)."""

    def __init__(self, url: str, flow_id: str | None) -> None:
        from rich.console import Console
        from rich.live import Live

        from cli.commands.stats import AlarmClock

        self.url = url
        self.flow_id = flow_id
        self.console = Console()
        self._status: str | None = "connecting…"
        self._flows: list[dict[str, Any]] = []
        self._updated: str = "-"
        self._widths: dict[str, int] = {}  # column widths only grow, so a redraw does not move columns
        self._clock = AlarmClock()  # when each TR 101 290 count last went up, while watching
        self.live = Live(self._render(), console=self.console, auto_refresh=False, redirect_stdout=False)

    def __enter__(self) -> LiveSink:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def _render(self) -> Any:
        from cli.commands.stats import watch_view

        caption = f"{self.url}  updated {self._updated}  Ctrl-C to quit"
        return watch_view(
            self._flows, self.console.width, self._widths, caption, self.flow_id, self._clock, self._status
        )

    def status(self, text: str | None) -> None:
        self._status = text
        self.live.update(self._render(), refresh=True)

    def show(self, flows: list[dict[str, Any]]) -> None:
        self._flows = flows
        self._clock.update(flows)
        self._updated = time.strftime("%H:%M:%S")
        self._status = None
        self.live.update(self._render(), refresh=True)


def watch_stats(client: EdgeClient, *, flow_id: str | None, fmt: str, interval_s: float, count: int | None) -> None:
    """Follow the stream until `count` updates were shown (exit 0) or Ctrl-C (exit 130)."""
    import trio

    if flow_id:  # a clear 404 (exit 3) before any stream is opened
        from cli.client import quote

        client.get(f"/api/v1/stats/{quote(flow_id)}", not_found_hint="try: mp flow list")
    live = fmt == "table" and sys.stdout.isatty()
    sink: LiveSink | LineSink = LiveSink(client.settings.url, flow_id) if live else LineSink(fmt, flow_id)
    try:
        with sink:
            trio.run(_follow, client, sink, flow_id, interval_s, count)
    except BaseExceptionGroup as group:  # trio wraps errors from nurseries; surface the one that matters
        first = _first(group)
        if not isinstance(first, BrokenPipeError):
            raise first from None
        _quiet_stdout()
    except BrokenPipeError:  # `| head -1` closed the pipe: a normal end, not an error
        _quiet_stdout()


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if isinstance(exc, KeyboardInterrupt | MpError | BrokenPipeError):
            return exc
    return group.exceptions[0]


async def _follow(
    client: EdgeClient, sink: LiveSink | LineSink, flow_id: str | None, interval_s: float, count: int | None
) -> None:
    import trio
    from trio_websocket import ConnectionClosed, ConnectionRejected, HandshakeError, open_websocket_url

    from cli.client import error_for_status

    url = ws_url(client.settings.url)
    shown = 0
    connected_once = False
    refreshed = False
    backoff = 0.5
    last_shown = float("-inf")
    stall_s = max(STALL_S, 5 * interval_s)
    while True:
        token = client.token
        headers = [(b"Authorization", f"Bearer {token}".encode())] if token else None
        try:
            async with open_websocket_url(
                url, extra_headers=headers, connect_timeout=client.settings.timeout_s, disconnect_timeout=1.0
            ) as ws:
                if connected_once:
                    sink.status(None)
                connected_once, backoff, refreshed = True, 0.5, False
                while True:
                    with trio.fail_after(stall_s):
                        text = await ws.get_message()
                    flows = frame_flows(text)
                    if flow_id:
                        flows = [f for f in flows if f.get("flow_id") == flow_id]
                    now = trio.current_time()
                    if shown and now - last_shown < interval_s * 0.9:
                        continue  # --interval: skip the updates in between
                    sink.show(flows)
                    shown, last_shown = shown + 1, now
                    if count is not None and shown >= count:
                        return
        except BrokenPipeError:
            raise  # our stdout was closed (`| head`): that ends the watch, it is no stream trouble
        except ConnectionRejected as exc:
            if exc.status_code == 401 and connected_once and not refreshed:
                refreshed = True  # the edge restarted with a new signing key: get a new token once
                if client.refresh_token():
                    continue
            text = _rejection_text(exc)
            if exc.status_code in (401, 403) and client.auth_problem is not None:
                raise client.auth_problem from None
            raise error_for_status(exc.status_code, text) from None
        except (ConnectionClosed, HandshakeError, OSError, trio.TooSlowError) as exc:
            if not connected_once:
                raise ServiceUnreachable(
                    f"cannot open the stats stream at {url}: {_why(exc)}",
                    hint="is mp-edge running? try: mp health",
                ) from None
            sink.status(f"stream lost ({_why(exc)}); reconnecting…")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)


def _why(exc: BaseException) -> str:
    if _caused_by(exc, ConnectionRefusedError):
        return "connection refused"
    name = type(exc).__name__
    return {
        "ConnectionClosed": "closed by the edge",
        "TooSlowError": "no update",
        "ConnectionTimeout": "timed out",
    }.get(name, name)


def _caused_by(exc: BaseException | None, kind: type[BaseException], depth: int = 0) -> bool:
    """True if `kind` is anywhere in the cause chain or the exception groups of `exc`."""
    if exc is None or depth > 8:
        return False
    if isinstance(exc, kind):
        return True
    if isinstance(exc, BaseExceptionGroup) and any(_caused_by(e, kind, depth + 1) for e in exc.exceptions):
        return True
    return _caused_by(exc.__cause__ or exc.__context__, kind, depth + 1)


def _rejection_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get("error"), str):
                return str(data["error"])
        except ValueError:
            pass
    return f"the stats stream was refused (HTTP {exc.status_code})"


__all__ = ["AuthNeeded", "frame_flows", "watch_stats", "ws_url"]
