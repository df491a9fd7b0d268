"""Users: create, read, partial update, delete (with cascades), uniqueness as ``Duplicate``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from services.manager.store import (
    AiProvider,
    Duplicate,
    NewUser,
    Role,
    StoreFailed,
    UserNotFound,
    UsersExist,
)
from services.manager.store.store import Store
from tests.manager.store.conftest import START, FakeClock

HASH = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"


def alice(**overrides: object) -> NewUser:
    fields: dict[str, object] = {"username": "alice", "password_hash": HASH, "role": Role.ADMIN}
    fields.update(overrides)
    return NewUser(**fields)  # type: ignore[arg-type]


async def test_create_then_read_back_every_field(store: Store) -> None:
    node_ids = (uuid.uuid4(), uuid.uuid4())
    expires = START + timedelta(days=7)
    created = await store.create_user(
        alice(
            display_name="Alice A.",
            email="alice@example.org",
            allowed_node_ids=node_ids,
            is_temporary=True,
            expires_at=expires,
        )
    )
    assert created.username == "alice"
    assert created.role is Role.ADMIN
    assert created.password_hash == HASH
    assert created.allowed_node_ids == node_ids
    assert created.is_active and created.is_temporary
    assert created.expires_at == expires
    assert created.created_at == created.updated_at == START
    assert created.created_at.tzinfo is UTC
    assert created.last_login_at is None
    assert HASH not in repr(created)

    assert await store.get_user(created.id) == created
    assert await store.get_user_by_username("alice") == created
    assert await store.get_user_by_username("ALICE") is None
    assert await store.get_user(uuid.uuid4()) is None
    assert await store.count_users() == 1


async def test_allowed_node_ids_none_means_all_and_empty_means_none(store: Store) -> None:
    everyone = await store.create_user(alice())
    nobody = await store.create_user(alice(username="bob", allowed_node_ids=()))
    assert (await store.get_user(everyone.id)).allowed_node_ids is None  # type: ignore[union-attr]
    assert (await store.get_user(nobody.id)).allowed_node_ids == ()  # type: ignore[union-attr]


async def test_a_taken_username_is_duplicate_not_an_integrity_error(store: Store) -> None:
    await store.create_user(alice())
    with pytest.raises(Duplicate) as caught:
        await store.create_user(alice(role=Role.VIEWER))
    assert isinstance(caught.value.__cause__, sa.exc.IntegrityError)
    assert "alice" not in caught.value.message  # never echo the rejected value
    assert await store.count_users() == 1

    bob = await store.create_user(alice(username="bob"))
    with pytest.raises(Duplicate):
        await store.update_user(bob.id, username="alice")
    assert (await store.get_user(bob.id)).username == "bob"  # type: ignore[union-attr]


async def test_partial_update_changes_only_the_given_fields(store: Store, clock: FakeClock) -> None:
    user = await store.create_user(alice(display_name="Alice", email="a@example.org"))
    later = clock.advance(timedelta(minutes=5))
    updated = await store.update_user(user.id, role=Role.OPERATOR, email=None, is_active=False)
    assert updated.role is Role.OPERATOR
    assert updated.email is None  # None clears a nullable field ...
    assert updated.display_name == "Alice"  # ... an absent key leaves it alone
    assert updated.is_active is False
    assert updated.updated_at == later and updated.created_at == START
    assert await store.get_user(user.id) == updated

    new_nodes = (uuid.uuid4(),)
    assert (await store.update_user(user.id, allowed_node_ids=new_nodes)).allowed_node_ids == new_nodes
    assert (await store.update_user(user.id, allowed_node_ids=None)).allowed_node_ids is None


async def test_update_refuses_unknown_fields_and_unknown_users(store: Store) -> None:
    user = await store.create_user(alice())
    with pytest.raises(TypeError):
        await store.update_user(user.id, created_at=START)  # type: ignore[call-arg]
    with pytest.raises(UserNotFound):
        await store.update_user(uuid.uuid4(), role=Role.VIEWER)


async def test_record_login(store: Store, clock: FakeClock) -> None:
    user = await store.create_user(alice())
    now = clock.advance(timedelta(hours=1))
    await store.record_login(user.id)
    assert (await store.get_user(user.id)).last_login_at == now  # type: ignore[union-attr]
    with pytest.raises(UserNotFound):
        await store.record_login(uuid.uuid4())


async def test_list_users_oldest_first(store: Store, clock: FakeClock) -> None:
    for name in ("carol", "alice", "bob"):
        await store.create_user(alice(username=name))
        clock.advance(timedelta(seconds=1))
    assert [u.username for u in await store.list_users()] == ["carol", "alice", "bob"]


async def test_delete_takes_the_users_sessions_and_ai_keys_with_it(store: Store) -> None:
    user = await store.create_user(alice())
    other = await store.create_user(alice(username="bob"))
    session = await store.create_session(user.id, START + timedelta(hours=24))
    kept_session = await store.create_session(other.id, START + timedelta(hours=24))
    await store.put_ai_key(user.id, AiProvider.OPENAI, "ciphertext")
    await store.put_ai_key(other.id, AiProvider.OPENAI, "ciphertext")

    await store.delete_user(user.id)

    assert await store.get_user(user.id) is None
    assert await store.get_session(session.id) is None  # foreign keys are on, on SQLite too
    assert await store.list_ai_keys(user.id) == []
    assert await store.get_session(kept_session.id) is not None
    assert len(await store.list_ai_keys(other.id)) == 1
    with pytest.raises(UserNotFound):
        await store.delete_user(user.id)


async def test_create_first_user_only_when_there_is_none(store: Store) -> None:
    first = await store.create_first_user(alice(role=Role.SUPER_ADMIN))
    assert first.role is Role.SUPER_ADMIN
    with pytest.raises(UsersExist):
        await store.create_first_user(alice(username="mallory", role=Role.SUPER_ADMIN))
    assert await store.count_users() == 1


async def test_a_naive_datetime_is_refused(store: Store) -> None:
    with pytest.raises(StoreFailed) as caught:
        await store.create_user(alice(expires_at=datetime(2030, 1, 1)))
    assert "naive" in str(caught.value.__cause__)
    assert await store.count_users() == 0
