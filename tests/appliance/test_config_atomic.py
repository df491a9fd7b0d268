"""atomic_write: temp file in the same directory, fsync, chmod, rename, fsync the directory."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.config import atomic_write
from appliance.errors import PersistFailed


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def wide_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_writes_the_bytes_at_0600_by_default(tmp_path: Path, wide_umask: None) -> None:
    path = tmp_path / "config.json"
    atomic_write(path, b'{"version": 1}\n')
    assert path.read_bytes() == b'{"version": 1}\n'
    assert mode_of(path) == 0o600


def test_takes_the_mode_asked_for_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "public.txt"
    old = os.umask(0o077)
    try:
        atomic_write(path, b"x", mode=0o644)
    finally:
        os.umask(old)
    assert mode_of(path) == 0o644


def test_replaces_an_existing_file_and_narrows_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    path.write_bytes(b"old content")
    path.chmod(0o644)
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert mode_of(path) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secrets.json"]


def test_leaves_no_temp_file(tmp_path: Path) -> None:
    for n in range(3):
        atomic_write(tmp_path / "a.json", b"%d" % n)
    atomic_write(tmp_path / "b.json", b"b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]


def test_fsyncs_the_file_and_then_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    atomic_write(tmp_path / "config.json", b"{}")
    assert synced == ["file", "dir"]


@pytest.mark.parametrize("failing", ["fsync", "replace", "fchmod"])
def test_a_failure_keeps_the_old_file_and_raises_persist_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"old content")

    def broken(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, failing, broken)
    with pytest.raises(PersistFailed) as info:
        atomic_write(path, b"NEW-CONTENT-never-in-a-message")
    monkeypatch.undo()

    assert path.read_bytes() == b"old content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    assert str(path) in info.value.message
    assert "Input/output error" in info.value.message
    assert "NEW-CONTENT" not in info.value.message
    assert isinstance(info.value.__cause__, OSError)


def test_a_missing_directory_is_persist_failed(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "config.json"
    with pytest.raises(PersistFailed, match=r"absent/config.json"):
        atomic_write(path, b"{}")
    assert not path.parent.exists()
