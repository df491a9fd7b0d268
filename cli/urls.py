"""Turn `--input` and `--output` URLs into the API's input and output objects.

| URL | object |
|---|---|
| `rtp://0.0.0.0:5000` (input) | `{"type": "rtp", "bind_addr": "0.0.0.0:5000"}` |
| `udp://0.0.0.0:5000` (input) | `{"type": "udp", "bind_addr": ...}`, raw TS without RTP |
| `udp://239.1.1.1:5000` (output) | `{"type": "udp", "id": "out1", "name": "out1", "dest_addr": ...}` |
| `rtp://239.1.1.1:5000` (output) | the same with `"type": "rtp"` |
| `srt://host:port?mode=caller&latency=120` | the SRT field set (interop.md 2.4) |
| `rtmp://0.0.0.0:1935/live/KEY` (input) | `{"type": "rtmp", "listen_addr", "app": "live", "stream_key"}` |
| `rtmps://0.0.0.0:1935/live/KEY` (input) | the same with `"tls": true` (no KEY: any key) |
| `rtmp[s]://host[:port]/app/KEY` (output) | `{"type": "rtmp", "dest_url": "rtmp[s]://host/app", "stream_key"}` |
| `rtsp[s]://user:pass@cam/path?transport=udp` (input) | `{"type": "rtsp", "rtsp_url", "username", ...}` |

SRT mode: `caller` sets `remote_addr` to the URL's address and `local_addr` to
`0.0.0.0:0`; `listener` sets `local_addr`; `rendezvous` sets both (local port =
remote port). Without `mode`, an empty host or `0.0.0.0` means listener and any
other host means caller, as with `srt-live-transmit`. Query keys are the
interop field names, plus the srt-live-transmit spellings `latency`, `pbkeylen`
and `streamid`. An unknown key is a usage error, never silently dropped.

RTMP: the path is `/<app>/<stream key>`, as OBS and ffmpeg write it; the port defaults to
1935 (`rtmp`) or 443 (`rtmps`). A stream key is a secret: no usage error repeats it (they
name the URL up to the app).

RTSP: the URL is the camera's; `user:pass@` moves to `username`/`password` (percent-decoded),
and the query keys `transport`, `timeout_secs` and `reconnect_delay_secs` are taken out of the
URL (every other query key is the camera's and stays in `rtsp_url`). No usage error repeats
the password.

Pure functions, no I/O: the values are checked again by the pydantic model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from cli.errors import UsageError


def _scheme_table(kinds: Any) -> dict[str, Any]:
    """URL scheme -> kind, from the kind registry (``appliance.models.kinds``)."""
    table = {kind.url_scheme: kind for kind in kinds.values() if kind.url_scheme is not None}
    table.update({kind.url_tls_scheme: kind for kind in kinds.values() if kind.url_tls_scheme is not None})
    return table


_RTMP_PORTS = {"rtmp": 1935, "rtmps": 443}


def _rtmp_fields(url: str, option: str, *, listener: bool) -> tuple[dict[str, Any], str]:
    """(the fields, the URL without its key) of an `rtmp[s]://host[:port]/app[/key]` URL.

    Errors name the URL up to the app only: the key is a secret (never echoed)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    app, _, key = parts.path.lstrip("/").partition("/")
    shown = f"{scheme}://{parts.netloc}/{app}"
    try:
        port = parts.port or _RTMP_PORTS[scheme]
    except ValueError:
        raise UsageError(f"{option} {shown!r}: the port must be 1-65535") from None
    host = parts.hostname or ""
    if not host:
        if not listener:
            raise UsageError(f"{option} {shown!r} has no host", hint=f"e.g. {option} rtmp://live.example.net/app/KEY")
        host = "0.0.0.0"
    if not app:
        raise UsageError(f"{option} {shown!r} has no app", hint=f"e.g. {option} {scheme}://{host}:{port}/live/KEY")
    if "/" in key:
        raise UsageError(f"{option} {shown!r}: the path is /<app>/<stream key>, no more")
    bracketed = f"[{host}]" if ":" in host else host
    if listener:
        fields: dict[str, Any] = {"listen_addr": f"{bracketed}:{port}", "app": app, "stream_key": key or None}
        if scheme == "rtmps":
            fields["tls"] = True
        return fields, shown
    if not key:
        raise UsageError(f"{option} {shown!r} has no stream key", hint=f"e.g. {option} {shown}/KEY")
    return {"dest_url": f"{scheme}://{parts.netloc}/{app}", "stream_key": key}, shown


def _registry() -> Any:
    # Imported on use: the registry brings pydantic, which `mp flow list` never needs.
    from appliance.models import kinds

    return kinds


def _address(url: str, option: str, *, default_host: str | None) -> tuple[str, str, int]:
    """(scheme, `<ip>:<port>` text, port) of a URL; IPv6 hosts are kept in brackets."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        # not a number or above 65535; 0 passes here and the model refuses it in the same words
        raise UsageError(f"{option} {url!r}: the port must be 1-65535") from None
    if port is None:
        raise UsageError(f"{option} {url!r} has no port", hint=f"e.g. {parts.scheme or 'rtp'}://0.0.0.0:5000")
    host = parts.hostname or ""
    if not host:
        if default_host is None:
            raise UsageError(f"{option} {url!r} has no host")
        host = default_host
    if ":" in host:
        host = f"[{host}]"
    if parts.path not in ("", "/"):
        raise UsageError(f"{option} {url!r}: a path is not allowed here")
    return parts.scheme.lower(), f"{host}:{port}", port


def _query(url: str, option: str, allowed: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, raw in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        spec = allowed.get(key)
        if spec is None:
            known = ", ".join(sorted(allowed)) or "none"
            raise UsageError(f"{option} {url.split('?')[0]!r}: unknown parameter {key!r}", hint=f"known: {known}")
        field, kind = spec
        fields[field] = _convert(raw, kind, f"{option} parameter {key!r}")
    return fields


def _convert(raw: str, kind: str, what: str) -> Any:
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise UsageError(f"{what} must be a whole number, not {raw!r}") from None
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"{what} must be a number, not {raw!r}") from None
    if kind == "bool":
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on", ""):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"{what} must be true or false, not {raw!r}")
    if kind == "fec":
        cols, sep, rows = raw.lower().partition("x")
        if not sep or not cols.isdigit() or not rows.isdigit():
            raise UsageError(f"{what} must be COLUMNSxROWS, e.g. 10x10, not {raw!r}")
        return {"columns": int(cols), "rows": int(rows)}
    return raw


def _srt_fields(url: str, option: str, allowed: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    _, addr, port = _address(url, option, default_host="0.0.0.0")
    fields = _query(url, option, allowed)
    host = urlsplit(url).hostname or ""
    mode = fields.pop("mode", None) or ("listener" if host in ("", "0.0.0.0", "::") else "caller")
    if mode not in ("caller", "listener", "rendezvous"):
        raise UsageError(f"{option} {url.split('?')[0]!r}: mode must be caller, listener or rendezvous, not {mode!r}")
    srt: dict[str, Any] = {"mode": mode}
    if mode == "listener":
        srt["local_addr"] = fields.pop("local_addr", addr)
    elif mode == "caller":
        srt["remote_addr"] = addr
        srt["local_addr"] = fields.pop("local_addr", "0.0.0.0:0")
    else:
        srt["remote_addr"] = addr
        srt["local_addr"] = fields.pop("local_addr", f"0.0.0.0:{port}")
    srt.update(fields)
    return srt


def _rtsp_fields(url: str, option: str, allowed: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """The fields of an `rtsp[s]://[user:pass@]host[:port]/path[?query]` camera URL."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    shown = f"{parts.scheme}://{host}{parts.path}"
    if not parts.hostname:
        raise UsageError(
            f"{option} {shown!r}: the URL has no camera host", hint=f"e.g. {option} rtsp://10.0.0.5/stream1"
        )
    ours = "&".join(f"{k}={v}" for k, v in parse_qsl(parts.query, keep_blank_values=True) if k in allowed)
    theirs = "&".join(p for p in parts.query.split("&") if p and p.split("=", 1)[0] not in allowed)
    fields = _query(f"{shown}?{ours}", option, allowed)
    fields["rtsp_url"] = shown + (f"?{theirs}" if theirs else "")
    if parts.username is not None:
        fields["username"] = unquote(parts.username)
    if parts.password is not None:
        fields["password"] = unquote(parts.password)
    return fields


def _kind_of(url: str, option: str, kinds: Any, example: str) -> tuple[str, Any]:
    """(scheme, kind) of a URL whose scheme names a kind of the registry; else a usage error."""
    scheme = urlsplit(url).scheme.lower()
    table = _scheme_table(kinds)
    kind = table.get(scheme)
    if kind is None:
        raise UsageError(
            f"{option} {url!r}: the scheme must be one of " + ", ".join(f"{s}://" for s in table),
            hint=f"e.g. {option} {example}",
        )
    return scheme, kind


def parse_input(url: str, option: str = "--input") -> dict[str, Any]:
    """The input object for a URL whose scheme names an input kind (`rtp://`, `udp://`, `srt://`,
    `rtmp[s]://`, `rtsp[s]://`)."""
    scheme, kind = _kind_of(url, option, _registry().INPUT_KINDS, "rtp://0.0.0.0:5000")
    if scheme == "srt":
        return {"type": kind.type, **_srt_fields(url, option, kind.url_query)}
    if kind.type == "rtmp":
        fields, shown = _rtmp_fields(url, option, listener=True)
        return {"type": kind.type, **fields, **_query(shown + "?" + urlsplit(url).query, option, kind.url_query)}
    if kind.type == "rtsp":
        return {"type": kind.type, **_rtsp_fields(url, option, kind.url_query)}
    _, addr, _ = _address(url, option, default_host="0.0.0.0")
    return {"type": kind.type, "bind_addr": addr, **_query(url, option, kind.url_query)}


def parse_output(url: str, output_id: str, option: str = "--output") -> dict[str, Any]:
    """The output object for a URL whose scheme names an output kind; `name` defaults to the id."""
    scheme, kind = _kind_of(url, option, _registry().OUTPUT_KINDS, "udp://239.1.1.1:5000")
    if kind.type == "rtmp":
        fields, shown = _rtmp_fields(url, option, listener=False)
        extra = _query(shown + "?" + urlsplit(url).query, option, kind.url_query)
        name = extra.pop("name", output_id)
        return {"type": kind.type, "id": output_id, "name": name, **fields, **extra}
    if scheme == "srt":
        fields = _srt_fields(url, option, kind.url_query)
        name = fields.pop("name", output_id)
        return {"type": kind.type, "id": output_id, "name": name, **fields}
    _, addr, _ = _address(url, option, default_host=None)
    fields = _query(url, option, kind.url_query)
    name = fields.pop("name", output_id)
    return {"type": kind.type, "id": output_id, "name": name, "dest_addr": addr, **fields}


def next_output_id(taken: set[str]) -> str:
    """The first of out1, out2, ... not in `taken`."""
    n = 1
    while f"out{n}" in taken:
        n += 1
    return f"out{n}"


def validation_lines(exc: Any) -> list[str]:
    """`loc: message` lines from a pydantic ValidationError, never echoing the input.

    `str(exc)` would print the offending values, secrets included (style guide 3).
    """
    from appliance.untrusted import error_message  # the edge's wording: limits, never lengths

    lines = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()) if not _is_tag(p, err))
        lines.append(f"{loc or '(body)'}: {error_message(err)}")
    return lines


def _is_tag(part: Any, err: dict[str, Any]) -> bool:
    # A discriminated union puts the tag (e.g. 'rtp') into the location: input.rtp.bind_addr.
    return isinstance(part, str) and part in _registry().UNION_TAGS
