"""`mp output ...`: add, remove (and list) the outputs of a flow, hot, without a restart."""

from typing import Annotated, Any, Optional

import typer

from cli.commands.flow import LIST_HINT, FlowArg, flow_path
from cli.context import FormatOption, JsonOption, YesOption, confirm, read_body, state
from cli.errors import UsageError
from cli.render import emit, message, resolve_format

app = typer.Typer(
    help="Outputs of a flow, added and removed while it runs.", no_args_is_help=True, rich_markup_mode=None
)


def _outputs_table(data: Any, colour: bool) -> str:
    from cli.render import columns

    rows = []
    for o in data:
        target = o.get("dest_addr") or o.get("remote_addr") or o.get("local_addr") or o.get("dest_url") or "-"
        rows.append([o.get("id"), o.get("name"), o.get("type"), o.get("mode", "-"), target])
    return columns(["ID", "NAME", "TYPE", "MODE", "ADDRESS"], rows, colour, empty="no outputs")


@app.command("list")
def list_outputs(ctx: typer.Context, flow_id: FlowArg, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """List a flow's outputs. Example: mp output list cam1"""
    flow = state(ctx).client().get(flow_path(flow_id), not_found_hint=LIST_HINT)
    emit((flow or {}).get("outputs", []), resolve_format(fmt, as_json), _outputs_table)


@app.command("add")
def add(
    ctx: typer.Context,
    flow_id: FlowArg,
    url: Annotated[
        Optional[str],  # noqa: UP045
        typer.Argument(help="Output URL: udp://IP:PORT, rtp://IP:PORT, srt://HOST:PORT?mode=...", metavar="URL"),
    ] = None,
    output_id: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--id", help="Output id (default: the first free of out1, out2, ...)."),
    ] = None,
    name: Annotated[Optional[str], typer.Option("--name", "-n", help="Display name (default: the id).")] = None,  # noqa: UP045
    file: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--file", "-f", help="Read the output object as JSON from FILE; - is stdin.", metavar="FILE"),
    ] = None,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add an output to a flow; a running flow keeps running.

    \b
    UDP:  mp output add cam1 udp://239.1.1.2:5000 --name "To studio B"
    SRT:  mp output add cam1 'srt://203.0.113.7:9000?mode=caller&latency=500'
    """
    from pydantic import TypeAdapter, ValidationError

    from appliance.models.config import OutputConfig
    from cli.urls import next_output_id, parse_output, validation_lines

    client = state(ctx).client()
    if file is not None:
        body = read_body(file)
        if not isinstance(body, dict):
            raise UsageError(f"{file}: an output must be a JSON object")
        if output_id is not None:
            body["id"] = output_id
        if name is not None:
            body["name"] = name
    elif url is not None:
        if output_id is None:
            flow = client.get(flow_path(flow_id), not_found_hint=LIST_HINT) or {}
            output_id = next_output_id({str(o.get("id")) for o in flow.get("outputs", [])})
        body = parse_output(url, output_id, option="URL")
        if name is not None:
            body["name"] = name
    else:
        raise UsageError("give an output URL or -f FILE", hint="e.g. mp output add cam1 udp://239.1.1.2:5000")
    try:
        TypeAdapter(OutputConfig).validate_python(body)
    except ValidationError as exc:
        raise UsageError("invalid output: " + "; ".join(validation_lines(exc))) from None
    data = client.post(flow_path(flow_id, "/outputs"), body, not_found_hint=LIST_HINT)
    chosen = resolve_format(fmt, as_json)
    if chosen in ("json", "yaml"):
        emit(data, chosen)
    message(f"output {body.get('id')!r} added to flow {flow_id!r}")


@app.command("remove")
def remove(
    ctx: typer.Context,
    flow_id: FlowArg,
    output_id: Annotated[str, typer.Argument(help="Output id.", metavar="OUTPUT")],
    yes: YesOption = False,
) -> None:
    """Remove an output from a flow; the rest of the flow keeps running.

    Asks first on a terminal; --yes skips the question. Example: mp output remove cam1 out2 --yes
    """
    confirm(f"Remove output {output_id!r} from flow {flow_id!r}? Its receivers lose the stream.", yes)
    from cli.client import quote

    state(ctx).client().delete(
        flow_path(flow_id, f"/outputs/{quote(output_id)}"), not_found_hint=f"try: mp output list {flow_id}"
    )
    message(f"output {output_id!r} removed from flow {flow_id!r}")
