"""`mp stats [FLOW] [--watch]`: live statistics, once or as a redrawn table."""

from typing import Annotated, Any, Optional

import typer

from cli.context import FormatOption, JsonOption, state
from cli.render import HEALTH_STYLE, emit, rate, resolve_format

STATS_HEADERS = ("FLOW", "STATE", "HEALTH", "INPUT", "BITRATE", "PACKETS", "LOST", "FEC", "P1", "P2", "OUTPUTS")


def _tr_flag(tr: Any, key: str) -> str:
    if not isinstance(tr, dict):
        return "-"
    return "ok" if tr.get(key) else "ERR"


def stats_row(flow: dict[str, Any]) -> list[str]:
    """One table row of a flow statistics object (edge interface section 2)."""
    inp = flow.get("input") or {}
    outs = flow.get("outputs") or []
    out_text = ", ".join(
        f"{o.get('output_id')} {rate(o.get('bitrate_bps'))}"
        + (f" drop {o.get('packets_dropped')}" if o.get("packets_dropped") else "")
        for o in outs
    )
    tr = flow.get("tr101290")
    return [
        str(flow.get("flow_id", "?")),
        str(flow.get("state", "?")),
        str(flow.get("health", "?")),
        str(inp.get("input_type", "-")),
        rate(inp.get("bitrate_bps")),
        str(inp.get("packets_received", 0)),
        str(inp.get("packets_lost", 0)),
        str(inp.get("packets_recovered_fec", 0)),
        _tr_flag(tr, "priority1_ok"),
        _tr_flag(tr, "priority2_ok"),
        out_text or "-",
    ]


def _flows_of(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, dict) and "flows" in data:
        return [f for f in data.get("flows") or [] if isinstance(f, dict)]
    if isinstance(data, dict):
        return [data]
    if isinstance(data, list):
        return [f for f in data if isinstance(f, dict)]
    return []


def stats_table(data: Any, colour: bool) -> str:
    from cli.render import columns

    flows = _flows_of(data)
    return columns(
        STATS_HEADERS,
        [stats_row(f) for f in flows],
        colour,
        row_styles=[HEALTH_STYLE.get(str(f.get("health"))) for f in flows],
        empty="no flows",
    )


def stats(
    ctx: typer.Context,
    flow_id: Annotated[Optional[str], typer.Argument(help="Only this flow.", metavar="FLOW")] = None,  # noqa: UP045
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Keep updating from the live stream.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", help="With --watch: at most one update per SECONDS.", metavar="SECONDS")
    ] = 1.0,
    count: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--count", "-c", help="With --watch: stop after N updates (exit 0).", metavar="N"),
    ] = None,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
) -> None:
    """Flow statistics: state, health, input bitrate, loss, FEC, TR-101290 P1/P2, output rates.

    \b
    Once:     mp stats             mp stats cam1 -o json
    Live:     mp stats --watch     (a table redrawn in place; Ctrl-C to quit)
    Scripts:  mp stats cam1 --watch --count 5 | jq .input.bitrate_bps

    When piped (or with -o json), --watch prints one JSON object per update:
    the flow's statistics object with FLOW, else {"flows": [...]}. It follows the
    edge's WebSocket stream and reconnects when the edge restarts.
    """
    from cli.client import quote
    from cli.errors import UsageError

    st = state(ctx)
    chosen = resolve_format(fmt, as_json)
    if count is not None and count < 1:
        raise UsageError("--count must be 1 or more")
    if interval <= 0:
        raise UsageError("--interval must be more than 0 seconds")
    if not watch:
        if count is not None:
            raise UsageError("--count needs --watch")
        path = f"/api/v1/stats/{quote(flow_id)}" if flow_id else "/api/v1/stats"
        data = st.client().get(path, not_found_hint="try: mp flow list")
        emit(data, chosen, stats_table)
        return
    from cli.watch import watch_stats

    watch_stats(st.client(), flow_id=flow_id, fmt=chosen, interval_s=interval, count=count)
