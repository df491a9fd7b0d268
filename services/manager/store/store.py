"""The manager's store as trio sees it: one object, every operation a coroutine and one transaction.

Theory of operation. SQLAlchemy Core is synchronous, and so are the sqlite3 and
psycopg connections under it. Each public coroutine below hands one synchronous
function (from ``users``, ``sessions``, ``nodes``, ``events``, ``settings``) to
``trio.to_thread.run_sync`` with the store's single ``CapacityLimiter``; the function
runs in one transaction (``engine.run_in_transaction``): committed when it returns,
rolled back when it raises. The limiter bounds the threads, and so the connections in
use, to the pool's size: a burst of requests queues in trio, not in the pool.

Cancellation: a call cancelled while queued on the limiter never runs; a running one
is never abandoned (trio's default), so it commits or rolls back and returns, and the
cancellation lands at the caller's next checkpoint.

Errors: ``Duplicate`` (409) for a unique value taken, ``*NotFound`` (404) for a row the
operation needs, ``StoreFailed`` (500) for anything else the database raised. Rows
come back as the frozen records of ``records``. Times are aware UTC datetimes, and
"now" is the store's injected clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, Final, ParamSpec, TypeVar, Unpack
from uuid import UUID

import sqlalchemy as sa
import trio

from . import events, fleet, nodes, sessions, settings, users
from .engine import create_private_file, create_store_engine, resolve_url, run_in_transaction
from .errors import NodeNotFound
from .migrate import upgrade_to_head
from .records import (
    AiKeyRecord,
    AiProvider,
    AttemptKind,
    CachedConfig,
    DeviceType,
    EventFilter,
    EventPage,
    EventRecord,
    EventSeverity,
    JsonValue,
    NewEvent,
    NewNode,
    NewUser,
    NodeChanges,
    NodeCredentials,
    NodeRecord,
    NodeRuntime,
    SessionRecord,
    UserChanges,
    UserRecord,
)

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_THREADS: Final = {"sqlite": 4, "postgresql": 8}
ALERT_SEVERITIES: Final = (EventSeverity.WARNING, EventSeverity.CRITICAL)


def utc_now() -> datetime:
    """The wall clock, as the store's default clock."""
    return datetime.now(UTC)


class Store:
    """The manager's persistent state, over SQLite or PostgreSQL, for trio code.

    Make one with ``await Store.open(url)`` and close it with ``aclose()`` (or use it
    as an async context manager). Share the one instance: its limiter is what keeps the
    thread and connection count bounded.
    """

    def __init__(self, engine: sa.Engine, *, max_threads: int, clock: Callable[[], datetime] = utc_now) -> None:
        """Wraps an engine made by ``create_store_engine``; prefer ``Store.open``."""
        self._engine = engine
        self._limiter = trio.CapacityLimiter(max_threads)
        # Other processes (mp-manager reset-password) still meet SQLite's busy timeout.
        self._writes_one_at_a_time = trio.Lock() if engine.dialect.name == "sqlite" else None
        self._clock = clock
        self._closed = False

    @classmethod
    async def open(
        cls,
        url: str | sa.URL,
        *,
        max_threads: int | None = None,
        migrate: bool = True,
        clock: Callable[[], datetime] = utc_now,
    ) -> Store:
        """Connects to ``url`` (``sqlite:///…/manager.db`` or ``postgresql://…``) and migrates it to head.

        ``max_threads`` (default 4 for SQLite, 8 for PostgreSQL) bounds both the worker
        threads and the connection pool. A new SQLite file is made readable by its owner
        only: it holds password hashes and ciphertext. Raises ``UnsupportedDatabaseUrl``
        or ``StoreFailed``.
        """
        resolved = resolve_url(url)
        backend = resolved.get_backend_name()
        threads = max_threads or DEFAULT_THREADS[backend]
        if backend == "sqlite" and resolved.database:
            await trio.to_thread.run_sync(create_private_file, Path(resolved.database))
        engine = create_store_engine(resolved, pool_size=threads)
        store = cls(engine, max_threads=threads, clock=clock)
        try:
            if migrate:
                await trio.to_thread.run_sync(upgrade_to_head, engine, limiter=store._limiter)
        except BaseException:
            await store.aclose()
            raise
        return store

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    @property
    def engine(self) -> sa.Engine:
        """The synchronous engine, for tools that run outside trio (export, tests)."""
        return self._engine

    async def aclose(self) -> None:
        """Closes every pooled connection. Operations after this raise ``RuntimeError``."""
        if not self._closed:
            self._closed = True
            await trio.to_thread.run_sync(self._engine.dispose, limiter=self._limiter)

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(
        self,
        write: bool,
        operation: Callable[Concatenate[sa.Connection, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        if self._closed:
            raise RuntimeError("the store is closed")
        if write and self._writes_one_at_a_time is not None:
            # SQLite has one writer at a time. Two of our pooled connections racing for it
            # would leave the loser in SQLite's busy handler, which sleeps in steps of up to
            # 100 ms while holding one of our threads; queueing here costs nothing instead
            # (bench/manager.py: command p50 330 ms at 250 nodes before this).
            async with self._writes_one_at_a_time:
                return await self._in_thread(write, operation, *args, **kwargs)
        return await self._in_thread(write, operation, *args, **kwargs)

    async def _in_thread(
        self,
        write: bool,
        operation: Callable[Concatenate[sa.Connection, P], R],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        return await trio.to_thread.run_sync(
            lambda: run_in_transaction(self._engine, write, operation, *args, **kwargs), limiter=self._limiter
        )

    # --- users (interop 7.1, 13) -------------------------------------------------------

    async def create_user(self, new: NewUser) -> UserRecord:
        """Creates a user. Raises ``Duplicate`` when the username is taken."""
        return await self._run(True, users.create_user, new, self._clock())

    async def create_first_user(self, new: NewUser) -> UserRecord:
        """Creates a user only if there is none yet (``mp-manager setup``); else raises ``UsersExist``."""
        return await self._run(True, users.create_first_user, new, self._clock())

    async def get_user(self, user_id: UUID) -> UserRecord | None:
        """The user, or None."""
        return await self._run(False, users.get_user, user_id)

    async def get_user_by_username(self, username: str) -> UserRecord | None:
        """The user with exactly this username (case-sensitive), or None."""
        return await self._run(False, users.get_user_by_username, username)

    async def list_users(self) -> list[UserRecord]:
        """Every user, oldest first."""
        return await self._run(False, users.list_users)

    async def count_users(self) -> int:
        """How many users exist."""
        return await self._run(False, users.count_users)

    async def update_user(self, user_id: UUID, **changes: Unpack[UserChanges]) -> UserRecord:
        """Changes the given fields only (a partial ``PUT /users/{id}``) and ``updated_at``.

        Raises ``UserNotFound``, or ``Duplicate`` when a new username is taken.
        Changing ``password_hash`` does not revoke sessions: call ``revoke_user_sessions``.
        """
        return await self._run(True, users.update_user, user_id, changes, self._clock())

    async def record_login(self, user_id: UUID) -> None:
        """Sets ``last_login_at`` to now. Raises ``UserNotFound``."""
        await self._run(True, users.record_login, user_id, self._clock())

    async def delete_user(self, user_id: UUID) -> None:
        """Deletes the user with its sessions and AI keys. Raises ``UserNotFound``."""
        await self._run(True, users.delete_user, user_id)

    # --- sessions (interop 7.1, 13) -----------------------------------------------------

    async def create_session(self, user_id: UUID, expires_at: datetime) -> SessionRecord:
        """Records a new session; its ``id`` is the JWT's ``jti``. Raises ``UserNotFound``."""
        return await self._run(True, sessions.create_session, user_id, expires_at, self._clock())

    async def get_session(self, session_id: UUID) -> SessionRecord | None:
        """The session, revoked or not, or None (never issued, or purged after expiry)."""
        return await self._run(False, sessions.get_session, session_id)

    async def get_session_and_user(self, session_id: UUID) -> tuple[SessionRecord, UserRecord | None] | None:
        """The session and its user in one transaction (every authenticated request asks both);
        None when there is no such session."""
        return await self._run(False, _session_and_user, session_id)

    async def revoke_session(self, session_id: UUID) -> bool:
        """Revokes one session (logout). True if it was live; idempotent."""
        return await self._run(True, sessions.revoke_session, session_id, self._clock())

    async def revoke_user_sessions(self, user_id: UUID) -> int:
        """Revokes every live session of a user (``reset-password``, deactivation); how many."""
        return await self._run(True, sessions.revoke_user_sessions, user_id, self._clock())

    async def purge_expired_sessions(self) -> int:
        """Deletes sessions past their expiry, revoked or not; how many."""
        return await self._run(True, sessions.purge_expired_sessions, self._clock())

    # --- authentication attempts (interop 7.1 login limit, interop 6 node lockout) ------

    async def record_attempt(self, kind: AttemptKind, identifier: str, *, succeeded: bool) -> None:
        """Counts one attempt by ``identifier`` (a client IP, a node id or ``token:<8 chars>``)."""
        await self._run(True, sessions.record_attempt, kind, identifier, succeeded, self._clock())

    async def count_recent_attempts(
        self, kind: AttemptKind, identifier: str, *, window: timedelta, failures_only: bool = False
    ) -> int:
        """Attempts by ``identifier`` within ``window`` of now (failures only, if asked)."""
        since = self._clock() - window
        return await self._run(False, sessions.count_attempts, kind, identifier, since, failures_only)

    async def clear_attempts(self, kind: AttemptKind, identifier: str) -> int:
        """Forgets every attempt by ``identifier``; how many."""
        return await self._run(True, sessions.clear_attempts, kind, identifier)

    async def purge_attempts(self, *, older_than: timedelta) -> int:
        """Deletes attempts older than ``older_than``, which no window can see any more; how many."""
        return await self._run(True, sessions.purge_attempts, self._clock() - older_than)

    # --- nodes (interop 6, 7.2) ---------------------------------------------------------

    async def create_node(self, new: NewNode) -> NodeRecord:
        """Registers a node as ``pending`` with the digest of its registration token."""
        return await self._run(True, nodes.create_node, new, self._clock())

    async def get_node(self, node_id: UUID) -> NodeRecord | None:
        """The node, or None."""
        return await self._run(False, nodes.get_node, node_id)

    async def list_nodes(self, device_type: DeviceType | None = None) -> list[NodeRecord]:
        """Every node (of one device type, if given), oldest first."""
        return await self._run(False, nodes.list_nodes, device_type)

    async def update_node(self, node_id: UUID, **changes: Unpack[NodeChanges]) -> NodeRecord:
        """Changes the given metadata fields only (``PUT /nodes/{id}``). Raises ``NodeNotFound``."""
        return await self._run(True, nodes.update_node, node_id, changes, self._clock())

    async def delete_node(self, node_id: UUID) -> None:
        """Deletes the node; its events stay until retention. Raises ``NodeNotFound``."""
        await self._run(True, nodes.delete_node, node_id)

    async def find_node_by_token_digest(self, token_digest: str) -> NodeRecord | None:
        """The node whose unconsumed registration token has this SHA-256 hex digest, or None."""
        return await self._run(False, nodes.find_node_by_token_digest, token_digest)

    async def reset_registration_token(self, node_id: UUID, token_digest: str) -> NodeRecord:
        """Stores a new token digest, sets the node ``pending`` and clears its secrets (interop 7.2)."""
        return await self._run(True, nodes.reset_registration_token, node_id, token_digest, self._clock())

    async def consume_registration_token(self, token_digest: str, secret_ciphertext: str) -> NodeRecord | None:
        """Registers the node holding this token: stores its encrypted secret and consumes the token.

        Atomic: of two sockets racing with one token, one gets the node and the other None.
        None also when the token is unknown, already used, or the node is not ``pending``
        or has expired. The status becomes ``offline`` in the same statement, since reports
        written behind never take a node out of ``pending`` (``record_node_reports``); the hub's
        ``online`` follows with its next batch.
        """
        return await self._run(True, nodes.consume_registration_token, token_digest, secret_ciphertext, self._clock())

    async def get_node_credentials(self, node_id: UUID) -> NodeCredentials | None:
        """The node's encrypted secret(s), status and expiry, for the hub's auth check; or None."""
        return await self._run(False, nodes.get_node_credentials, node_id)

    async def begin_secret_rotation(self, node_id: UUID, new_secret_ciphertext: str) -> None:
        """Stores the next secret beside the current one until the node acks (interop 6 ``rotate_secret``)."""
        await self._run(True, nodes.begin_secret_rotation, node_id, new_secret_ciphertext, self._clock())

    async def finish_secret_rotation(self, node_id: UUID) -> bool:
        """Makes the pending secret the current one; False if none was pending. Raises ``NodeNotFound``."""
        return await self._run(True, nodes.finish_secret_rotation, node_id, self._clock())

    async def update_node_runtime(self, node_id: UUID, **runtime: Unpack[NodeRuntime]) -> None:
        """Sets what the hub learnt (status, last_seen_at, versions, last_health) in one statement.

        ``software_version`` is truncated to 256 chars. Raises ``NodeNotFound``.
        """
        await self._run(True, nodes.update_node_runtime, node_id, runtime)

    async def record_node_reports(self, runtime: Mapping[UUID, Mapping[str, Any]], batch: Sequence[NewEvent]) -> int:
        """What the hub batched (``services.manager.reports``), in one transaction: the runtime
        fields of each node (as ``update_node_runtime``; a node deleted meanwhile is skipped)
        and the events. Returns how many nodes were skipped.

        A ``pending`` node keeps that status whatever the batch says: a report queued before an
        admin reset the node's token (``reset_registration_token``) lands after it."""
        return await self._run(True, _record_node_reports, runtime, list(batch), self._clock())

    async def mark_all_nodes_offline(self) -> int:
        """Sets every ``online``/``degraded``/``error`` node ``offline``: at start, before any node connects."""
        return await self._run(True, nodes.mark_all_nodes_offline)

    async def cache_node_config(self, node_id: UUID, config_json: str | None) -> None:
        """Caches a ``config_response`` as received (text), or drops the cache (None)."""
        await self._run(True, nodes.cache_node_config, node_id, config_json, self._clock())

    async def get_cached_config(self, node_id: UUID) -> CachedConfig | None:
        """The cached config text and when it arrived, or None."""
        return await self._run(False, nodes.get_cached_config, node_id)

    # --- events (interop 6, 7.3) --------------------------------------------------------

    async def add_event(self, new: NewEvent) -> EventRecord:
        """Stores an event (message truncated to 10 000 chars, category and flow id to 256)."""
        return await self._run(True, events.add_event, new, self._clock())

    async def add_events(self, batch: Sequence[NewEvent]) -> int:
        """Stores several events in one transaction (a node's queue flushed on reconnect)."""
        return await self._run(True, events.add_events, list(batch), self._clock())

    async def query_events(self, where: EventFilter | None = None, *, page: int = 1, per_page: int = 50) -> EventPage:
        """One page of matching events, newest first, and the total that match (``X-Total-Count``).

        ``page`` counts from 1, ``per_page`` 1 to 200 (``ValueError`` otherwise).
        """
        return await self._run(False, events.query_events, where or EventFilter(), page, per_page)

    async def get_event(self, event_id: int) -> EventRecord | None:
        """The event, or None."""
        return await self._run(False, events.get_event, event_id)

    async def acknowledge_event(self, event_id: int, acknowledged_by: str) -> EventRecord:
        """Acknowledges an event; idempotent, the first ack's who and when kept. Raises ``EventNotFound``."""
        return await self._run(True, events.acknowledge_event, event_id, acknowledged_by, self._clock())

    async def count_unacknowledged_events(self) -> dict[EventSeverity, int]:
        """Unacknowledged events per severity, every severity present."""
        return await self._run(False, events.count_unacknowledged)

    async def count_unacknowledged_alerts(self) -> int:
        """``GET /events/count``: unacknowledged ``warning`` and ``critical`` events (interop 7.3)."""
        counts = await self.count_unacknowledged_events()
        return sum(counts[severity] for severity in ALERT_SEVERITIES)

    async def delete_events_older_than(self, age: timedelta) -> int:
        """The daily retention job: deletes events created more than ``age`` ago; how many."""
        return await self._run(True, events.delete_events_before, self._clock() - age)

    async def retention_pass(self, events_age: timedelta, attempts_age: timedelta) -> tuple[int, int, int] | None:
        """The daily retention job in one transaction: (events, sessions, attempts) deleted.

        On PostgreSQL the pass first takes an advisory transaction lock, so that of several
        instances on one database exactly one runs it at a time; None when another holds it."""
        return await self._run(True, _retention_pass, self._clock(), events_age, attempts_age)

    # --- the fleet (several instances on one PostgreSQL; docs/manager.md "A fleet") ------

    async def fleet_register(self, instance_id: UUID, name: str) -> None:
        await self._run(True, fleet.register_instance, instance_id, name, self._clock())

    async def fleet_remove(self, instance_id: UUID) -> None:
        await self._run(True, fleet.remove_instance, instance_id)

    async def fleet_beat(
        self, instance_id: UUID, live_body: str, *, lease: timedelta, fresh: timedelta
    ) -> list[tuple[UUID, str]]:
        return await self._run(True, fleet.beat, instance_id, live_body, self._clock(), lease, fresh)

    async def fleet_claim(self, node_id: UUID, instance_id: UUID, *, lease: timedelta) -> None:
        await self._run(True, fleet.claim_node, node_id, instance_id, self._clock(), lease)

    async def fleet_release(self, node_id: UUID, instance_id: UUID) -> bool:
        return await self._run(True, fleet.release_node, node_id, instance_id)

    async def fleet_holder(self, node_id: UUID) -> UUID | None:
        return await self._run(False, fleet.holder_of, node_id, self._clock())

    async def fleet_send(self, sender: UUID, target: UUID | None, kind: str, body: str) -> int:
        return await self._run(True, fleet.send_message, sender, target, kind, body, self._clock())

    async def fleet_take(self, instance_id: UUID, *, limit: int = 200) -> list[fleet.FleetMessage]:
        return await self._run(True, fleet.take_messages, instance_id, limit)

    async def fleet_broadcasts(self, since: datetime, exclude: Sequence[int]) -> list[fleet.FleetMessage]:
        return await self._run(False, fleet.broadcasts_since, since, list(exclude))

    async def fleet_sweep(self, *, message_age: timedelta, instance_age: timedelta) -> list[UUID]:
        return await self._run(True, fleet.sweep, self._clock(), message_age=message_age, instance_age=instance_age)

    async def fleet_mark_orphans_offline(self) -> int:
        return await self._run(True, fleet.mark_orphans_offline, self._clock())

    def now(self) -> datetime:
        """The store's clock (aware UTC)."""
        return self._clock()

    # --- settings (interop 7.5) and AI keys (interop 7.6) -------------------------------

    async def get_settings(self) -> dict[str, JsonValue]:
        """Every stored setting (defaults are not filled in here)."""
        return await self._run(False, settings.get_settings)

    async def put_settings(self, values: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
        """Sets several settings in one transaction and returns every stored setting.

        A None value is a ``ValueError`` (interop 13: leave the key out instead).
        """
        return await self._run(True, settings.put_settings, dict(values), self._clock())

    async def put_ai_key(
        self, user_id: UUID, provider: AiProvider, api_key_ciphertext: str, *, model_preference: str | None = None
    ) -> AiKeyRecord:
        """Stores (or replaces) a user's encrypted key for a provider. Raises ``UserNotFound``."""
        return await self._run(
            True, settings.put_ai_key, user_id, provider, api_key_ciphertext, model_preference, self._clock()
        )

    async def get_ai_key(self, user_id: UUID, provider: AiProvider) -> AiKeyRecord | None:
        """The user's key record for the provider, or None."""
        return await self._run(False, settings.get_ai_key, user_id, provider)

    async def list_ai_keys(self, user_id: UUID) -> list[AiKeyRecord]:
        """The user's key records, by provider."""
        return await self._run(False, settings.list_ai_keys, user_id)

    async def delete_ai_key(self, user_id: UUID, provider: AiProvider) -> None:
        """Deletes the user's key for the provider. Raises ``AiKeyNotFound``."""
        await self._run(True, settings.delete_ai_key, user_id, provider)


# Any constant both sides agree on: the key of the retention job's advisory lock.
RETENTION_LOCK_KEY: Final = 0x6D70_7265_7465  # "mprete"


def _retention_pass(
    conn: sa.Connection, now: datetime, events_age: timedelta, attempts_age: timedelta
) -> tuple[int, int, int] | None:
    if conn.dialect.name == "postgresql" and not fleet.try_advisory_xact_lock(conn, RETENTION_LOCK_KEY):
        return None
    return (
        events.delete_events_before(conn, now - events_age),
        sessions.purge_expired_sessions(conn, now),
        sessions.purge_attempts(conn, now - attempts_age),
    )


def _record_node_reports(
    conn: sa.Connection, runtime: Mapping[UUID, Mapping[str, Any]], batch: Sequence[NewEvent], now: datetime
) -> int:
    skipped = 0
    for node_id, fields in runtime.items():
        try:
            nodes.update_node_runtime(conn, node_id, fields, keep_pending=True)
        except NodeNotFound:
            skipped += 1
    events.add_events(conn, batch, now)
    return skipped


def _session_and_user(conn: sa.Connection, session_id: UUID) -> tuple[SessionRecord, UserRecord | None] | None:
    session = sessions.get_session(conn, session_id)
    if session is None:
        return None
    return session, users.get_user(conn, session.user_id)
