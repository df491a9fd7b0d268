"""`mp health`, `mp setup status` and `mp completion`."""

from typing import Annotated, Any, Literal

import typer

from cli.context import FormatOption, JsonOption, state
from cli.render import emit, resolve_format

setup_app = typer.Typer(help="The first-boot setup wizard's settings.", no_args_is_help=True, rich_markup_mode=None)


def _health_table(data: Any, colour: bool) -> str:
    from cli.render import duration, paint

    if not isinstance(data, dict):
        return str(data)
    status = str(data.get("status", "?"))
    lines = [
        f"status:        {paint(status, 'green' if status == 'ok' else 'red', colour)}",
        f"version:       {data.get('version', '-')}",
        f"uptime:        {duration(data.get('uptime_secs'))}",
        f"flows:         {data.get('active_flows', '-')} running of {data.get('total_flows', '-')}",
    ]
    return "\n".join(lines)


def health(ctx: typer.Context, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """Is the edge up? Version, uptime and how many flows run (no login needed).

    Exit 0 when the edge answers, 1 when it does not. Example: mp health
    """
    data = state(ctx).client().get("/health", envelope=False, auth=False)
    emit(data, resolve_format(fmt, as_json), _health_table)


@setup_app.command("status")
def setup_status(ctx: typer.Context, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """Show the setup wizard's settings: manager URL, device name, listen address.

    Example: mp setup status
    """
    data = state(ctx).client().get("/setup/status", envelope=False, auth=False)
    emit(data, resolve_format(fmt, as_json))


def completion(
    shell: Annotated[Literal["bash", "zsh", "fish"], typer.Argument(help="bash, zsh or fish.", metavar="SHELL")],
) -> None:
    """Print the shell completion script.

    \b
    bash:  source <(mp completion bash)    (or save it as /etc/bash_completion.d/mp)
    zsh:   mp completion zsh > "${fpath[1]}/_mp"
    fish:  mp completion fish > ~/.config/fish/completions/mp.fish
    """
    from typer.completion import get_completion_script  # type: ignore[attr-defined]  # see style guide 5

    typer.echo(get_completion_script(prog_name="mp", complete_var="_MP_COMPLETE", shell=shell))
