"""`mp`: the field engineer's console tool for a Mediaplane edge.

Start-up is kept short on purpose (bench/cli_start.py): this module and the
command modules import only Typer and small local modules at the top; HTTP,
pydantic, YAML, trio and rich.live are imported inside the commands that use them.
The command modules do not use `from __future__ import annotations`: Typer would
then compile and eval every parameter's annotation string on every start.
"""

import os
import sys
from importlib import import_module
from typing import Annotated, Optional

import typer

from cli import _fastparams
from cli.context import State
from cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, MpError

EPILOG = (
    "Exit codes: 0 ok, 1 failure, 2 usage error, 3 not found, 4 authentication needed or refused, "
    "130 interrupted.  Endpoint: --url, then $MEDIAPLANE_URL, then the profile file "
    "~/.config/mp/config.toml (--profile), then http://127.0.0.1:8080.  See docs/cli.md."
)

# name -> (module, attribute, is a group). The order is the order of `mp --help`.
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "flow": ("cli.commands.flow", "app", True),
    "output": ("cli.commands.output", "app", True),
    "tunnel": ("cli.commands.tunnel", "app", True),
    "stats": ("cli.commands.stats", "stats", False),
    "events": ("cli.commands.events", "events", False),
    "config": ("cli.commands.config", "app", True),
    "health": ("cli.commands.misc", "health", False),
    "auth": ("cli.commands.auth", "app", True),
    "setup": ("cli.commands.misc", "setup_app", True),
    "manager": ("cli.commands.manager", "app", True),
    "completion": ("cli.commands.misc", "completion", False),
}
# Global options that take a value (so the word after them is not the command name).
_VALUE_OPTIONS = frozenset({"--url", "--token", "--client-id", "--client-secret", "--profile", "-p", "--timeout"})


def build_app(only: str | None = None) -> typer.Typer:
    """The Typer app with every command, or with just `only` (what this run needs).

    Typer turns every registered command into a Click command on each run
    (signatures, annotations, defaults), so registering only the one asked for
    keeps the start of `mp flow list` short. Help, completion and unknown names
    get the whole tree.
    """
    app = typer.Typer(
        name="mp",
        help="Control and watch a Mediaplane edge: flows, outputs, statistics, configuration.",
        epilog=EPILOG,
        no_args_is_help=True,
        add_completion=False,
        # Plain help: ASCII only (a serial console may not show box drawing), and about
        # 2.5x quicker to print than rich's, which `mp --help` would otherwise import.
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
        pretty_exceptions_show_locals=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(root)
    for name, (module, attr, group) in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(import_module(module), attr)
        if group:
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def command_name(args: list[str]) -> str | None:
    """The command word of `args` if it names a known command, else None (build everything)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUE_OPTIONS:
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


_debug = False


def _version(value: bool) -> None:
    if value:
        from appliance import __version__

        sys.stdout.write(f"mp {__version__}\n")
        raise typer.Exit()


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
    """The `mp` console script: run the app; every failure is one line on stderr and an exit code.

    Typer runs in non-standalone mode so that its usage errors too become one
    line (`mp: No such option: --nmae (try: mp flow create --help)`, exit 2)
    rather than a framed block, which a serial console or a log reads badly.
    """
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    _fastparams.install()
    completing = bool(os.environ.get("_MP_COMPLETE"))
    if completing:  # a shell asks for completions (mp completion bash|zsh|fish)
        from typer.completion import completion_init  # type: ignore[attr-defined]

        completion_init()  # add_completion=False leaves Typer's shell classes unregistered
    args = sys.argv[1:] if argv is None else argv
    try:
        app = build_app(None if completing else command_name(args))
        code = _complete(app, args) if completing else app(args=args, prog_name="mp", standalone_mode=False)
    except NoArgsIsHelpError as err:  # `mp` or `mp flow` alone: Typer printed the help when it made err
        raise SystemExit(err.exit_code) from None
    except ClickException as err:  # Typer's usage errors: bad option, missing argument...
        ctx = getattr(err, "ctx", None)
        where = ctx.command_path if ctx is not None else "mp"
        text = " ".join(line.strip() for line in err.format_message().splitlines())  # "Choose from:\n\tbash,..."
        _fail(f"mp: {text} (try: {where} --help)", err.exit_code)
    except typer.Abort as err:  # Ctrl-C or end of input at a prompt
        interrupted = isinstance(err.__context__, KeyboardInterrupt)
        _fail("" if interrupted else "mp: aborted", EXIT_INTERRUPTED if interrupted else EXIT_FAILURE)
    except MpError as err:
        if _debug_requested(args):
            raise
        _fail(f"mp: {err}", err.exit_code)
    except KeyboardInterrupt:
        if _debug_requested(args):
            raise
        raise SystemExit(EXIT_INTERRUPTED) from None
    except Exception as exc:  # the CLI's one broad catch: one line, traceback under --debug
        if _debug_requested(args):
            raise
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        _fail(f"mp: internal error: {detail} (rerun with --debug)", EXIT_FAILURE)
    if isinstance(code, int) and code != 0:  # typer.Exit(n) and Ctrl-C (130) come back as a number
        raise SystemExit(code)


def _complete(app: typer.Typer, args: list[str]) -> object:
    """Answer a shell's completion request (it exits); FLOW and OUTPUT values come from the edge."""
    from typer.main import get_command

    from cli.completion import attach

    command = get_command(app)
    attach(command)
    return command.main(args=args, prog_name="mp", standalone_mode=False)


def _fail(text: str, code: int) -> None:
    if text:
        from cli.render import message

        message(text)
    raise SystemExit(code) from None


if __name__ == "__main__":  # pragma: no cover
    main()
