"""Backup and restore of the store (services/manager/backup.py, store/snapshot.py), on both backends.

Every case fills a real database through the Store, writes a real backup file, and
restores it into another real database: SQLite and PostgreSQL, and across them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import trio
from pydantic import SecretStr

from services.manager.backup import HEADER, BackupUnreadable, make_backup, restore_backup
from services.manager.secrets import SecretBox
from services.manager.store import (
    AiProvider,
    AttemptKind,
    EventSeverity,
    NewEvent,
    NewNode,
    NewUser,
    Role,
    Store,
    StoreFailed,
    sqlite_url,
)
from services.manager.store.snapshot import TargetNotEmpty
from services.manager.store.tables import metadata
from tests.helpers.postgres import PostgresCluster

from .conftest import START, FakeClock

MASTER_KEY = SecretStr("ab" * 32)
OTHER_KEY = SecretStr("cd" * 32)


def table_rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, in primary-key order, as Python values."""
    engine = sa.create_engine(sa.make_url(url).set(drivername=_driver(url)))
    try:
        with engine.connect() as conn:
            return {
                table.name: [tuple(row) for row in conn.execute(sa.select(table).order_by(*table.primary_key.columns))]
                for table in metadata.sorted_tables
            }
    finally:
        engine.dispose()


def _driver(url: str) -> str:
    return "sqlite+pysqlite" if url.startswith("sqlite") else "postgresql+psycopg"


async def fill(url: str, clock: FakeClock) -> dict[str, object]:
    """One of everything: users (one restricted), sessions (one revoked), nodes (one registered,
    one pending), events (one acknowledged), settings, AI keys, login attempts."""
    box = SecretBox(MASTER_KEY)
    async with await Store.open(url, clock=clock) as store:
        admin = await store.create_user(NewUser(username="admin", password_hash="$argon2id$x", role=Role.SUPER_ADMIN))
        node = await store.create_node(NewNode(name="cam-1", registration_token_digest="a" * 64, metadata={"k": [1]}))
        await store.create_node(NewNode(name="cam-2", registration_token_digest="b" * 64))
        secret = "node-secret-" + "7" * 20
        assert await store.consume_registration_token("a" * 64, box.encrypt(secret)) is not None
        operator = await store.create_user(
            NewUser(username="op", password_hash="$argon2id$y", role=Role.OPERATOR, allowed_node_ids=(node.id,))
        )
        live = await store.create_session(admin.id, START + timedelta(hours=8))
        revoked = await store.create_session(operator.id, START + timedelta(hours=8))
        await store.revoke_session(revoked.id)
        for index in range(5):
            clock.advance(timedelta(seconds=1))
            await store.add_event(
                NewEvent(
                    node_id=node.id,
                    severity=EventSeverity.WARNING,
                    category="flow",
                    message=f"event {index} ✓",
                    details={"n": index},
                    flow_id="f1",
                )
            )
        first = (await store.query_events()).rows[-1]
        await store.acknowledge_event(first.id, "admin")
        await store.put_settings({"events_retention_days": 9, "stats_interval_secs": 3})
        await store.put_ai_key(admin.id, AiProvider.OPENAI, box.encrypt("sk-test-key"), model_preference="gpt-x")
        await store.record_attempt(AttemptKind.LOGIN, "127.0.0.1", succeeded=True)
    return {"node_id": node.id, "secret": secret, "session_id": live.id, "revoked_id": revoked.id}


def source_url(tmp_path: Path) -> str:
    """A SQLite database of its own (the ``database_url`` fixture's SQLite file is tmp_path's)."""
    directory = tmp_path / "source"
    directory.mkdir(exist_ok=True)
    return sqlite_url(directory)


def backup_of(url: str, tmp_path: Path, data_dir: Path | None = None) -> Path:
    output = tmp_path / "manager.backup"
    make_backup(url, data_dir or tmp_path / "no-data-dir", output, MASTER_KEY, version="test")
    return output


def other_database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        target = tmp_path / "restored"
        target.mkdir()
        return sqlite_url(target)
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    return cluster.create_database("restored")


@pytest.mark.parametrize("target_backend", ["sqlite", "postgresql"])
async def test_restore_brings_back_every_row_with_its_values(
    database_url: str, target_backend: str, clock: FakeClock, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    facts = await fill(database_url, clock)
    backup = await trio.to_thread.run_sync(backup_of, database_url, tmp_path)
    assert backup.stat().st_mode & 0o777 == 0o600
    target = other_database(target_backend, tmp_path, request)

    result = await trio.to_thread.run_sync(restore_backup, backup, target, tmp_path / "dd", MASTER_KEY)

    assert result.snapshot.rows == {name: len(rows) for name, rows in table_rows(database_url).items()}
    assert result.snapshot.rows["events"] == 5
    assert result.tls_restored is False
    assert table_rows(target) == table_rows(database_url)
    # The restored store works: the node's secret opens with the same master key, the
    # revoked session stays revoked, and new rows get fresh ids (PostgreSQL's sequences moved).
    async with await Store.open(target, clock=clock) as store:
        credentials = await store.get_node_credentials(facts["node_id"])  # type: ignore[arg-type]
        assert credentials is not None and credentials.secret_ciphertext is not None
        assert SecretBox(MASTER_KEY).decrypt(credentials.secret_ciphertext) == facts["secret"]
        revoked = await store.get_session(facts["revoked_id"])  # type: ignore[arg-type]
        assert revoked is not None and revoked.revoked_at is not None
        event = await store.add_event(NewEvent(node_id=None, severity=EventSeverity.INFO, category="x", message="m"))
        assert event.id == 6
        assert (await store.get_settings())["events_retention_days"] == 9


async def test_the_backup_is_encrypted_and_needs_the_same_master_key(
    database_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    facts = await fill(database_url, clock)
    backup = await trio.to_thread.run_sync(backup_of, database_url, tmp_path)
    content = backup.read_bytes()
    for clear in (b"admin", b"cam-1", b"event 0", b"events_retention_days", str(facts["node_id"]).encode()):
        assert clear not in content
    target_dir = tmp_path / "restored"
    target_dir.mkdir()

    with pytest.raises(BackupUnreadable, match="MEDIAPLANE_MASTER_KEY is not the key"):
        restore_backup(backup, sqlite_url(target_dir), target_dir, OTHER_KEY)
    assert not (target_dir / "manager.db").exists()  # a file the failed restore made is removed


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) - 7], "truncated"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "fails its authentication|cannot be decrypted"),
        (lambda data: data + b"\x00", "after its last chunk"),
        (lambda data: b"NOTABACKUP" + data[10:], "not a Mediaplane manager backup"),
        (lambda data: data[: HEADER.size + 4 + 20], "truncated"),
    ],
    ids=["cut", "flipped-bit", "trailing", "magic", "one-chunk-cut"],
)
async def test_a_damaged_file_restores_nothing(
    damage: Callable[[bytes], bytes], message: str, clock: FakeClock, tmp_path: Path
) -> None:
    source = source_url(tmp_path)
    await fill(source, clock)
    backup = await trio.to_thread.run_sync(backup_of, source, tmp_path)
    backup.write_bytes(damage(backup.read_bytes()))
    target_dir = tmp_path / "restored"
    target_dir.mkdir()

    with pytest.raises(BackupUnreadable, match=message):
        restore_backup(backup, sqlite_url(target_dir), target_dir, MASTER_KEY)
    assert not (target_dir / "manager.db").exists()


async def test_restore_refuses_a_database_with_data_and_leaves_it_as_it_was(
    database_url: str, clock: FakeClock, tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    source = source_url(tmp_path)
    await fill(source, clock)
    backup = await trio.to_thread.run_sync(backup_of, source, tmp_path)
    async with await Store.open(database_url, clock=clock) as store:
        await store.put_settings({"events_retention_days": 2})
    before = table_rows(database_url)

    with pytest.raises(TargetNotEmpty, match="already holds data"):
        restore_backup(backup, database_url, tmp_path / "dd", MASTER_KEY)
    assert table_rows(database_url) == before


async def test_restore_into_a_migrated_but_empty_database_is_allowed(
    database_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    """A manager that started once (migrations applied, no user yet) counts as empty."""
    source = source_url(tmp_path)
    await fill(source, clock)
    backup = await trio.to_thread.run_sync(backup_of, source, tmp_path)
    async with await Store.open(database_url, clock=clock) as store:
        await store.mark_all_nodes_offline()

    await trio.to_thread.run_sync(restore_backup, backup, database_url, tmp_path / "dd", MASTER_KEY)
    assert table_rows(database_url) == table_rows(source)


def test_backup_needs_a_database(tmp_path: Path) -> None:
    with pytest.raises(StoreFailed, match="no database to back up"):
        backup_of(sqlite_url(tmp_path), tmp_path)
    assert not (tmp_path / "manager.backup").exists()


async def test_the_tls_pair_travels_and_a_different_one_is_set_aside(clock: FakeClock, tmp_path: Path) -> None:
    source_dir = tmp_path / "source"
    (source_dir / "tls").mkdir(parents=True)
    (source_dir / "tls" / "cert.pem").write_bytes(b"CERT-A")
    (source_dir / "tls" / "key.pem").write_bytes(b"KEY-A")
    await fill(sqlite_url(source_dir), clock)
    backup = await trio.to_thread.run_sync(backup_of, sqlite_url(source_dir), tmp_path, source_dir)
    assert b"KEY-A" not in backup.read_bytes()
    target_dir = tmp_path / "target"
    (target_dir / "tls").mkdir(parents=True)
    (target_dir / "tls" / "cert.pem").write_bytes(b"CERT-B")
    (target_dir / "tls" / "key.pem").write_bytes(b"KEY-B")

    result = restore_backup(backup, sqlite_url(target_dir), target_dir, MASTER_KEY)

    assert (result.tls_restored, result.tls_set_aside) == (True, True)
    assert (target_dir / "tls" / "key.pem").read_bytes() == b"KEY-A"
    assert (target_dir / "tls" / "key.pem").stat().st_mode & 0o777 == 0o600
    assert (target_dir / "tls" / "key.pem.before-restore").read_bytes() == b"KEY-B"
    assert (target_dir / "tls" / "cert.pem.before-restore").read_bytes() == b"CERT-B"


async def test_a_backup_taken_while_writers_commit_is_one_point_in_time(
    database_url: str, clock: FakeClock, tmp_path: Path
) -> None:
    """Each writer transaction adds an event and sets a setting to the new event count; a
    consistent snapshot always restores the two equal, however the backup interleaves."""
    async with await Store.open(database_url, clock=clock) as store:
        await store.put_settings({"events_retention_days": 1})
    engine = sa.create_engine(sa.make_url(database_url).set(drivername=_driver(database_url)))
    stop = threading.Event()
    committed = 0

    def writer() -> None:
        nonlocal committed
        events = metadata.tables["events"]
        settings = metadata.tables["settings"]
        while not stop.is_set() and committed < 5000:
            with engine.begin() as conn:
                conn.execute(
                    events.insert().values(
                        severity="info", category="c", message="m", created_at=START, acknowledged=False
                    )
                )
                count = conn.execute(sa.select(sa.func.count()).select_from(events)).scalar_one()
                conn.execute(settings.update().where(settings.c.key == "events_retention_days").values(value=count))
            committed += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        backups = []
        for round_index in range(3):
            while committed < 20 * (round_index + 1) and thread.is_alive():
                await trio.sleep(0.005)  # let the writer commit between backups (bounded: 5000 rows)
            output = tmp_path / f"b{round_index}"
            await trio.to_thread.run_sync(
                lambda output=output: make_backup(database_url, tmp_path, output, MASTER_KEY, version="t")
            )
            backups.append(output)
    finally:
        stop.set()
        thread.join()
        engine.dispose()
    for index, backup in enumerate(backups):
        target_dir = tmp_path / f"r{index}"
        target_dir.mkdir()
        result = restore_backup(backup, sqlite_url(target_dir), target_dir, MASTER_KEY)
        rows = table_rows(sqlite_url(target_dir))
        setting = dict((key, value) for key, value, _ in rows["settings"])["events_retention_days"]
        assert result.snapshot.rows["events"] == setting == len(rows["events"]) > 0
