"""The errors `mp` commands raise, each carrying its documented exit code.

`cli.main.main()` is the one place that turns an `MpError` into a single line on
stderr (`mp: <message> (<hint>)`) and a process exit status. Messages are shown
to a field engineer: they never carry a token or a client secret.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_AUTH: Final = 4
EXIT_INTERRUPTED: Final = 130


class MpError(Exception):
    """Base of every expected `mp` failure: one line, an optional hint, an exit code."""

    exit_code: int = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class Failure(MpError):
    """The request failed: the service refused it (400, 409, 500) or could not be reached."""

    exit_code = EXIT_FAILURE


class UsageError(MpError):
    """The command line, a body file or a profile is invalid; nothing was sent."""

    exit_code = EXIT_USAGE


class NotFound(MpError):
    """The named flow, output or route does not exist (HTTP 404)."""

    exit_code = EXIT_NOT_FOUND


class AuthNeeded(MpError):
    """No valid credentials, or credentials without the needed role (HTTP 401/403)."""

    exit_code = EXIT_AUTH


class ServiceUnreachable(Failure):
    """The edge did not answer: refused, timed out, or not speaking HTTP."""
