"""The store's errors: the shared kinds (appliance.errors), so routes map them without knowing SQL.

Database exceptions are translated once, at the store's boundary (style H6), and
chained with ``from``. No message quotes a value: a PostgreSQL error detail such as
``Key (username)=(…)`` never reaches a response or a log line through these.
"""

from __future__ import annotations

from uuid import UUID

from appliance.errors import ConfigFileError, Conflict, Internal, NotFound


class StoreFailed(Internal):
    """The database failed (unreachable, locked for too long, a bug in a statement): HTTP 500."""


class UnsupportedDatabaseUrl(ConfigFileError):
    """The database URL names neither SQLite nor PostgreSQL (exit status 2 at start)."""


class Duplicate(Conflict):
    """A unique column already holds the value (HTTP 409)."""


class UserNotFound(NotFound):
    def __init__(self, user_id: UUID) -> None:
        super().__init__(f"user '{user_id}' not found")


class NodeNotFound(NotFound):
    def __init__(self, node_id: UUID) -> None:
        super().__init__(f"node '{node_id}' not found")


class EventNotFound(NotFound):
    def __init__(self, event_id: int) -> None:
        super().__init__(f"event {event_id} not found")


class AiKeyNotFound(NotFound):
    def __init__(self, provider: str) -> None:
        super().__init__(f"no {provider} API key stored")
