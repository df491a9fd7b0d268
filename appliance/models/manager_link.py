"""The state of a node's link to its manager, as ``GET /api/v1/manager`` and ``mp manager status`` show it.

Beyond the interface documents (issue 14): the edge serves it in the envelope, to any role. The
relay's link reports the same model. Nothing here is a secret: the registration token and the
node secret never appear, only whether the node holds them.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

__all__ = ["LinkState", "ManagerLinkStatus"]


class LinkState(StrEnum):
    """Where the link is now."""

    DISABLED = "disabled"
    """``manager.enabled`` is false (or no URL): the node does not connect."""
    CONNECTING = "connecting"
    """Opening TCP, TLS and the WebSocket."""
    REGISTERING = "registering"
    """``auth`` sent with the registration token; waiting for ``register_ack``."""
    AUTHENTICATING = "authenticating"
    """``auth`` sent with the node id and secret; waiting for ``auth_ok``."""
    CONNECTED = "connected"
    """Authenticated: stats, health and events flow, commands are obeyed."""
    WAITING = "waiting"
    """The last attempt failed or the connection was lost; the next attempt is due in
    ``next_attempt_in_secs`` (exponential backoff 1 → 60 s, interop.md 6)."""


class ManagerLinkStatus(BaseModel):
    """One look at the link (``data`` of ``GET /api/v1/manager``)."""

    model_config = ConfigDict(frozen=True)

    enabled: bool
    state: LinkState
    manager_url: str | None
    node_id: str | None
    """The id the manager gave at registration; null until then."""
    registered: bool
    """Whether the node holds a node id and secret (else it registers with its token)."""
    has_registration_token: bool
    connected_since: datetime | None
    """When the current connection authenticated; null unless ``state`` is ``connected``."""
    last_error: str | None
    """Why the last attempt failed or the last connection ended (never a secret)."""
    last_error_at: datetime | None
    next_attempt_in_secs: float | None
    """Seconds until the next attempt while ``waiting``; else null."""
    events_queued: int
    """Events waiting to reach the manager (at most 1,000; the oldest are dropped beyond)."""
    events_dropped: int
    """Events dropped because the queue was full, since the node started."""
