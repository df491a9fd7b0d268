"""``make run`` (tools/demo.py) turns on the edge's monitor listener and prints the status page's address."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tools import demo


def test_first_run_writes_a_config_the_edge_completes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "DEMO_DIR", tmp_path)
    assert demo._configure_monitor() == "http://127.0.0.1:9090/"
    path = tmp_path / "config.json"
    assert json.loads(path.read_text()) == {
        "version": 1,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
        "monitor": {"listen_addr": "127.0.0.1", "listen_port": 9090},
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_existing_config_gets_the_monitor_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "DEMO_DIR", tmp_path)
    config = {"version": 1, "node_id": "7e378c5e-e983-4684-a123-4bd8c5d79974", "monitor": None, "flows": []}
    (tmp_path / "config.json").write_text(json.dumps(config))
    demo._configure_monitor()
    assert json.loads((tmp_path / "config.json").read_text()) == {**config, "monitor": demo.MONITOR}


def test_a_monitor_already_set_is_kept_and_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "DEMO_DIR", tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"version": 1, "monitor": {"listen_addr": "0.0.0.0", "listen_port": 9191}})
    )
    assert demo._configure_monitor() == "http://127.0.0.1:9191/"


def test_the_banner_prints_the_status_page() -> None:
    source = Path(demo.__file__).read_text()
    assert "Status page {status_page}" in source and "status_page = _configure_monitor()" in source
