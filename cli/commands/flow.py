"""`mp flow ...`: list, show, create, update, delete, start, stop, restart."""

from typing import Annotated, Any, Optional

import typer

from cli.context import FormatOption, JsonOption, YesOption, confirm, interactive, prompt, read_body, state
from cli.errors import UsageError
from cli.render import emit, message, resolve_format

app = typer.Typer(help="Flows: one input fanned out to outputs.", no_args_is_help=True, rich_markup_mode=None)

LIST_HINT = "try: mp flow list"
FlowArg = Annotated[str, typer.Argument(help="Flow id.", metavar="FLOW")]


def flow_path(flow_id: str, suffix: str = "") -> str:
    from cli.client import quote

    return f"/api/v1/flows/{quote(flow_id)}{suffix}"


def _list_table(data: Any, colour: bool) -> str:
    from cli.render import columns

    rows = [
        [f.get("id"), f.get("name"), f.get("enabled"), f.get("input_type"), f.get("output_count")]
        for f in data.get("flows", [])
    ]
    return columns(["ID", "NAME", "ENABLED", "INPUT", "OUTPUTS"], rows, colour, empty="no flows (try: mp flow create)")


@app.command("list")
def list_flows(
    ctx: typer.Context,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the flow ids.")] = False,
) -> None:
    """List the flows defined on the edge.

    Example: mp flow list -o json | jq -r '.flows[].id'
    """
    data = state(ctx).client().get("/api/v1/flows")
    if quiet:
        for flow in (data or {}).get("flows", []):
            typer.echo(flow.get("id"))
        return
    emit(data, resolve_format(fmt, as_json), _list_table)


@app.command("show")
def show(ctx: typer.Context, flow_id: FlowArg, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """Show one flow's configuration (input and outputs).

    Example: mp flow show cam1
    """
    data = state(ctx).client().get(flow_path(flow_id), not_found_hint=LIST_HINT)
    emit(data, resolve_format(fmt, as_json))


# ---------------------------------------------------------------------------- create / update


def validate_flow(body: Any) -> None:
    """Check a flow body with the shared FlowConfig model; UsageError naming each bad field."""
    from pydantic import ValidationError

    from appliance.models.config import FlowConfig
    from cli.urls import validation_lines

    if not isinstance(body, dict):
        raise UsageError("a flow must be a JSON object")
    try:
        FlowConfig.model_validate(body)
    except ValidationError as exc:
        raise UsageError("invalid flow: " + "; ".join(validation_lines(exc))) from None


def build_outputs(urls: list[str], ids: list[str], taken: set[str] | None = None) -> list[dict[str, Any]]:
    from cli.urls import next_output_id, parse_output

    if len(ids) > len(urls):
        raise UsageError("more --output-id than --output values")
    used = set(taken or ())
    outputs = []
    for n, url in enumerate(urls):
        output_id = ids[n] if n < len(ids) else next_output_id(used | set(ids))
        used.add(output_id)
        outputs.append(parse_output(url, output_id))
    return outputs


def _prompt_missing(body: dict[str, Any], outputs_given: bool) -> None:
    """Ask for what a flow needs when a person is at the terminal."""
    from cli.urls import next_output_id, parse_input, parse_output

    message("Creating a flow; press Ctrl-C to give up.", "dim")
    if not body.get("id"):
        body["id"] = prompt("Flow id")
    if not body.get("name"):
        body["name"] = prompt("Name", default=body["id"])
    while "input" not in body:
        try:
            body["input"] = parse_input(prompt("Input URL (rtp://, udp://, srt://)", default="rtp://0.0.0.0:5000"))
        except UsageError as err:
            message(f"mp: {err}", "red")
    if not outputs_given:
        outputs: list[dict[str, Any]] = []
        while True:
            url = prompt("Output URL (empty to finish)", default="")
            if not url:
                break
            try:
                outputs.append(parse_output(url, next_output_id({o["id"] for o in outputs})))
            except UsageError as err:
                message(f"mp: {err}", "red")
        body["outputs"] = outputs


def _apply_flags(
    body: dict[str, Any],
    *,
    name: str | None,
    input_url: str | None,
    output_urls: list[str],
    output_ids: list[str],
    enabled: bool | None,
) -> bool:
    """Overlay the flags on a body; True when anything changed."""
    from cli.urls import parse_input

    changed = False
    if name is not None:
        body["name"], changed = name, True
    if input_url is not None:
        body["input"], changed = parse_input(input_url), True
    if output_urls:
        body["outputs"], changed = build_outputs(output_urls, output_ids), True
    elif output_ids:
        raise UsageError("--output-id needs an --output")
    if enabled is not None:
        body["enabled"], changed = enabled, True
    return changed


NameOption = Annotated[Optional[str], typer.Option("--name", "-n", help="Display name.")]  # noqa: UP045
InputOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        "--input", "-i", help="Input URL: rtp://IP:PORT, udp://IP:PORT, srt://HOST:PORT?mode=...", metavar="URL"
    ),
]
OutputsOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--output", help="Output URL (repeat for more): udp://, rtp://, srt://.", metavar="URL"),
]
OutputIdsOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--output-id", help="Id of the matching --output (default out1, out2, ...).", metavar="ID"),
]
FileOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option("--file", "-f", help="Read the flow as JSON (or YAML) from FILE; - is stdin.", metavar="FILE"),
]
EnabledOption = Annotated[
    Optional[bool],  # noqa: UP045
    typer.Option("--enabled/--disabled", help="Start the flow now and at boot (default: enabled)."),
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Validate and print the body; send nothing.")]


def _print_result(data: Any, fmt: str | None, as_json: bool, text: str) -> None:
    chosen = resolve_format(fmt, as_json)
    if chosen in ("json", "yaml"):
        emit(data, chosen)
    message(text)


@app.command("create")
def create(
    ctx: typer.Context,
    flow_id: Annotated[Optional[str], typer.Argument(help="Flow id.", metavar="FLOW")] = None,  # noqa: UP045
    file: FileOption = None,
    name: NameOption = None,
    input_url: InputOption = None,
    output_urls: OutputsOption = None,
    output_ids: OutputIdsOption = None,
    enabled: EnabledOption = None,
    dry_run: DryRunOption = False,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a flow (started at once unless --disabled).

    \b
    Flags:  mp flow create cam1 --name "Cam 1" --input rtp://0.0.0.0:5000 \\
                --output udp://239.1.1.1:5000
    SRT:    mp flow create cam2 --name "Cam 2" --input 'srt://:9000' \\
                --output 'srt://10.0.0.9:9000?mode=caller&latency=120'
    File:   mp flow create -f flow.json      (-f - reads stdin)

    With a terminal and values missing, mp asks for them. The body is checked
    against the flow model before anything is sent.
    """
    body: dict[str, Any] = {}
    if file is not None:
        loaded = read_body(file)
        if not isinstance(loaded, dict):
            raise UsageError(f"{file}: a flow must be a JSON object")
        body = loaded
    if flow_id is not None:
        body["id"] = flow_id
    _apply_flags(
        body,
        name=name,
        input_url=input_url,
        output_urls=output_urls or [],
        output_ids=output_ids or [],
        enabled=enabled,
    )
    missing = [label for key, label in (("id", "FLOW"), ("name", "--name"), ("input", "--input")) if not body.get(key)]
    if missing:
        if file is None and interactive():
            _prompt_missing(body, outputs_given=bool(output_urls))
        else:
            raise UsageError("missing " + ", ".join(missing), hint="or give the whole flow with -f flow.json")
    body.setdefault("outputs", [])
    validate_flow(body)
    if dry_run:
        emit(body, "yaml" if resolve_format(fmt, as_json) == "yaml" else "json")
        return
    data = state(ctx).client().post("/api/v1/flows", body)
    started = body.get("enabled", True)
    _print_result(data, fmt, as_json, f"flow {body['id']!r} created" + (" and started" if started else " (disabled)"))


@app.command("update")
def update(
    ctx: typer.Context,
    flow_id: FlowArg,
    file: FileOption = None,
    name: NameOption = None,
    input_url: InputOption = None,
    output_urls: OutputsOption = None,
    output_ids: OutputIdsOption = None,
    enabled: EnabledOption = None,
    dry_run: DryRunOption = False,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replace a flow's configuration; a running flow is restarted with it.

    With -f the file is the whole new flow. With flags, the current flow is
    fetched and only what you name changes (--output replaces all outputs; to add
    one, use mp output add).

    Example: mp flow update cam1 --name "Camera 1 (backup)" --disabled
    """
    client = state(ctx).client()
    if file is not None:
        loaded = read_body(file)
        if not isinstance(loaded, dict):
            raise UsageError(f"{file}: a flow must be a JSON object")
        body = loaded
        changed = True
    else:
        current = client.get(flow_path(flow_id), not_found_hint=LIST_HINT)
        body = dict(current) if isinstance(current, dict) else {}
        changed = False
    changed = (
        _apply_flags(
            body,
            name=name,
            input_url=input_url,
            output_urls=output_urls or [],
            output_ids=output_ids or [],
            enabled=enabled,
        )
        or changed
    )
    if not changed:
        raise UsageError("nothing to change", hint="give -f FILE or --name, --input, --output, --enabled/--disabled")
    body["id"] = flow_id  # the path id wins (edge interface 4, PUT)
    validate_flow(body)
    if dry_run:
        emit(body, "yaml" if resolve_format(fmt, as_json) == "yaml" else "json")
        return
    data = client.put(flow_path(flow_id), body, not_found_hint=LIST_HINT)
    _print_result(data, fmt, as_json, f"flow {flow_id!r} updated")


@app.command("delete")
def delete(ctx: typer.Context, flow_id: FlowArg, yes: YesOption = False) -> None:
    """Delete a flow; it is stopped first if it is running.

    Asks first on a terminal; --yes skips the question. Example: mp flow delete cam1 --yes
    """
    confirm(f"Delete flow {flow_id!r}? A running flow goes off air.", yes)
    state(ctx).client().delete(flow_path(flow_id), not_found_hint=LIST_HINT)
    message(f"flow {flow_id!r} deleted")


def _action(ctx: typer.Context, flow_id: str, verb: str, done: str) -> None:
    state(ctx).client().post(flow_path(flow_id, f"/{verb}"), not_found_hint=LIST_HINT)
    message(f"flow {flow_id!r} {done}")


@app.command("start")
def start(ctx: typer.Context, flow_id: FlowArg) -> None:
    """Start a stopped flow. Fails (exit 1) if it is already running.

    Example: mp flow start cam1
    """
    _action(ctx, flow_id, "start", "started")


@app.command("stop")
def stop(ctx: typer.Context, flow_id: FlowArg) -> None:
    """Stop a running flow; its configuration is kept.

    Example: mp flow stop cam1
    """
    _action(ctx, flow_id, "stop", "stopped")


@app.command("restart")
def restart(ctx: typer.Context, flow_id: FlowArg) -> None:
    """Restart a flow from its current configuration (starts it if stopped).

    Example: mp flow restart cam1
    """
    _action(ctx, flow_id, "restart", "restarted")
