"""Sessions, revocations (surviving a restart) and the counted authentication attempts."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from services.manager.store import AttemptKind, NewUser, Role, Store, UserNotFound
from tests.manager.store.conftest import START, FakeClock

DAY = timedelta(hours=24)


async def make_user(store: Store, username: str = "alice") -> uuid.UUID:
    user = await store.create_user(NewUser(username=username, password_hash="$argon2id$x", role=Role.VIEWER))
    return user.id


async def test_create_get_and_revoke_a_session(store: Store, clock: FakeClock) -> None:
    user_id = await make_user(store)
    session = await store.create_session(user_id, START + DAY)
    assert session.user_id == user_id
    assert session.created_at == START and session.expires_at == START + DAY
    assert session.is_valid_at(START)
    assert await store.get_session(session.id) == session

    now = clock.advance(timedelta(minutes=3))
    assert await store.revoke_session(session.id) is True
    assert await store.revoke_session(session.id) is False  # idempotent, first revocation kept
    revoked = await store.get_session(session.id)
    assert revoked is not None and revoked.revoked_at == now
    assert not revoked.is_valid_at(now)

    assert await store.get_session(uuid.uuid4()) is None
    assert await store.revoke_session(uuid.uuid4()) is False


async def test_a_session_for_an_unknown_user_is_user_not_found(store: Store) -> None:
    with pytest.raises(UserNotFound):
        await store.create_session(uuid.uuid4(), START + DAY)


async def test_revoke_every_session_of_one_user(store: Store) -> None:
    alice, bob = await make_user(store), await make_user(store, "bob")
    alice_sessions = [await store.create_session(alice, START + DAY) for _ in range(3)]
    bob_session = await store.create_session(bob, START + DAY)
    await store.revoke_session(alice_sessions[0].id)

    assert await store.revoke_user_sessions(alice) == 2  # the one already revoked is not counted

    for session in alice_sessions:
        assert (await store.get_session(session.id)).revoked_at is not None  # type: ignore[union-attr]
    assert (await store.get_session(bob_session.id)).revoked_at is None  # type: ignore[union-attr]


async def test_purge_removes_only_expired_sessions(store: Store, clock: FakeClock) -> None:
    user_id = await make_user(store)
    short = await store.create_session(user_id, START + timedelta(hours=1))
    short_revoked = await store.create_session(user_id, START + timedelta(hours=1))
    await store.revoke_session(short_revoked.id)
    long = await store.create_session(user_id, START + DAY)

    clock.advance(timedelta(hours=2))
    assert await store.purge_expired_sessions() == 2

    assert await store.get_session(short.id) is None
    assert await store.get_session(short_revoked.id) is None
    assert await store.get_session(long.id) is not None


async def test_a_restart_keeps_sessions_and_revocations(store_url: str, clock: FakeClock) -> None:
    async with await Store.open(store_url, clock=clock) as first:
        user_id = await make_user(first)
        live = await first.create_session(user_id, START + DAY)
        revoked = await first.create_session(user_id, START + DAY)
        await first.revoke_session(revoked.id)

    async with await Store.open(store_url, clock=clock) as second:
        live_again = await second.get_session(live.id)
        revoked_again = await second.get_session(revoked.id)
    assert live_again == live and live_again.is_valid_at(START)
    assert revoked_again is not None and revoked_again.revoked_at == START
    assert not revoked_again.is_valid_at(START)


async def test_login_attempts_count_within_the_window(store: Store, clock: FakeClock) -> None:
    ip = "192.0.2.7"
    for succeeded in (True, False, False):
        await store.record_attempt(AttemptKind.LOGIN, ip, succeeded=succeeded)
        clock.advance(timedelta(seconds=20))
    # now = START + 60 s: the attempts were at +0, +20 and +40 s.
    assert await store.count_recent_attempts(AttemptKind.LOGIN, ip, window=timedelta(seconds=60)) == 3
    assert await store.count_recent_attempts(AttemptKind.LOGIN, ip, window=timedelta(seconds=59)) == 2
    assert (
        await store.count_recent_attempts(AttemptKind.LOGIN, ip, window=timedelta(seconds=60), failures_only=True) == 2
    )
    # Another identifier, or the same text under another kind, counts apart.
    assert await store.count_recent_attempts(AttemptKind.LOGIN, "192.0.2.8", window=timedelta(hours=1)) == 0
    assert await store.count_recent_attempts(AttemptKind.NODE_AUTH, ip, window=timedelta(hours=1)) == 0


async def test_login_attempts_clear_and_purge(store: Store, clock: FakeClock) -> None:
    await store.record_attempt(AttemptKind.NODE_AUTH, "token:7c9e1a2b", succeeded=False)
    await store.record_attempt(AttemptKind.NODE_AUTH, "token:7c9e1a2b", succeeded=False)
    await store.record_attempt(AttemptKind.LOGIN, "192.0.2.7", succeeded=False)
    assert await store.clear_attempts(AttemptKind.NODE_AUTH, "token:7c9e1a2b") == 2
    assert await store.count_recent_attempts(AttemptKind.NODE_AUTH, "token:7c9e1a2b", window=DAY) == 0

    clock.advance(timedelta(minutes=10))
    await store.record_attempt(AttemptKind.LOGIN, "192.0.2.7", succeeded=True)
    assert await store.purge_attempts(older_than=timedelta(minutes=5)) == 1
    assert await store.count_recent_attempts(AttemptKind.LOGIN, "192.0.2.7", window=DAY) == 1
