"""`mp`: the field engineer's console tool for a Mediaplane edge.

Start-up is kept short on purpose (bench/cli_start.py): this module and the
command modules import only Typer and small local modules at the top; HTTP,
pydantic, YAML, trio and rich.live are imported inside the commands that use them.
The command modules do not use `from __future__ import annotations`: Typer would
then compile and eval every parameter's annotation string on every start.
"""

import os
import sys
from typing import Annotated, Optional

import typer

from cli import _fastparams
from cli.commands import auth as auth_cmd
from cli.commands import config as config_cmd
from cli.commands import flow as flow_cmd
from cli.commands import misc as misc_cmd
from cli.commands import output as output_cmd
from cli.commands import stats as stats_cmd
from cli.context import State
from cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, MpError

EPILOG = (
    "Exit codes: 0 ok, 1 failure, 2 usage error, 3 not found, 4 authentication needed or refused, "
    "130 interrupted.  Endpoint: --url, then $MEDIAPLANE_URL, then the profile file "
    "~/.config/mp/config.toml (--profile), then http://127.0.0.1:8080.  See docs/cli.md."
)

app = typer.Typer(
    name="mp",
    help="Control and watch a Mediaplane edge: flows, outputs, statistics, configuration.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(flow_cmd.app, name="flow")
app.add_typer(output_cmd.app, name="output")
app.add_typer(config_cmd.app, name="config")
app.add_typer(auth_cmd.app, name="auth")
app.add_typer(misc_cmd.setup_app, name="setup")
app.command("stats")(stats_cmd.stats)
app.command("health")(misc_cmd.health)
app.command("completion")(misc_cmd.completion)

_debug = False


def _version(value: bool) -> None:
    if value:
        from appliance import __version__

        sys.stdout.write(f"mp {__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    url: Annotated[Optional[str], typer.Option("--url", help="Edge API base URL.", metavar="URL")] = None,  # noqa: UP045
    token: Annotated[Optional[str], typer.Option("--token", help="Bearer token (beats client credentials).")] = None,  # noqa: UP045
    client_id: Annotated[Optional[str], typer.Option("--client-id", help="OAuth client id.")] = None,  # noqa: UP045
    client_secret: Annotated[Optional[str], typer.Option("--client-secret", help="OAuth client secret.")] = None,  # noqa: UP045
    profile: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--profile", "-p", help="Section of ~/.config/mp/config.toml to use."),
    ] = None,
    timeout: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option("--timeout", help="Seconds to wait for each network call (default 10).", metavar="SECONDS"),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of a failure.")] = False,
    version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print mp's version.")
    ] = False,
) -> None:
    """Control and watch a Mediaplane edge: flows, outputs, statistics, configuration."""
    from cli.settings import Flags

    global _debug
    _debug = _debug or debug
    ctx.obj = State(
        Flags(
            url=url,
            token=token,
            client_id=client_id,
            client_secret=client_secret,
            profile=profile,
            timeout_s=timeout,
        ),
        debug=debug,
    )


def _debug_requested(argv: list[str]) -> bool:
    if _debug or os.environ.get("MP_DEBUG", "") not in ("", "0"):
        return True
    # Options end at the subcommand's own `--`; before that, --debug anywhere counts.
    return "--debug" in argv[: argv.index("--")] if "--" in argv else "--debug" in argv


def main(argv: list[str] | None = None) -> None:
    """The `mp` console script: run the app, turn MpError into one line and an exit code."""
    _fastparams.install()
    if os.environ.get("_MP_COMPLETE"):  # a shell asks for completions (mp completion bash|zsh|fish)
        from typer.completion import completion_init  # type: ignore[attr-defined]

        completion_init()  # add_completion=False leaves Typer's shell classes unregistered
    args = sys.argv[1:] if argv is None else argv
    try:
        app(args=args, prog_name="mp")
    except MpError as err:
        if _debug_requested(args):
            raise
        from cli.render import message

        message(f"mp: {err}")
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        if _debug_requested(args):
            raise
        raise SystemExit(EXIT_INTERRUPTED) from None
    except Exception as exc:  # the CLI's one broad catch: one line, traceback under --debug
        if _debug_requested(args):
            raise
        from cli.render import message

        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        message(f"mp: internal error: {type(exc).__name__}{': ' + text if text else ''} (rerun with --debug)")
        raise SystemExit(EXIT_FAILURE) from None


if __name__ == "__main__":  # pragma: no cover
    main()
