"""Settings (put many in one transaction) and per-user AI provider keys (upsert, list, delete)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from services.manager.store import AiKeyNotFound, AiProvider, JsonValue, NewUser, Role, Store, UserNotFound
from tests.manager.store.conftest import START, FakeClock


async def test_settings_start_empty_and_put_many_at_once(store: Store) -> None:
    assert await store.get_settings() == {}
    after = await store.put_settings({"events_retention_days": 30, "session_lifetime_hours": 24})
    assert after == {"events_retention_days": 30, "session_lifetime_hours": 24}
    after = await store.put_settings({"events_retention_days": 7, "max_login_attempts": 5})
    assert after == {"events_retention_days": 7, "session_lifetime_hours": 24, "max_login_attempts": 5}
    assert await store.get_settings() == after
    assert await store.put_settings({}) == after


async def test_settings_keep_json_values(store: Store) -> None:
    values: dict[str, JsonValue] = {
        "a_list": [1, "two", None],
        "an_object": {"nested": True},
        "a_float": 0.5,
        "a_string": "x",
    }
    assert await store.put_settings(values) == values


async def test_a_null_setting_writes_nothing(store: Store) -> None:
    await store.put_settings({"events_retention_days": 30})
    with pytest.raises(ValueError):
        await store.put_settings({"max_login_attempts": 9, "events_retention_days": None})
    assert await store.get_settings() == {"events_retention_days": 30}


async def make_user(store: Store, username: str = "alice") -> uuid.UUID:
    return (await store.create_user(NewUser(username=username, password_hash="h", role=Role.OPERATOR))).id


async def test_put_get_list_delete_ai_keys(store: Store) -> None:
    user_id = await make_user(store)
    stored = await store.put_ai_key(user_id, AiProvider.OPENAI, "CIPHERTEXT-1", model_preference="gpt-4.1")
    assert stored.user_id == user_id and stored.provider is AiProvider.OPENAI
    assert stored.api_key_ciphertext == "CIPHERTEXT-1" and stored.model_preference == "gpt-4.1"
    assert stored.created_at == stored.updated_at == START
    assert "CIPHERTEXT-1" not in repr(stored)
    await store.put_ai_key(user_id, AiProvider.ANTHROPIC, "CIPHERTEXT-2")

    assert await store.get_ai_key(user_id, AiProvider.OPENAI) == stored
    assert await store.get_ai_key(user_id, AiProvider.GEMINI) is None
    assert [key.provider for key in await store.list_ai_keys(user_id)] == [AiProvider.ANTHROPIC, AiProvider.OPENAI]

    await store.delete_ai_key(user_id, AiProvider.OPENAI)
    assert await store.get_ai_key(user_id, AiProvider.OPENAI) is None
    with pytest.raises(AiKeyNotFound):
        await store.delete_ai_key(user_id, AiProvider.OPENAI)


async def test_putting_a_key_again_replaces_it(store: Store, clock: FakeClock) -> None:
    user_id = await make_user(store)
    first = await store.put_ai_key(user_id, AiProvider.GEMINI, "old", model_preference="gemini-2.0-flash")
    later = clock.advance(timedelta(minutes=1))
    second = await store.put_ai_key(user_id, AiProvider.GEMINI, "new")
    assert second.id == first.id and second.created_at == START and second.updated_at == later
    assert second.api_key_ciphertext == "new" and second.model_preference is None
    assert len(await store.list_ai_keys(user_id)) == 1


async def test_keys_are_per_user(store: Store) -> None:
    alice, bob = await make_user(store), await make_user(store, "bob")
    await store.put_ai_key(alice, AiProvider.OPENAI, "alice-key")
    await store.put_ai_key(bob, AiProvider.OPENAI, "bob-key")
    assert (await store.get_ai_key(alice, AiProvider.OPENAI)).api_key_ciphertext == "alice-key"  # type: ignore[union-attr]
    assert (await store.get_ai_key(bob, AiProvider.OPENAI)).api_key_ciphertext == "bob-key"  # type: ignore[union-attr]


async def test_a_key_for_an_unknown_user_is_user_not_found(store: Store) -> None:
    with pytest.raises(UserNotFound):
        await store.put_ai_key(uuid.uuid4(), AiProvider.OPENAI, "x")
