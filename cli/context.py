"""What every command shares: the global options, the client, prompts and confirmation."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import typer

from cli.errors import UsageError

if TYPE_CHECKING:
    from cli.client import EdgeClient
    from cli.settings import Flags, Settings

Format = Literal["table", "json", "yaml"]

# Every read command takes these two.
FormatOption = Annotated[
    Optional[Format],  # noqa: UP045 - Typer reads the annotation at runtime
    typer.Option(
        "-o", "--format", help="Output format: table (default on a terminal), json (default when piped) or yaml."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Same as -o json.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


@dataclass
class State:
    flags: Flags
    debug: bool = False
    _settings: Settings | None = None
    _client: EdgeClient | None = field(default=None, repr=False)

    def settings(self) -> Settings:
        if self._settings is None:
            from cli.settings import resolve

            self._settings = resolve(self.flags, os.environ)
        return self._settings

    def client(self) -> EdgeClient:
        if self._client is None:
            from cli.client import EdgeClient

            self._client = EdgeClient(self.settings())
        return self._client


def state(ctx: typer.Context) -> State:
    obj = ctx.find_root().obj
    if not isinstance(obj, State):  # a command invoked without the root callback (tests)
        from cli.settings import Flags

        obj = State(Flags())
        ctx.find_root().obj = obj
    return obj


def interactive() -> bool:
    """True when a person can answer a prompt: stdin and stderr are terminals."""
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def confirm(question: str, yes: bool) -> None:
    """Ask on a terminal unless --yes; never prompt without a terminal (scripts proceed)."""
    if yes or not interactive():
        return
    if not typer.confirm(question, default=False, err=True):
        raise typer.Exit(1)


def prompt(text: str, default: str | None = None, hide: bool = False) -> str:
    value = typer.prompt(text, default=default, hide_input=hide, err=True, show_default=bool(default))
    return str(value).strip()


def read_body(path: str) -> Any:
    """JSON from a file, or from stdin for `-`. Raises UsageError with the position of a syntax error."""
    import json

    try:
        if path == "-":
            text = sys.stdin.read()
            where = "stdin"
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            where = path
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    if path != "-" and path.endswith((".yaml", ".yml")):
        import yaml  # type: ignore[import-untyped]

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{where} is not valid YAML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
