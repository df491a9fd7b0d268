"""The daily retention job (interop.md 7.3, 7.5), run directly on a store with an injected clock."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import trio

from services.manager.retention import ATTEMPTS_KEPT, retention_loop, run_retention
from services.manager.service import RuntimeSettings
from services.manager.store import AttemptKind, EventSeverity, NewEvent, NewUser, Role, Store, StoreFailed, sqlite_url

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def event(age: dt.timedelta, message: str) -> NewEvent:
    return NewEvent(node_id=None, severity=EventSeverity.INFO, category="test", message=message, created_at=NOW - age)


async def test_run_deletes_old_events_expired_sessions_and_old_attempts(tmp_path: Path) -> None:
    clock = Clock(NOW - dt.timedelta(days=3))
    async with await Store.open(sqlite_url(tmp_path), clock=clock) as store:
        user = await store.create_user(NewUser(username="u", password_hash="x", role=Role.VIEWER))
        await store.record_attempt(AttemptKind.LOGIN, "10.0.0.1", succeeded=False)  # 3 days old
        expired = await store.create_session(user.id, NOW - dt.timedelta(hours=1))
        clock.now = NOW
        live = await store.create_session(user.id, NOW + dt.timedelta(hours=1))
        await store.record_attempt(AttemptKind.LOGIN, "10.0.0.1", succeeded=True)  # now
        await store.add_events(
            [
                event(dt.timedelta(days=31), "too old"),
                event(dt.timedelta(days=29, hours=23), "kept: inside 30 days"),
                event(dt.timedelta(days=8), "kept until the setting is lowered"),
                event(dt.timedelta(0), "new"),
            ]
        )

        async def defaults() -> RuntimeSettings:
            return RuntimeSettings()

        result = await run_retention(store, defaults)
        assert result is not None
        assert (result.events, result.sessions, result.attempts) == (1, 1, 1)
        left = {row.message for row in (await store.query_events()).rows}
        assert left == {"kept: inside 30 days", "kept until the setting is lowered", "new"}
        assert await store.get_session(expired.id) is None
        assert await store.get_session(live.id) is not None
        assert await store.count_recent_attempts(AttemptKind.LOGIN, "10.0.0.1", window=ATTEMPTS_KEPT) == 1

        # The setting is read at each run: lowered to 7 days, the next run applies it.
        await store.put_settings({"events_retention_days": 7})

        async def stored() -> RuntimeSettings:
            return RuntimeSettings.from_stored(await store.get_settings())

        result = await run_retention(store, stored)
        assert result is not None
        assert (result.events, result.sessions, result.attempts) == (2, 0, 0)
        assert [row.message for row in (await store.query_events()).rows] == ["new"]


async def test_the_loop_runs_after_its_first_delay_and_survives_a_failed_run(tmp_path: Path) -> None:
    async with await Store.open(sqlite_url(tmp_path)) as store:
        await store.add_event(
            NewEvent(
                node_id=None,
                severity=EventSeverity.WARNING,
                category="test",
                message="old",
                created_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=400),
            )
        )
        calls = 0

        async def settings() -> RuntimeSettings:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise StoreFailed("the database is locked")
            return RuntimeSettings()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: retention_loop(store, settings, first_delay_s=0, interval_s=0.05))
            with trio.fail_after(10):
                while (await store.query_events()).total:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
        assert calls >= 2
