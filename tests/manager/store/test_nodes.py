"""Nodes: registration by token digest, credentials and rotation, runtime state, the config cache."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa
import trio

from services.manager.store import (
    DeviceType,
    Duplicate,
    JsonObject,
    NewNode,
    NodeNotFound,
    NodeStatus,
    Store,
)
from services.manager.store.tables import nodes
from tests.manager.store.conftest import START, FakeClock


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_node(token: str = "token-1", **overrides: object) -> NewNode:
    fields: dict[str, object] = {"name": "studio-a", "registration_token_digest": digest(token)}
    fields.update(overrides)
    return NewNode(**fields)  # type: ignore[arg-type]


async def test_create_read_list_and_filter(store: Store, clock: FakeClock) -> None:
    edge = await store.create_node(new_node(description="rack 3", metadata={"site": "paris", "rack": 3}))
    clock.advance(timedelta(seconds=1))
    relay = await store.create_node(new_node("token-2", name="relay-1", device_type=DeviceType.RELAY))

    assert edge.status is NodeStatus.PENDING
    assert edge.device_type is DeviceType.EDGE  # the default (interop 7.2)
    assert edge.description == "rack 3" and edge.metadata == {"site": "paris", "rack": 3}
    assert edge.created_at == edge.updated_at == START
    assert edge.last_seen_at is None and edge.software_version is None and edge.last_health is None
    assert edge.config_cached_at is None
    assert await store.get_node(edge.id) == edge
    assert await store.get_node(uuid.uuid4()) is None

    assert [n.id for n in await store.list_nodes()] == [edge.id, relay.id]
    assert [n.id for n in await store.list_nodes(DeviceType.RELAY)] == [relay.id]
    assert [n.id for n in await store.list_nodes(DeviceType.EDGE)] == [edge.id]


async def test_the_record_carries_no_secret_or_digest(store: Store) -> None:
    node = await store.create_node(new_node())
    assert await store.consume_registration_token(digest("token-1"), "SECRET-CIPHERTEXT") is not None
    fields = repr(await store.get_node(node.id))
    assert "SECRET-CIPHERTEXT" not in fields and digest("token-1") not in fields
    credentials = await store.get_node_credentials(node.id)
    assert credentials is not None and "SECRET-CIPHERTEXT" not in repr(credentials)


async def test_partial_metadata_update(store: Store, clock: FakeClock) -> None:
    node = await store.create_node(new_node(description="old"))
    later = clock.advance(timedelta(minutes=1))
    updated = await store.update_node(node.id, name="studio-b", metadata=None)
    assert updated.name == "studio-b" and updated.metadata is None
    assert updated.description == "old"
    assert updated.updated_at == later
    with pytest.raises(TypeError):
        await store.update_node(node.id, status=NodeStatus.ONLINE)  # type: ignore[call-arg]
    with pytest.raises(NodeNotFound):
        await store.update_node(uuid.uuid4(), name="x")


async def test_delete(store: Store) -> None:
    node = await store.create_node(new_node())
    await store.delete_node(node.id)
    assert await store.get_node(node.id) is None
    assert await store.find_node_by_token_digest(digest("token-1")) is None
    with pytest.raises(NodeNotFound):
        await store.delete_node(node.id)


async def test_the_token_is_stored_as_its_digest_and_looked_up_by_it(store: Store) -> None:
    node = await store.create_node(new_node("7c9e6679-7425-40de-944b-e07fc1f90ae7"))
    with store.engine.connect() as conn:
        stored = conn.execute(sa.select(nodes.c.registration_token_digest)).scalar_one()
    assert stored == digest("7c9e6679-7425-40de-944b-e07fc1f90ae7")
    found = await store.find_node_by_token_digest(stored)
    assert found is not None and found.id == node.id
    assert await store.find_node_by_token_digest(digest("other")) is None


async def test_a_digest_held_by_another_node_is_duplicate(store: Store) -> None:
    await store.create_node(new_node())
    with pytest.raises(Duplicate):
        await store.create_node(new_node(name="other"))
    other = await store.create_node(new_node("token-2"))
    with pytest.raises(Duplicate):
        await store.reset_registration_token(other.id, digest("token-1"))


async def test_consuming_the_token_registers_once(store: Store) -> None:
    node = await store.create_node(new_node())
    registered = await store.consume_registration_token(digest("token-1"), "ciphertext-1")
    assert registered is not None and registered.id == node.id
    assert registered.status is NodeStatus.OFFLINE  # out of pending with the token; the hub's reports say online
    credentials = await store.get_node_credentials(node.id)
    assert credentials is not None
    assert credentials.secret_ciphertext == "ciphertext-1" and credentials.pending_secret_ciphertext is None

    assert await store.consume_registration_token(digest("token-1"), "ciphertext-2") is None  # consumed
    assert await store.find_node_by_token_digest(digest("token-1")) is None
    assert (await store.get_node_credentials(node.id)).secret_ciphertext == "ciphertext-1"  # type: ignore[union-attr]


async def test_racing_registrations_with_one_token_yield_one_node(store: Store) -> None:
    await store.create_node(new_node())
    results: list[object] = []

    async def register(secret: str) -> None:
        results.append(await store.consume_registration_token(digest("token-1"), secret))

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(register, f"ciphertext-{i}")
    assert len(results) == 8
    assert sum(result is not None for result in results) == 1


async def test_an_expired_or_non_pending_node_cannot_register(store: Store, clock: FakeClock) -> None:
    expiring = await store.create_node(new_node(expires_at=START + timedelta(hours=1)))
    clock.advance(timedelta(hours=2))
    assert await store.consume_registration_token(digest("token-1"), "ciphertext") is None
    assert (await store.get_node_credentials(expiring.id)).secret_ciphertext is None  # type: ignore[union-attr]

    online = await store.create_node(new_node("token-2"))
    await store.update_node_runtime(online.id, status=NodeStatus.OFFLINE)
    assert await store.consume_registration_token(digest("token-2"), "ciphertext") is None


async def test_a_new_token_resets_the_node_to_pending_without_secret(store: Store, clock: FakeClock) -> None:
    node = await store.create_node(new_node())
    await store.consume_registration_token(digest("token-1"), "ciphertext")
    await store.update_node_runtime(node.id, status=NodeStatus.ONLINE)
    await store.begin_secret_rotation(node.id, "next-ciphertext")

    later = clock.advance(timedelta(minutes=1))
    reset = await store.reset_registration_token(node.id, digest("token-new"))
    assert reset.status is NodeStatus.PENDING and reset.updated_at == later
    credentials = await store.get_node_credentials(node.id)
    assert credentials is not None
    assert credentials.secret_ciphertext is None and credentials.pending_secret_ciphertext is None
    assert (await store.find_node_by_token_digest(digest("token-new"))).id == node.id  # type: ignore[union-attr]
    with pytest.raises(NodeNotFound):
        await store.reset_registration_token(uuid.uuid4(), digest("x"))


async def test_the_hubs_batch_never_takes_a_node_out_of_pending(store: Store, clock: FakeClock) -> None:
    """A report queued before a new token (services/manager/reports.py) lands after it."""
    node = await store.create_node(new_node())
    await store.consume_registration_token(digest("token-1"), "ciphertext")
    await store.reset_registration_token(node.id, digest("token-new"))
    seen = clock.advance(timedelta(seconds=5))
    await store.record_node_reports({node.id: {"status": NodeStatus.OFFLINE, "last_seen_at": seen}}, [])
    got = await store.get_node(node.id)
    assert got is not None and got.status is NodeStatus.PENDING and got.last_seen_at == seen
    registered = await store.consume_registration_token(digest("token-new"), "ciphertext-2")
    assert registered is not None and registered.status is NodeStatus.OFFLINE
    await store.record_node_reports({node.id: {"status": NodeStatus.ONLINE}}, [])  # not pending: written
    assert (await store.get_node(node.id)).status is NodeStatus.ONLINE  # type: ignore[union-attr]


async def test_secret_rotation_keeps_both_until_the_ack(store: Store) -> None:
    node = await store.create_node(new_node())
    await store.consume_registration_token(digest("token-1"), "old")
    assert await store.finish_secret_rotation(node.id) is False  # nothing pending

    await store.begin_secret_rotation(node.id, "new")
    during = await store.get_node_credentials(node.id)
    assert during is not None and (during.secret_ciphertext, during.pending_secret_ciphertext) == ("old", "new")

    assert await store.finish_secret_rotation(node.id) is True
    after = await store.get_node_credentials(node.id)
    assert after is not None and (after.secret_ciphertext, after.pending_secret_ciphertext) == ("new", None)

    assert await store.get_node_credentials(uuid.uuid4()) is None
    with pytest.raises(NodeNotFound):
        await store.finish_secret_rotation(uuid.uuid4())
    with pytest.raises(NodeNotFound):
        await store.begin_secret_rotation(uuid.uuid4(), "x")


async def test_runtime_state_and_version_truncation(store: Store, clock: FakeClock) -> None:
    node = await store.create_node(new_node())
    seen = clock.advance(timedelta(seconds=30))
    health: JsonObject = {"status": "ok", "version": "0.3.0", "uptime_secs": 12, "active_flows": 1}
    await store.update_node_runtime(
        node.id,
        status=NodeStatus.ONLINE,
        last_seen_at=seen,
        software_version="v" * 300,
        protocol_version=1,
        last_health=health,
    )
    got = await store.get_node(node.id)
    assert got is not None
    assert got.status is NodeStatus.ONLINE and got.last_seen_at == seen
    assert got.software_version == "v" * 256  # interop 6
    assert got.protocol_version == 1 and got.last_health == health
    assert got.updated_at == START  # runtime state does not move updated_at

    await store.update_node_runtime(node.id, status=NodeStatus.DEGRADED)  # the rest stays
    got = await store.get_node(node.id)
    assert got is not None and got.status is NodeStatus.DEGRADED and got.protocol_version == 1
    with pytest.raises(NodeNotFound):
        await store.update_node_runtime(uuid.uuid4(), status=NodeStatus.ONLINE)


async def test_mark_all_nodes_offline_leaves_pending_nodes(store: Store) -> None:
    statuses = [NodeStatus.ONLINE, NodeStatus.DEGRADED, NodeStatus.ERROR, NodeStatus.OFFLINE, NodeStatus.PENDING]
    ids = []
    for i, status in enumerate(statuses):
        node = await store.create_node(new_node(f"token-{i}"))
        await store.update_node_runtime(node.id, status=status)
        ids.append(node.id)
    assert await store.mark_all_nodes_offline() == 3
    after = [(await store.get_node(node_id)).status for node_id in ids]  # type: ignore[union-attr]
    assert after == [NodeStatus.OFFLINE] * 4 + [NodeStatus.PENDING]


async def test_the_config_cache_is_kept_verbatim(store: Store, clock: FakeClock) -> None:
    node = await store.create_node(new_node())
    assert await store.get_cached_config(node.id) is None
    # Key order, spacing and unicode exactly as the node sent them (interop 13: never normalised).
    text = '{"version": 1,  "flows": [{"id": "cam1", "name": "Caméra 1"}], "a": 1.50}'
    cached_at = clock.advance(timedelta(seconds=2))
    await store.cache_node_config(node.id, text)
    cached = await store.get_cached_config(node.id)
    assert cached is not None and cached.config_json == text and cached.cached_at == cached_at
    assert json.loads(cached.config_json)["flows"][0]["name"] == "Caméra 1"
    assert (await store.get_node(node.id)).config_cached_at == cached_at  # type: ignore[union-attr]

    await store.cache_node_config(node.id, None)  # dropped after a mutating command
    assert await store.get_cached_config(node.id) is None
    assert (await store.get_node(node.id)).config_cached_at is None  # type: ignore[union-attr]
    with pytest.raises(NodeNotFound):
        await store.cache_node_config(uuid.uuid4(), "{}")
