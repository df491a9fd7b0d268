"""How `mp` prints: data to stdout as a table, JSON or YAML; messages to stderr.

Tables are plain aligned columns, written here rather than with rich: importing
`rich.console` and `rich.table` costs 60-80 ms, most of the fast-start budget of
`mp flow list`, and plain columns read well over a 9600-baud serial console and
in `grep`. Colour is used only when the stream is a terminal, `NO_COLOR` is
unset and `TERM` is not `dumb`. Rich is kept for `mp stats --watch` (rich Live
redraws `fit_table`'s plain lines in place) and for Typer's `--help`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

FORMATS: Final = ("table", "json", "yaml")

_ANSI: Final = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "cyan": "36",
    "bold red": "1;31",
}
HEALTH_STYLE: Final = {"Healthy": "green", "Warning": "yellow", "Error": "red", "Critical": "bold red"}


def colour_enabled(stream: TextIO) -> bool:
    """True when `stream` is a terminal and neither NO_COLOR nor TERM=dumb says otherwise."""
    if os.environ.get("NO_COLOR", "") != "":
        return False
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def paint(text: str, style: str | None, enabled: bool) -> str:
    if not enabled or not style or style not in _ANSI:
        return text
    return f"\x1b[{_ANSI[style]}m{text}\x1b[0m"


def resolve_format(requested: str | None, json_alias: bool = False) -> str:
    """`-o` if given (or `--json`), else table on a terminal and json when piped."""
    if json_alias:
        return "json"
    if requested:
        return requested
    return "table" if sys.stdout.isatty() else "json"


def message(text: str, style: str | None = None) -> None:
    """A human message on stderr (never on stdout: stdout is for data)."""
    sys.stderr.write(paint(text, style, colour_enabled(sys.stderr)) + "\n")
    sys.stderr.flush()


def dump_json(data: Any, *, compact: bool = False) -> str:
    if compact:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(data, indent=2, ensure_ascii=False)


def dump_yaml(data: Any) -> str:
    import yaml  # type: ignore[import-untyped]  # PyYAML 6.0.3, only for -o yaml

    return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False))


def emit(data: Any, fmt: str, table: Callable[[Any, bool], str] | None = None) -> None:
    """Print `data` (the API's `data` payload) in the chosen format on stdout."""
    if fmt == "json":
        text = dump_json(data)
    elif fmt == "yaml":
        text = dump_yaml(data).rstrip("\n")
    else:
        colour = colour_enabled(sys.stdout)
        text = table(data, colour) if table is not None else tree(data, colour)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def columns(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    colour: bool,
    row_styles: Sequence[str | None] | None = None,
    empty: str = "(none)",
) -> str:
    """Plain aligned columns, two spaces apart, header in bold when colour is on."""
    if not rows:
        return empty
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    out = [paint("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(), "bold", colour)]
    for n, row in enumerate(cells):
        line = "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
        out.append(paint(line, row_styles[n] if row_styles else None, colour))
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def tree(data: Any, colour: bool, indent: int = 0) -> str:
    """A nested object as indented `key: value` lines, for `show`-style commands."""
    lines: list[str] = []
    _tree(data, colour, indent, lines)
    return "\n".join(lines) if lines else "(empty)"


def _tree(data: Any, colour: bool, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(data, dict):
        for key, value in data.items():
            label = paint(f"{key}:", "bold" if indent == 0 else None, colour)
            if isinstance(value, dict) and value:
                lines.append(f"{pad}{label}")
                _tree(value, colour, indent + 2, lines)
            elif isinstance(value, list) and value:
                lines.append(f"{pad}{label}")
                _tree(value, colour, indent + 2, lines)
            else:
                lines.append(f"{pad}{label} {_scalar(value)}")
    elif isinstance(data, list):
        for item in data:
            if isinstance(item, dict) and item:
                sub: list[str] = []
                _tree(item, colour, indent + 2, sub)
                sub[0] = pad + "- " + sub[0][indent + 2 :]
                lines.extend(sub)
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(pad + _scalar(data))


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return str(value)


def rate(bps: Any) -> str:
    """Bits per second in engineer units: 0, 950k, 5.02M, 1.2G."""
    if not isinstance(bps, int | float):
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            value = bps / scale
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return f"{bps:.0f}"


def duration(secs: Any) -> str:
    if not isinstance(secs, int | float):
        return "-"
    secs = int(secs)
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


REDACTED: Final = "**********"
USER_SECRET_KEYS: Final = frozenset(
    {"passphrase", "stream_key", "bearer_token", "auth_token", "password", "client_secret", "token"}
)


def redact(data: Any) -> Any:
    """A copy with flow user secrets (SRT passphrase, stream keys, tokens) masked."""
    if isinstance(data, dict):
        return {
            k: (REDACTED if k in USER_SECRET_KEYS and isinstance(v, str) and v else redact(v)) for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


def holds_redacted(data: Any) -> str | None:
    """The JSON path of the first masked value in `data`, or None."""
    if isinstance(data, dict):
        for k, v in data.items():
            if v == REDACTED and k in USER_SECRET_KEYS:
                return str(k)
            inner = holds_redacted(v)
            if inner:
                return f"{k}.{inner}"
    elif isinstance(data, list):
        for i, v in enumerate(data):
            inner = holds_redacted(v)
            if inner:
                return f"{i}.{inner}"
    return None


# --------------------------------------------------------------------------- `mp stats`: units and fitted tables


def bitrate(bps: Any) -> str:
    """Bits per second with units, one decimal below 100: `3.2 Mb/s`, `950 kb/s`, `0 b/s` (at most 9 wide)."""
    if not isinstance(bps, int | float) or isinstance(bps, bool):
        return "-"
    for unit, scale in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bps >= scale * 0.9995:
            value = bps / scale
            return f"{value:.1f} {unit}" if round(value, 1) < 100 else f"{value:.0f} {unit}"
    return f"{bps:.0f} b/s"


def count(value: Any) -> str:
    """A counter with thousands separators: `1,234,567`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{int(value):,}"


class Col:
    """A column of a fitted table.

    `drop`: the order in which columns go when the table is too wide (1 first; None: never).
    `width`: the width kept even when every cell is shorter, so a redraw does not move columns.
    `flex`: the last column, given what is left; its cells may be a tuple of alternatives,
    longest first, and the longest that fits is shown.
    """

    __slots__ = ("drop", "flex", "header", "right", "width")

    def __init__(
        self, header: str, *, right: bool = False, drop: int | None = None, width: int = 0, flex: bool = False
    ):
        self.header, self.right, self.drop, self.width, self.flex = header, right, drop, width, flex


def _alternatives(cell: Any) -> tuple[str, ...]:
    return tuple(_cell(v) for v in cell) if isinstance(cell, tuple) else (_cell(cell),)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else (text[: width - 1] + "…" if width > 1 else text[:width])


def fit_table(
    cols: Sequence[Col],
    rows: Sequence[Sequence[Any]],
    width: int | None,
    sticky: dict[str, int] | None = None,
) -> list[str]:
    """Aligned columns, two spaces apart, in at most `width` characters (None: no limit).

    Too wide: columns go in their `drop` order, then the flex column shows a shorter
    alternative, then the widest never-dropped left column is cut with `…`. `sticky`
    (header -> width, updated here) keeps widths from shrinking between redraws.
    """
    cells = [[_alternatives(c) for c in row] for row in rows]
    need: dict[int, int] = {}
    for i, col in enumerate(cols):
        longest = [len(r[i][-1 if col.flex else 0]) for r in cells]  # flex: its shortest alternative
        need[i] = max(len(col.header), col.width, *longest)
        if sticky is not None and not col.flex:
            need[i] = max(need[i], sticky.get(col.header, 0))
            sticky[col.header] = need[i]
    shown = list(range(len(cols)))

    def total() -> int:
        return sum(need[i] for i in shown) + 2 * (len(shown) - 1)

    if width is not None:
        for i in sorted((i for i, c in enumerate(cols) if c.drop is not None), key=lambda i: cols[i].drop or 0):
            if total() <= width:
                break
            shown.remove(i)
    widths = dict(need)
    flex = next((i for i in shown if cols[i].flex), None)
    if flex is not None:
        full = max(len(cols[flex].header), *(len(r[flex][0]) for r in cells))
        widths[flex] = full if width is None else max(need[flex], min(full, width - (total() - need[flex])))
    if width is not None:
        over = sum(widths[i] for i in shown) + 2 * (len(shown) - 1) - width
        cuttable = [i for i in shown if not cols[i].right and not cols[i].flex]
        while over > 0 and cuttable:
            i = max(cuttable, key=lambda i: widths[i])
            cut = min(over, widths[i] - 4)
            if cut <= 0:
                break
            widths[i] -= cut
            over -= cut

    def line(values: list[str]) -> str:
        parts = []
        for i, v in zip(shown, values, strict=True):
            w = widths[i]
            parts.append(v.rjust(w) if cols[i].right else v.ljust(w))
        return "  ".join(parts).rstrip()

    out = [line([_clip(cols[i].header, widths[i]) for i in shown])]
    for r in cells:
        values = []
        for i in shown:
            alts = r[i]
            pick = next((a for a in alts if len(a) <= widths[i]), alts[-1])
            values.append(_clip(pick, widths[i]))
        out.append(line(values))
    return out
