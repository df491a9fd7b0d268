"""`mp stats [FLOW] [--watch]`: live statistics, once or redrawn in place.

`mp stats` is one row per flow, fitted to the terminal: when it is too narrow the
least useful columns go first (INPUT, FEC, PACKETS, STATE, LOST, BITRATE); FLOW,
HEALTH, P1 and P2 always stay. `mp stats FLOW` on a terminal is the detail view:
input (state and peer, loss, IAT/PDV, SRT legs), every TR 101 290 indicator with
its count and its last alarm, media, outputs. Piped, both print JSON.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Final, Optional

import typer

from cli.context import FormatOption, JsonOption, state
from cli.render import HEALTH_STYLE, bitrate, emit, paint, resolve_format
from cli.render import count as num

STATS_HEADERS: Final = ("FLOW", "STATE", "HEALTH", "INPUT", "BITRATE", "PACKETS", "LOST", "FEC", "P1", "P2", "OUTPUTS")

TR101290_INDICATORS: Final[dict[str, tuple[int, str]]] = {
    # field -> (priority, label): the same as appliance.models.stats.TR101290_INDICATORS
    # (tests/cli/test_stats_view.py checks it), written out so `mp` need not import pydantic.
    "sync_loss_count": (1, "TS sync loss"),
    "sync_byte_errors": (1, "sync byte error"),
    "cc_errors": (1, "continuity count error"),
    "pat_errors": (1, "PAT error"),
    "pmt_errors": (1, "PMT error"),
    "tei_errors": (2, "transport error"),
    "pcr_discontinuity_errors": (2, "PCR discontinuity"),
    "pcr_accuracy_errors": (2, "PCR accuracy error"),
    "pid_errors": (1, "PID error"),
    "crc_errors": (2, "CRC error"),
    "pcr_repetition_errors": (2, "PCR repetition error"),
    "pts_errors": (2, "PTS error"),
    "cat_errors": (2, "CAT error"),
}


def _columns() -> list[Any]:
    from cli.render import Col

    # `drop`: the order in which columns go at narrow widths; `width`: kept even when the cells
    # are shorter, so the columns do not move as numbers grow (OUTPUTS: the room it asks for).
    return [
        Col("FLOW"),
        Col("STATE", drop=4, width=8),
        Col("HEALTH", width=8),
        Col("INPUT", drop=1, width=5),
        Col("BITRATE", right=True, drop=6, width=9),
        Col("PACKETS", right=True, drop=3, width=11),
        Col("LOST", right=True, drop=5, width=7),
        Col("FEC", right=True, drop=2, width=7),
        Col("P1", width=3),
        Col("P2", width=3),
        Col("OUTPUTS", flex=True, width=16),
    ]


def _tr_flag(tr: Any, key: str) -> str:
    if not isinstance(tr, dict):
        return "-"
    return "ok" if tr.get(key) else "ERR"


def _outputs_cell(outs: list[dict[str, Any]]) -> tuple[str, ...]:
    """OUTPUTS, longest first: each output's id and bitrate (or state) and drops; then counts."""
    if not outs:
        return ("-",)
    items = []
    for o in outs:
        active = o.get("state", "active") == "active"
        item = f"{o.get('output_id')} {bitrate(o.get('bitrate_bps')) if active else o.get('state')}"
        if o.get("packets_dropped"):
            item += f" drop {num(o.get('packets_dropped'))}"
        items.append(item)
    up = sum(1 for o in outs if o.get("state", "active") == "active")
    dropped = sum(int(o.get("packets_dropped") or 0) for o in outs)
    drops = f" drop {num(dropped)}" if dropped else ""
    return (", ".join(items), f"{up}/{len(outs)} active{drops}", f"{up}/{len(outs)}{drops}", f"{up}/{len(outs)}")


def stats_row(flow: dict[str, Any]) -> list[Any]:
    """One table row of a flow statistics object (edge interface section 2)."""
    inp = flow.get("input") or {}
    tr = flow.get("tr101290")
    return [
        str(flow.get("flow_id", "?")),
        str(flow.get("state", "?")),
        str(flow.get("health", "?")),
        str(inp.get("input_type", "-")),
        bitrate(inp.get("bitrate_bps")),
        num(inp.get("packets_received", 0)),
        num(inp.get("packets_lost", 0)),
        num(inp.get("packets_recovered_fec", 0)),
        _tr_flag(tr, "priority1_ok"),
        _tr_flag(tr, "priority2_ok"),
        _outputs_cell([o for o in flow.get("outputs") or [] if isinstance(o, dict)]),
    ]


def _flows_of(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, dict) and "flows" in data:
        return [f for f in data.get("flows") or [] if isinstance(f, dict)]
    if isinstance(data, dict):
        return [data]
    if isinstance(data, list):
        return [f for f in data if isinstance(f, dict)]
    return []


def stats_lines(
    flows: list[dict[str, Any]], width: int | None, sticky: dict[str, int] | None = None
) -> list[tuple[str, str | None]]:
    """The table's lines with their style (header bold, rows by health), at most `width` wide."""
    from cli.render import fit_table

    lines = fit_table(_columns(), [stats_row(f) for f in flows], width, sticky)
    styles = ["bold"] + [HEALTH_STYLE.get(str(f.get("health"))) for f in flows]
    return list(zip(lines, styles, strict=True))


def terminal_width() -> int | None:
    """The terminal's width when stdout is one, else None (piped tables keep every column)."""
    import shutil
    import sys

    if not sys.stdout.isatty():
        return None
    return max(20, shutil.get_terminal_size().columns)


def stats_table(data: Any, colour: bool, width: int | None = None) -> str:
    flows = _flows_of(data)
    if not flows:
        return "no flows"
    return "\n".join(paint(line, style, colour) for line, style in stats_lines(flows, width))


# --------------------------------------------------------------------------- the detail view


def _us(value: Any) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value / 1000:.1f} ms" if value >= 1000 else f"{value:.0f} µs"


def _when(stamp: str) -> str:
    """An event's RFC 3339 UTC time as the time of day (`13:01:02Z`), with the date when not today."""
    if len(stamp) < 19:
        return stamp or "-"
    today = time.strftime("%Y-%m-%d", time.gmtime())
    return f"{stamp[11:19]}Z" if stamp[:10] == today else f"{stamp[5:10]} {stamp[11:19]}Z"


def last_alarms(events: Any, flow_id: str) -> dict[str, str]:
    """indicator -> its last alarm, from the edge's alarm events (`13:01:02Z, active`)."""
    seen: dict[str, list[str | None]] = {}
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict) or event.get("flow_id") != flow_id:
            continue
        message = str(event.get("message", ""))
        if message == "flow started":
            seen.clear()  # the counters start again at 0 with each start
            continue
        indicator = (event.get("details") or {}).get("indicator")
        if event.get("category") != "analysis" or not isinstance(indicator, str):
            continue
        stamp = _when(str(event.get("timestamp") or ""))
        if "alarm raised" in message:
            seen[indicator] = [stamp, None]
        elif "alarm cleared" in message and indicator in seen:
            seen[indicator][1] = stamp
    return {k: f"{r}, cleared {c}" if c else f"{r}, active" for k, (r, c) in seen.items()}


class AlarmClock:
    """While watching: when each indicator's count last went up (`seen 13:01:02Z`)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.when: dict[tuple[str, str], str] = {}

    def update(self, flows: list[dict[str, Any]]) -> None:
        now = time.strftime("%H:%M:%SZ", time.gmtime())  # UTC, as the event times beside it
        for flow in flows:
            tr = flow.get("tr101290")
            if not isinstance(tr, dict):
                continue
            fid = str(flow.get("flow_id"))
            for name in TR101290_INDICATORS:
                key, value = (fid, name), tr.get(name)
                if not isinstance(value, int):
                    continue
                before = self.counts.get(key)
                if before is not None and value > before:
                    self.when[key] = f"seen {now}"
                elif before is not None and value < before:
                    self.when.pop(key, None)  # the flow restarted
                self.counts[key] = value

    def of(self, flow_id: str) -> dict[str, str]:
        return {name: text for (fid, name), text in self.when.items() if fid == flow_id}


def _peer(kind: Any, cfg: Any) -> str:
    """Where an input or output meets its peer, from the flow's configuration."""
    if not isinstance(cfg, dict):
        return ""
    mode = cfg.get("mode")
    if mode == "caller" and cfg.get("remote_addr"):
        return f"calling {cfg['remote_addr']}"
    if mode == "rendezvous":
        return f"rendezvous {cfg.get('local_addr')} with {cfg.get('remote_addr')}"
    if mode == "listener" and cfg.get("local_addr"):
        return f"listening on {cfg['local_addr']}"
    if kind == "in":
        for key in ("bind_addr", "listen_addr", "url", "local_addr"):
            if cfg.get(key):
                return f"on {cfg[key]}"
        return ""
    for key in ("dest_addr", "url", "remote_addr"):
        if cfg.get(key):
            return f"to {cfg[key]}"
    return ""


def _wrap(label: str, items: list[str], width: int | None, pad: int = 12) -> list[str]:
    """`label` then the items two spaces apart, continued on indented lines rather than past `width`."""
    items = [i for i in items if i]
    lines: list[str] = []
    current = label.ljust(pad) if items else label
    for item in items:
        fresh = current.strip() == "" or current == label.ljust(pad)
        candidate = current + ("" if fresh else "  ") + item
        if width is not None and len(candidate) > width and not fresh:
            lines.append(current.rstrip())
            current = " " * pad + item
        else:
            current = candidate
    lines.append(current.rstrip())
    return [line if width is None or len(line) <= width else line[: width - 1] + "…" for line in lines]


def _srt(label: str, leg: Any, width: int | None) -> list[str]:
    if not isinstance(leg, dict):
        return []
    items = [
        str(leg.get("state", "?")),
        f"RTT {leg['rtt_ms']:.1f} ms" if isinstance(leg.get("rtt_ms"), int | float) and leg["rtt_ms"] > 0 else "",
        f"loss {num(leg.get('pkt_loss_total', 0))}",
        f"retransmits {num(leg.get('pkt_retransmit_total', 0))}",
    ]
    return _wrap(label, items, width)


def _frame_rate(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return f"{value:.0f} fps" if float(value).is_integer() else f"{value:.2f} fps"


def stats_detail(
    flow: dict[str, Any],
    colour: bool,
    width: int | None = None,
    config: Any = None,
    alarms: dict[str, str] | None = None,
) -> str:
    """The detail view of one flow statistics object (`mp stats FLOW` on a terminal)."""
    return "\n".join(paint(line, style, colour) for line, style in detail_lines(flow, width, config, alarms))


def detail_lines(
    flow: dict[str, Any], width: int | None, config: Any = None, alarms: dict[str, str] | None = None
) -> list[tuple[str, str | None]]:
    from cli.render import Col, fit_table

    out: list[tuple[str, str | None]] = []
    config = config if isinstance(config, dict) else {}
    alarms = alarms or {}
    inner = None if width is None else width - 2

    def add(lines: list[str], style: str | None = None) -> None:
        out.extend((line, style) for line in lines)

    def table(cols: list[Any], rows: list[list[Any]], styles: list[str | None]) -> None:
        lines = fit_table(cols, rows, inner)
        out.append(("  " + lines[0], "bold"))
        out.extend(("  " + line, style) for line, style in zip(lines[1:], styles, strict=True))

    health = str(flow.get("health", "?"))
    uptime = flow.get("uptime_secs")
    from cli.render import duration

    add(_wrap("FLOW", [str(flow.get("flow_id", "?")), str(flow.get("flow_name") or "")], width), "bold")
    add(
        _wrap("STATE", [str(flow.get("state", "?")), health, f"up {duration(uptime)}" if uptime else ""], width),
        HEALTH_STYLE.get(health),
    )

    inp = flow.get("input") or {}
    add(
        _wrap(
            "INPUT",
            [str(inp.get("input_type", "-")), str(inp.get("state", "-")), _peer("in", config.get("input"))],
            width,
        ),
        "bold",
    )
    add(
        _wrap(
            "  rate",
            [
                bitrate(inp.get("bitrate_bps")),
                f"{num(inp.get('packets_received', 0))} packets",
                f"{num(inp.get('bytes_received', 0))} bytes",
            ],
            width,
        )
    )
    lost = inp.get("packets_lost") or 0
    add(
        _wrap(
            "  loss",
            [
                f"{num(lost)} lost",
                f"{num(inp.get('packets_recovered_fec', 0))} recovered by FEC",
                f"{num(inp.get('packets_filtered', 0))} filtered",
                f"{num(inp.get('redundancy_switches', 0))} 2022-7 switches" if inp.get("redundancy_switches") else "",
            ],
            width,
        ),
        "yellow" if lost else None,
    )
    iat = flow.get("iat")
    if isinstance(iat, dict) or flow.get("pdv_jitter_us") is not None:
        iat = iat if isinstance(iat, dict) else {}
        add(
            _wrap(
                "  IAT/PDV",
                [
                    f"IAT min {_us(iat.get('min_us'))}" if iat else "",
                    f"avg {_us(iat.get('avg_us'))}" if iat else "",
                    f"max {_us(iat.get('max_us'))}" if iat else "",
                    f"PDV {_us(flow.get('pdv_jitter_us'))}",
                ],
                width,
            )
        )
    add(_srt("  SRT leg 1" if inp.get("srt_leg2_stats") else "  SRT", inp.get("srt_stats"), width))
    add(_srt("  SRT leg 2", inp.get("srt_leg2_stats"), width))

    tr = flow.get("tr101290")
    if isinstance(tr, dict):
        p1, p2 = _tr_flag(tr, "priority1_ok"), _tr_flag(tr, "priority2_ok")
        add(
            _wrap("TR 101 290", [f"P1 {p1}", f"P2 {p2}", f"{num(tr.get('ts_packets_analyzed', 0))} TS packets"], width),
            "bold red" if "ERR" in (p1, p2) else "bold",
        )
        rows, styles = [], []
        ordered = sorted(TR101290_INDICATORS.items(), key=lambda kv: kv[1][0])  # priority 1 first, stable
        for name, (priority, label) in ordered:
            n = tr.get(name, 0)
            rows.append([str(priority), label, num(n), alarms.get(name) or ("-" if not n else "earlier")])
            styles.append(("red" if priority == 1 else "yellow") if n else None)
        table(
            [
                Col("P"),
                Col("INDICATOR", width=22),
                Col("COUNT", right=True, width=7),
                Col("LAST ALARM (UTC)", flex=True, width=16),
            ],
            rows,
            styles,
        )
    else:
        add(_wrap("TR 101 290", ["- (no analysis: the flow is not running)"], width), "bold")

    media = flow.get("media_analysis")
    if isinstance(media, dict):
        programs = media.get("program_count", 0)
        add(
            _wrap(
                "MEDIA",
                [
                    str(media.get("protocol", "")),
                    str(media.get("payload_format", "")),
                    f"{programs} program{'s' if programs != 1 else ''}",
                    bitrate(media.get("total_bitrate_bps")),
                ],
                width,
            ),
            "bold",
        )
        for v in media.get("video_streams") or []:
            add(
                _wrap(
                    "  video",
                    [
                        f"PID {v.get('pid')}",
                        str(v.get("codec", "?")),
                        str(v.get("resolution") or ""),
                        _frame_rate(v.get("frame_rate")),
                        " ".join(str(v[k]) for k in ("profile", "level") if v.get(k)),
                        bitrate(v["bitrate_bps"]) if v.get("bitrate_bps") else "",
                    ],
                    width,
                )
            )
        for a in media.get("audio_streams") or []:
            rate_hz = a.get("sample_rate_hz")
            add(
                _wrap(
                    "  audio",
                    [
                        f"PID {a.get('pid')}",
                        str(a.get("codec", "?")),
                        f"{rate_hz / 1000:g} kHz" if isinstance(rate_hz, int | float) else "",
                        f"{a['channels']} ch" if a.get("channels") else "",
                        str(a.get("language") or ""),
                        bitrate(a["bitrate_bps"]) if a.get("bitrate_bps") else "",
                    ],
                    width,
                )
            )
        if not media.get("video_streams") and not media.get("audio_streams"):
            add(_wrap("  streams", ["none found yet"], width))
    else:
        add(_wrap("MEDIA", ["-"], width), "bold")

    outs = [o for o in flow.get("outputs") or [] if isinstance(o, dict)]
    cfg_outs = {str(o.get("id")): o for o in config.get("outputs") or [] if isinstance(o, dict)}
    if not outs:
        add(_wrap("OUTPUTS", ["none"], width), "bold")
        return out
    add(["OUTPUTS"], "bold")
    rows, styles = [], []
    for o in outs:
        dropped = o.get("packets_dropped") or 0
        rows.append(
            [
                str(o.get("output_id")),
                str(o.get("output_type", "-")),
                str(o.get("state", "-")),
                bitrate(o.get("bitrate_bps")),
                num(o.get("packets_sent", 0)),
                num(dropped),
                str(o.get("output_name") or ""),
                _peer("out", cfg_outs.get(str(o.get("output_id")))),
            ]
        )
        styles.append("yellow" if dropped or o.get("state") != "active" else None)
    table(
        [
            Col("ID"),
            Col("TYPE", drop=2),
            Col("STATE", width=6),
            Col("BITRATE", right=True, width=9),
            Col("SENT", right=True, drop=3, width=9),
            Col("DROPPED", right=True, width=7),
            Col("NAME", drop=1),
            Col("PEER", flex=True, width=12),
        ],
        rows,
        styles,
    )
    for o in outs:
        two = o.get("srt_leg2_stats")
        add(_srt(f"  {o.get('output_id')} SRT" + (" leg 1" if two else ""), o.get("srt_stats"), width))
        add(_srt(f"  {o.get('output_id')} SRT leg 2", two, width))
    return out


def watch_view(
    flows: list[dict[str, Any]],
    width: int,
    sticky: dict[str, int],
    caption: str,
    flow_id: str | None = None,
    clock: AlarmClock | None = None,
    status: str | None = None,
) -> Any:
    """What `mp stats --watch` redraws: the table (or FLOW's detail view) and a caption, as rich Text."""
    from rich.text import Text

    if flow_id and flows:
        lines = detail_lines(flows[0], width, None, clock.of(flow_id) if clock else None)
    elif flows:
        lines = stats_lines(flows, width, sticky)
    else:
        lines = [("(no flows)", None)]
    text = Text(no_wrap=True, overflow="crop")
    for line, style in lines:
        text.append(line + "\n", style=style or "")
    if status:  # the stream's trouble first, in yellow; then where from and when
        text.append(status[:width] + "\n", style="yellow")
    text.append(caption if len(caption) <= width else caption[: width - 1] + "…", style="dim")
    return text


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
    Detail:   mp stats cam1        (input, TR 101 290 indicators, media, outputs, SRT)
    Live:     mp stats --watch     (redrawn in place; Ctrl-C to quit)
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
        width = terminal_width()
        if flow_id and chosen == "table" and isinstance(data, dict):
            config, alarms = _detail_context(st.client(), flow_id)
            emit(data, chosen, lambda d, colour: stats_detail(d, colour, width, config, alarms))
        else:
            emit(data, chosen, lambda d, colour: stats_table(d, colour, width))
        return
    from cli.watch import watch_stats

    watch_stats(st.client(), flow_id=flow_id, fmt=chosen, interval_s=interval, count=count)


def _detail_context(client: Any, flow_id: str) -> tuple[Any, dict[str, str]]:
    """The flow's configuration (for the peers) and its last alarms (from the event log); best effort."""
    from cli.client import quote
    from cli.errors import MpError

    try:
        config = client.get(f"/api/v1/flows/{quote(flow_id)}")
    except MpError:
        config = None
    try:
        events = client.get("/api/v1/events?limit=1000")
        alarms = last_alarms(events.get("events") if isinstance(events, dict) else None, flow_id)
    except MpError:
        alarms = {}
    return config, alarms
