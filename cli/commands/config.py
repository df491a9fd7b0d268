"""`mp config ...`: show, apply and reload the edge's whole configuration."""

from typing import Annotated, Any

import typer

from cli.context import FormatOption, JsonOption, YesOption, confirm, read_body, state
from cli.errors import UsageError
from cli.render import emit, holds_redacted, message, redact, resolve_format

app = typer.Typer(
    help="The edge's whole configuration (all flows at once).", no_args_is_help=True, rich_markup_mode=None
)


def _summary(data: Any, colour: bool) -> str:
    from cli.render import tree

    return tree(data, colour)


@app.command("show")
def show(
    ctx: typer.Context,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
    show_secrets: Annotated[
        bool, typer.Option("--show-secrets", help="Print flow secrets (SRT passphrases, stream keys) in clear.")
    ] = False,
) -> None:
    """Show the running configuration. Flow secrets are masked unless --show-secrets.

    The edge never returns its own secrets (auth, TLS, node secret). To back up a
    configuration that mp config apply can restore, keep the flow secrets:

    Example: mp config show --show-secrets -o json > edge-backup.json
    """
    data = state(ctx).client().get("/api/v1/config")
    emit(data if show_secrets else redact(data), resolve_format(fmt, as_json), _summary)


def _validate_config(body: Any) -> None:
    from pydantic import ValidationError

    from appliance.models.config import AppConfig
    from cli.urls import validation_lines

    if not isinstance(body, dict):
        raise UsageError("a configuration must be a JSON object")
    masked = holds_redacted(body)
    if masked:
        raise UsageError(
            f"the file holds a masked secret at {masked}",
            hint="export it with: mp config show --show-secrets -o json",
        )
    try:
        AppConfig.model_validate(body)
    except ValidationError as exc:
        raise UsageError("invalid configuration: " + "; ".join(validation_lines(exc))) from None


@app.command("apply")
def apply(
    ctx: typer.Context,
    file: Annotated[
        str, typer.Option("--file", "-f", help="The whole configuration as JSON; - is stdin.", metavar="FILE")
    ],
    yes: YesOption = False,
    fmt: FormatOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replace the whole configuration: every flow is stopped, replaced and the enabled ones started.

    The file is checked against the configuration model first. Secrets the edge
    keeps (auth, TLS) stay as they are when the file leaves them out.

    Example: mp config apply -f edge-backup.json --yes
    """
    body = read_body(file)
    _validate_config(body)
    confirm("Replace the whole configuration? Every running flow is restarted.", yes)
    data = state(ctx).client().put("/api/v1/config", body)
    chosen = resolve_format(fmt, as_json)
    if chosen in ("json", "yaml"):
        emit(redact(data), chosen)
    flows = len((data or {}).get("flows", [])) if isinstance(data, dict) else 0
    message(f"configuration applied ({flows} flow{'s' if flows != 1 else ''})")


@app.command("reload")
def reload(ctx: typer.Context, yes: YesOption = False, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """Re-read config.json and secrets.json from disk and restart the enabled flows.

    Use it after editing the files by hand. Example: mp config reload --yes
    """
    confirm("Reload the configuration from disk? Every running flow is restarted.", yes)
    data = state(ctx).client().post("/api/v1/config/reload")
    chosen = resolve_format(fmt, as_json)
    if chosen in ("json", "yaml"):
        emit(redact(data), chosen)
    message("configuration reloaded")
