"""`mp tunnel ...`: list, show, create, delete (edge IP tunnels, interop.md 2.6)."""

from typing import Annotated, Any, Optional

import typer

from cli.context import FormatOption, JsonOption, YesOption, confirm, read_body, state
from cli.errors import UsageError
from cli.render import emit, message, resolve_format

app = typer.Typer(
    help="IP tunnels: UDP or TCP carried to another edge through a relay or directly.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

LIST_HINT = "try: mp tunnel list"
TunnelArg = Annotated[str, typer.Argument(help="Tunnel id (a UUID).", metavar="TUNNEL")]
SECRET_FIELDS = ("tunnel_encryption_key", "tunnel_bind_secret", "tunnel_psk", "tls_cert_pem", "tls_key_pem")


def tunnel_path(tunnel_id: str) -> str:
    from cli.client import quote

    return f"/api/v1/tunnels/{quote(tunnel_id)}"


def _row(t: dict[str, Any]) -> list[Any]:
    return [
        t.get("id"),
        t.get("name"),
        t.get("protocol"),
        t.get("mode"),
        t.get("direction"),
        t.get("state"),
        t.get("local_addr"),
        t.get("relay_addr"),
    ]


_HEADERS = ["ID", "NAME", "PROTOCOL", "MODE", "DIRECTION", "STATE", "LOCAL", "RELAY"]
_STATE_STYLE = {"Connected": "green", "Waiting": "yellow", "Connecting": "yellow", "Failed": "red"}


def _list_table(data: Any, colour: bool) -> str:
    from cli.render import columns

    tunnels = [t for t in (data or {}).get("tunnels", []) if isinstance(t, dict)]
    return columns(
        _HEADERS,
        [_row(t) for t in tunnels],
        colour,
        row_styles=[_STATE_STYLE.get(str(t.get("state"))) for t in tunnels],
        empty="no tunnels (try: mp tunnel create --help)",
    )


def _show_table(data: Any, colour: bool) -> str:
    from cli.render import columns, count

    if not isinstance(data, dict):
        return str(data)
    rows = [[header, value] for header, value in zip(_HEADERS, _row(data), strict=True)]
    rows += [["ENABLED", data.get("enabled")], ["TRANSPORT", data.get("transport")]]
    stats = data.get("stats")
    if isinstance(stats, dict):
        rows += [[name.upper().replace("_", " "), count(value)] for name, value in stats.items()]
    return columns(["FIELD", "VALUE"], rows, colour)


@app.command("list")
def list_tunnels(
    ctx: typer.Context,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the tunnel ids.")] = False,
) -> None:
    """List the edge's tunnels with their state (Stopped, Connecting, Waiting, Connected, Failed).

    Example: mp tunnel list -o json | jq -r '.tunnels[].id'
    """
    data = state(ctx).client().get("/api/v1/tunnels")
    if quiet:
        for tunnel in (data or {}).get("tunnels", []):
            typer.echo(tunnel.get("id"))
        return
    emit(data, resolve_format(fmt, as_json), _list_table)


@app.command("show")
def show(ctx: typer.Context, tunnel_id: TunnelArg, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """Show one tunnel: its summary, state and counters (never its keys).

    Example: mp tunnel show 0f8e5c1a-3b7d-4c2e-9a61-5d4b3c2a1f00
    """
    data = state(ctx).client().get(tunnel_path(tunnel_id), not_found_hint=LIST_HINT)
    emit(data, resolve_format(fmt, as_json), _show_table)


def validate_tunnel(body: Any) -> None:
    """Check a tunnel body with the shared TunnelConfig model; UsageError naming each bad field
    (never a value: a key must not end up in a terminal's scrollback)."""
    from pydantic import ValidationError

    from appliance.models.config import TunnelConfig
    from cli.urls import validation_lines

    if not isinstance(body, dict):
        raise UsageError("a tunnel must be a JSON object")
    try:
        TunnelConfig.model_validate(body)
    except ValidationError as exc:
        raise UsageError("invalid tunnel: " + "; ".join(validation_lines(exc))) from None


def _opt(help_text: str, *names: str, metavar: str = "TEXT") -> Any:
    return typer.Option(*names, help=help_text, metavar=metavar)


_FILE_HELP = "Read the whole tunnel as JSON (or YAML) from FILE; - is stdin."
_ID_HELP = "Tunnel id, a UUIDv4 (default: a new one)."
_DIRECTION_HELP = "egress (takes local traffic into the tunnel) or ingress (delivers it)."
_LOCAL_HELP = "IP:PORT: egress listens there, ingress forwards there."
_TRANSPORT_HELP = "quic (default) or udp (the relay's native UDP plane)."
_KEY_HELP = "tunnel_encryption_key, 64 hex digits (both edges the same)."
_GENERATE_HELP = "Make a new random key and print it once on stderr."
_BIND_HELP = "tunnel_bind_secret, 64 hex digits (optional)."
_PEER_HELP = "Direct mode, egress: the peer's HOST:PORT."
_LISTEN_HELP = "Direct mode, ingress: IP:PORT to listen on."
_ENABLED_HELP = "Start the tunnel now and at boot (default: enabled)."


@app.command("create")
def create(
    ctx: typer.Context,
    file: Annotated[Optional[str], _opt(_FILE_HELP, "--file", "-f", metavar="FILE")] = None,  # noqa: UP045
    tunnel_id: Annotated[Optional[str], _opt(_ID_HELP, "--id", metavar="UUID")] = None,  # noqa: UP045
    name: Annotated[Optional[str], _opt("Display name.", "--name", "-n")] = None,  # noqa: UP045
    protocol: Annotated[Optional[str], _opt("Payload: udp or tcp.", "--protocol", metavar="udp|tcp")] = None,  # noqa: UP045
    mode: Annotated[Optional[str], _opt("relay or direct.", "--mode", metavar="relay|direct")] = None,  # noqa: UP045
    direction: Annotated[Optional[str], _opt(_DIRECTION_HELP, "--direction", metavar="egress|ingress")] = None,  # noqa: UP045
    local: Annotated[Optional[str], _opt(_LOCAL_HELP, "--local", metavar="IP:PORT")] = None,  # noqa: UP045
    relay: Annotated[Optional[str], _opt("Relay HOST:PORT (relay mode).", "--relay", metavar="HOST:PORT")] = None,  # noqa: UP045
    transport: Annotated[Optional[str], _opt(_TRANSPORT_HELP, "--transport", metavar="quic|udp")] = None,  # noqa: UP045
    key: Annotated[Optional[str], _opt(_KEY_HELP, "--key", metavar="HEX")] = None,  # noqa: UP045
    generate_key: Annotated[bool, typer.Option("--generate-key", help=_GENERATE_HELP)] = False,
    bind_secret: Annotated[Optional[str], _opt(_BIND_HELP, "--bind-secret", metavar="HEX")] = None,  # noqa: UP045
    peer: Annotated[Optional[str], _opt(_PEER_HELP, "--peer", metavar="HOST:PORT")] = None,  # noqa: UP045
    listen: Annotated[Optional[str], _opt(_LISTEN_HELP, "--direct-listen", metavar="IP:PORT")] = None,  # noqa: UP045
    psk: Annotated[Optional[str], _opt("Direct mode: the pre-shared key.", "--psk")] = None,  # noqa: UP045
    enabled: Annotated[Optional[bool], typer.Option("--enabled/--disabled", help=_ENABLED_HELP)] = None,  # noqa: UP045
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and print the body, keys hidden; send nothing.")
    ] = False,
) -> None:
    """Create a tunnel (started at once unless --disabled).

    \b
    Relay:  mp tunnel create --name "Cam 1 to studio" --protocol udp --mode relay \\
                --direction egress --local 127.0.0.1:5000 --relay relay.example:4433 --generate-key
    Direct: mp tunnel create --name Return --protocol tcp --mode direct --direction ingress \\
                --local 10.0.0.9:8554 --direct-listen 0.0.0.0:4500 --psk "$PSK"
    File:   mp tunnel create -f tunnel.json      (-f - reads stdin)

    Keys given as options are visible to other users of this machine (ps); prefer -f with a
    file only you can read. The body is checked against the tunnel model before it is sent.
    """
    import secrets
    import uuid

    body: dict[str, Any] = {}
    if file is not None:
        loaded = read_body(file)
        if not isinstance(loaded, dict):
            raise UsageError(f"{file}: a tunnel must be a JSON object")
        body = loaded
    if generate_key and key is not None:
        raise UsageError("give --key or --generate-key, not both")
    new_key = secrets.token_hex(32) if generate_key else key
    for field, value in (
        ("id", tunnel_id),
        ("name", name),
        ("protocol", protocol),
        ("mode", mode),
        ("direction", direction),
        ("local_addr", local),
        ("relay_addr", relay),
        ("transport", transport),
        ("tunnel_encryption_key", new_key),
        ("tunnel_bind_secret", bind_secret),
        ("peer_addr", peer),
        ("direct_listen_addr", listen),
        ("tunnel_psk", psk),
        ("enabled", enabled),
    ):
        if value is not None:
            body[field] = value
    body.setdefault("id", str(uuid.uuid4()))
    missing = [
        flag
        for field, flag in (
            ("name", "--name"),
            ("protocol", "--protocol"),
            ("mode", "--mode"),
            ("direction", "--direction"),
            ("local_addr", "--local"),
        )
        if not body.get(field)
    ]
    if missing:
        raise UsageError("missing " + ", ".join(missing), hint="or give the whole tunnel with -f tunnel.json")
    validate_tunnel(body)
    if dry_run:
        emit({k: v for k, v in body.items() if k not in SECRET_FIELDS}, "json")
        return
    state(ctx).client().post("/api/v1/tunnels", body)
    if generate_key:
        message(f"tunnel_encryption_key: {new_key}  (give the other edge the same key; it is not shown again)")
    started = body.get("enabled", True)
    message(f"tunnel {body['id']} created" + (" and started" if started else " (disabled)"))


@app.command("delete")
def delete(ctx: typer.Context, tunnel_id: TunnelArg, yes: YesOption = False) -> None:
    """Delete a tunnel (stopped first) and its keys.

    Asks first on a terminal; --yes skips the question. Example: mp tunnel delete ID --yes
    """
    confirm(f"Delete tunnel {tunnel_id}? Traffic through it stops.", yes)
    state(ctx).client().delete(tunnel_path(tunnel_id), not_found_hint=LIST_HINT)
    message(f"tunnel {tunnel_id} deleted")
