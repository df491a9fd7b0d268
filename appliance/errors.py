"""The error kinds every Mediaplane service raises.

Services raise these kinds, never HTTP status codes; exactly one place
(`appliance.http.envelope`) maps a kind to a status and a response body, so the
REST routes, the manager protocol and the CLI agree. Messages are user-facing
and must never carry a secret.
"""

from __future__ import annotations


class ApplianceError(Exception):
    """Base of every expected, user-facing error. ``message`` never holds a secret."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ApplianceError):
    """The request or file is invalid (HTTP 400)."""


class AuthRequired(ApplianceError):
    """No valid credentials were presented (HTTP 401)."""


class NotAllowed(ApplianceError):
    """Valid credentials without the needed role, or a disabled feature (HTTP 403)."""


class NotFound(ApplianceError):
    """The named resource does not exist (HTTP 404)."""


class Conflict(ApplianceError):
    """The resource exists already, or is in the wrong state (HTTP 409)."""


class PayloadTooLarge(ApplianceError):
    """The request body exceeds the size limit (HTTP 413)."""


class UnsupportedMediaType(ApplianceError):
    """The request body has a content type the route does not take (HTTP 415)."""


class Unprocessable(ApplianceError):
    """Well-formed, but the target refused it, e.g. a node answered ``success:false`` (HTTP 422)."""


class BadGateway(ApplianceError):
    """An upstream peer (a node) is not connected, or went away before answering (HTTP 502)."""


class ServiceUnavailable(ApplianceError):
    """A part of the service is restarting or at its limit; try again later (HTTP 503)."""


class GatewayTimeout(ApplianceError):
    """An upstream peer (a node) did not answer in time (HTTP 504)."""


class RateLimited(ApplianceError):
    """Too many requests from one client (HTTP 429)."""


class Internal(ApplianceError):
    """The service failed: persisting, the engine, signing (HTTP 500)."""


class PersistFailed(Internal):
    """Writing a configuration file failed; the in-memory state was not changed."""


class ConfigFileError(ApplianceError):
    """A configuration file cannot be read or validated at start (exit status 2)."""
