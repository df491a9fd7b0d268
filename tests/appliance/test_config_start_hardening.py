"""The config store at start: hostile files and what interrupted writes leave behind.

Each test here failed before its fix.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

import appliance.config.atomic
from appliance.config.store import EdgeConfigStore
from appliance.errors import ConfigFileError, Internal
from tests.appliance.conftest import full_config_data

DEEP = "[" * 1000 + "]" * 1000


def nested_config(depth: int) -> str:
    """A config.json whose ``device_name`` holds arrays nested ``depth`` levels (the file: depth + 1)."""
    return '{"version":1,"server":{},"device_name":' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("text", [DEEP, "[" * 100_000, nested_config(500), nested_config(64)])
def test_a_config_json_nested_too_deep_is_a_config_file_error(
    store: EdgeConfigStore, config_dir: Path, text: str
) -> None:
    config_dir.mkdir(parents=True)
    store.config_path.write_text(text)
    with pytest.raises(ConfigFileError) as info:
        store.load()
    message = info.value.message
    assert "config.json" in message and "nested deeper than 64 levels" in message
    assert "[[" not in message and "\n" not in message
    assert store.config_path.read_text() == text  # never overwritten
    with pytest.raises(Internal, match="nested deeper than 64 levels"):
        store.read()  # POST /api/v1/config/reload: the same check


def test_a_config_json_64_levels_deep_is_only_refused_by_validation(store: EdgeConfigStore, config_dir: Path) -> None:
    config_dir.mkdir(parents=True)
    store.config_path.write_text(nested_config(63))
    with pytest.raises(ConfigFileError) as info:
        store.load()
    assert "$.device_name: " in info.value.message and "nested" not in info.value.message


def test_a_legacy_secrets_plaintext_nested_too_deep_is_a_config_file_error(
    store: EdgeConfigStore, config_dir: Path
) -> None:
    store.load()
    store.secrets_path.write_text('{"version":1,"server_auth":' + DEEP + "}")
    with pytest.raises(ConfigFileError) as info:
        store.load()
    assert "secrets.json" in info.value.message and "nested deeper than 64 levels" in info.value.message
    assert "[[" not in info.value.message


def stale_names() -> list[str]:
    return [".config.json.a1b2c3d4.tmp", ".secrets.json.zz_9x8y7.tmp", "..secrets_key.k3y_t3mp.tmp"]


def test_stale_temp_files_of_interrupted_writes_are_removed_at_start(
    store: EdgeConfigStore, config_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config_dir.mkdir(parents=True)
    store.config_path.write_text(json.dumps(full_config_data()))
    for name in stale_names():
        (config_dir / name).write_text("half a secret")
    keep = [
        "notes.txt",
        ".config.json.tmp",  # not the writer's pattern: no random part
        ".config.json.a1b2c3d4.tmp.bak",
        ".other.json.a1b2c3d4.tmp",  # not a file the store writes
        "config.json.a1b2c3d4.tmp",  # no leading dot
        ".config.json.a1b2c3d.tmp",  # 7 random characters, not 8
    ]
    for name in keep:
        (config_dir / name).write_text("keep me")
    (config_dir / ".secrets.json.dir12345.tmp").mkdir()  # a directory is never removed
    with caplog.at_level(logging.INFO, logger="appliance.config.store"):
        store.load()
    left = {p.name for p in config_dir.iterdir()}
    assert not left & set(stale_names())
    assert set(keep) | {".secrets.json.dir12345.tmp", "config.json", "secrets.json"} <= left
    assert all((config_dir / name).read_text() == "keep me" for name in keep)
    assert "removed 3 stale temp file" in caplog.text


def test_a_start_without_stale_files_logs_nothing_about_them(
    store: EdgeConfigStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="appliance.config.store"):
        store.load()
        store.load()
    assert "stale temp" not in caplog.text


def test_the_cleanup_pattern_is_the_one_atomic_write_uses(
    monkeypatch: pytest.MonkeyPatch, store: EdgeConfigStore, config_dir: Path
) -> None:
    """A temp file that atomic_write really makes (kept by a crash before the rename) is cleaned."""
    config_dir.mkdir(parents=True)
    kept: list[str] = []

    def crash(src: str, dst: object) -> None:
        kept.append(src)
        raise KeyboardInterrupt  # stands in for kill -9 between the fsync and the rename

    for name in ("config.json", "secrets.json", ".secrets_key"):
        monkeypatch.setattr(os, "replace", crash)
        monkeypatch.setattr(os, "unlink", lambda path: None)  # a killed process cleans nothing up
        with pytest.raises(KeyboardInterrupt):
            appliance.config.atomic.atomic_write(config_dir / name, b"x")
        monkeypatch.undo()
    assert len(kept) == 3 and all(Path(p).exists() for p in kept)
    store.load()
    assert not any(Path(p).exists() for p in kept)
