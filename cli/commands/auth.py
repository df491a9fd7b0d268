"""`mp auth ...`: log in with client credentials, show the login, log out."""

import os
import sys
from typing import Annotated, Any, Optional

import typer

from cli.context import FormatOption, JsonOption, interactive, prompt, state
from cli.errors import AuthNeeded, UsageError
from cli.render import emit, message, resolve_format

app = typer.Typer(help="Log in to the edge (OAuth client credentials).", no_args_is_help=True, rich_markup_mode=None)


@app.command("login")
def login(
    ctx: typer.Context,
    client_id: Annotated[Optional[str], typer.Option("--client-id", help="OAuth client id.")] = None,  # noqa: UP045
    secret_stdin: Annotated[
        bool, typer.Option("--client-secret-stdin", help="Read the client secret from stdin (for scripts).")
    ] = False,
) -> None:
    """Exchange client credentials for a token and keep both for this edge URL.

    The token is cached at mode 0600 in ~/.config/mp/tokens.json and renewed
    when it expires, so later commands need no credentials. The id and secret
    also come from --client-id/--client-secret before the command,
    MEDIAPLANE_CLIENT_ID/MEDIAPLANE_CLIENT_SECRET or the profile; a terminal is
    asked for what is missing (the secret is not echoed).

    Example: mp auth login --client-id ops
    """
    st = state(ctx)
    settings = st.settings()
    cid = client_id or settings.client_id
    secret = settings.client_secret
    if secret_stdin:
        secret = sys.stdin.readline().rstrip("\r\n")
    if not cid or not secret:
        if not interactive():
            missing = "client id" if not cid else "client secret"
            raise UsageError(
                f"the {missing} is missing", hint="use --client-id and --client-secret-stdin, or MEDIAPLANE_CLIENT_*"
            )
        if not cid:
            cid = prompt("Client id")
        if not secret:
            secret = prompt("Client secret", hide=True)
    token = st.client().login(cid, secret)
    minutes = max(0, int((token.expires_at - _now()) / 60))
    message(f"logged in to {settings.url} as {cid} ({token.role or 'unknown role'}); token valid {minutes} min")


def _now() -> float:
    import time

    return time.time()


def _status_table(data: Any, colour: bool) -> str:
    from cli.render import tree

    return tree(data, colour)


@app.command("status")
def status(ctx: typer.Context, fmt: FormatOption = None, as_json: JsonOption = False) -> None:
    """Show which edge and which credentials mp uses, and whether the edge accepts them.

    Exit 0 when the edge accepts the credentials (or needs none), 4 when it does not.
    Example: mp auth status
    """
    from cli.auth import TokenCache, jwt_claims

    st = state(ctx)
    settings = st.settings()
    client = st.client()
    source = settings.credential_source
    cached = TokenCache(settings.config_dir).get(settings.url)
    if source is None and cached is not None:
        source = "login"
    info: dict[str, Any] = {
        "url": settings.url,
        "profile": settings.profile,
        "credentials": source or "none",
        "client_id": settings.client_id or (cached.client_id if cached and source == "login" else None),
    }
    problem: AuthNeeded | None = None
    try:
        token = client.token
    except AuthNeeded as exc:
        token, problem = None, exc
    claims = jwt_claims(token) if token else {}
    info["role"] = claims.get("role")
    exp = claims.get("exp")
    info["expires_in_secs"] = int(exp - _now()) if isinstance(exp, int | float) else None
    try:
        client.get("/api/v1/flows")
        info["accepted"] = True
    except AuthNeeded as exc:
        info["accepted"] = False
        problem = problem or exc
    info["auth_required"] = None if token else not info["accepted"]
    emit(info, resolve_format(fmt, as_json), _status_table)
    if problem is not None and not info["accepted"]:
        raise problem


@app.command("logout")
def logout(
    ctx: typer.Context,
    all_urls: Annotated[bool, typer.Option("--all", help="Forget the logins of every edge URL.")] = False,
) -> None:
    """Forget the cached token (and credentials) for this edge URL.

    Example: mp auth logout
    """
    from cli.auth import TokenCache

    settings = state(ctx).settings()
    removed = TokenCache(settings.config_dir).remove(None if all_urls else settings.url)
    where = "every edge" if all_urls else settings.url
    message(f"logged out of {where}" if removed else f"no login was cached for {where}")
    if os.environ.get("MEDIAPLANE_TOKEN") or os.environ.get("MEDIAPLANE_CLIENT_SECRET"):
        message("note: MEDIAPLANE_TOKEN or MEDIAPLANE_CLIENT_SECRET is still set in this shell", "yellow")
