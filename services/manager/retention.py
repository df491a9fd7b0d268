"""The manager's daily retention job (interop.md 7.3, 7.5).

Once a day, and once shortly after start, :func:`run_retention` deletes the events older than
``events_retention_days`` (read live, so a lowered value applies at the next run), the
sessions past their expiry (revoked or not: an expired JWT fails its own ``exp`` check), and
the authentication attempts older than :data:`ATTEMPTS_KEPT`, which no rate-limit window can
see any more. The store's clock anchors every age, so a test injects the clock instead of
waiting a day.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import trio

from appliance import errors
from services.manager.service import RuntimeSettings
from services.manager.store import Store

__all__ = [
    "ATTEMPTS_KEPT",
    "FIRST_RUN_DELAY_S",
    "RETENTION_INTERVAL_S",
    "RetentionResult",
    "retention_loop",
    "run_retention",
]

RETENTION_INTERVAL_S: Final = 24 * 3600.0
FIRST_RUN_DELAY_S: Final = 60.0
"""The first run waits a minute, so a start is not slowed by a large delete."""
ATTEMPTS_KEPT: Final = dt.timedelta(days=1)
"""Login attempts are counted over 60 s (interop.md 7.1); a day covers every window with room."""

_log = logging.getLogger("mediaplane.manager")


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """How many rows one run deleted."""

    events: int
    sessions: int
    attempts: int


async def run_retention(store: Store, settings: Callable[[], Awaitable[RuntimeSettings]]) -> RetentionResult | None:
    """One run of the job; ``settings`` is read now (``ManagerService.runtime_settings``).

    None when another instance on the same PostgreSQL is running it (an advisory lock)."""
    current = await settings()
    counts = await store.retention_pass(current.events_retention, ATTEMPTS_KEPT)
    if counts is None:
        # Several instances on one PostgreSQL: another one holds the job's advisory lock and is
        # running it now (docs/manager.md "A fleet"); this run is not needed.
        _log.info("retention: another manager instance is running the job")
        return None
    deleted = RetentionResult(events=counts[0], sessions=counts[1], attempts=counts[2])
    _log.info(
        "retention: deleted %d event(s) older than %d day(s), %d expired session(s), %d old login attempt(s)",
        deleted.events,
        current.events_retention_days,
        deleted.sessions,
        deleted.attempts,
    )
    return deleted


async def retention_loop(
    store: Store,
    settings: Callable[[], Awaitable[RuntimeSettings]],
    *,
    first_delay_s: float = FIRST_RUN_DELAY_S,
    interval_s: float = RETENTION_INTERVAL_S,
) -> None:
    """Runs the job after ``first_delay_s`` and then every ``interval_s``, until cancelled.

    A failed run (the database unreachable) is logged and retried at the next interval.
    """
    await trio.sleep(first_delay_s)
    while True:
        try:
            await run_retention(store, settings)
        except errors.ApplianceError as exc:
            _log.error("retention: the run failed: %s", exc.message)
        await trio.sleep(interval_s)
