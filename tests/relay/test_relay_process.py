"""The ``mp-relay`` console script as systemd runs it: it starts on loopback (ports 0, reported in
its ``listening`` line), answers, and exits within 5 s of SIGTERM (interop.md 13)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.relay import LOOPBACK, RELAY_BIN, running_relay

pytestmark = pytest.mark.e2e


def test_starts_on_defaults_with_flags_and_stops_within_5_s_of_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "relay.json"  # missing: the built-in defaults, addresses from the flags
    with running_relay(config, *LOOPBACK) as relay:
        health = httpx.get(relay.url + "/health", timeout=5).json()
        assert health["status"] == "ok" and "manager" not in health
        assert relay.udp.startswith("127.0.0.1:")  # the native plane is on (udp-relay)
        assert relay.quic.startswith("127.0.0.1:")
        started = time.monotonic()
        relay.process.send_signal(signal.SIGTERM)
        code = relay.process.wait(10)
        assert time.monotonic() - started < 5.0
        assert code == 0
        assert "SIGTERM received: stopping" in relay.log()
    assert not config.exists()  # defaults are not written out


def test_no_udp_relay_flag(tmp_path: Path) -> None:
    with running_relay(tmp_path / "relay.json", *LOOPBACK, "--no-udp-relay") as relay:
        assert relay.udp == "off"


def test_the_file_is_read_and_the_api_token_applies(tmp_path: Path) -> None:
    token = "t0ken-" + "9" * 30
    config = tmp_path / "relay.json"
    config.write_text(json.dumps({"api_token": token, "udp_relay_addr": "127.0.0.1:0"}))
    with running_relay(config, "--api-addr", "127.0.0.1:0", "--quic-addr", "127.0.0.1:0") as relay:
        assert httpx.get(relay.url + "/api/v1/stats", timeout=5).status_code == 401
        r = httpx.get(relay.url + "/api/v1/stats", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert r.status_code == 200
    assert token not in relay.log()


def test_a_bad_config_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "relay.json"
    config.write_text(json.dumps({"api_token": "short"}))
    done = subprocess.run(
        [str(RELAY_BIN), "--config", str(config), *LOOPBACK], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert "$.api_token" in done.stderr and "short" not in done.stderr


def test_version(tmp_path: Path) -> None:
    from appliance import __version__

    done = subprocess.run([str(RELAY_BIN), "--version"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0 and done.stdout.strip() == f"mp-relay {__version__}"
