"""`mp manager status` against a real `mp-edge`: the link off, a manager nobody answers, auth, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from appliance.models.manager_link import ManagerLinkStatus
from tests.cli.helpers import Mp, one_line_error
from tests.helpers.edge import MONITOR, auth_section, free_port, running_edge, wait_for

pytestmark = pytest.mark.e2e

KEYS = {
    "enabled",
    "state",
    "manager_url",
    "node_id",
    "registered",
    "has_registration_token",
    "connected_since",
    "last_error",
    "last_error_at",
    "next_attempt_in_secs",
    "events_queued",
    "events_dropped",
}


def _fields(table: str) -> dict[str, str]:
    """`key: value` lines of the table, keyed by the label."""
    out: dict[str, str] = {}
    for line in table.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def test_link_disabled(tmp_path: Path, cli_env: dict[str, str]) -> None:
    with running_edge(tmp_path) as edge:  # the default config: "manager": null
        mp = Mp(edge.url, cli_env)
        data = mp.data("manager", "status", "-o", "json")
        assert set(data) == KEYS
        assert data == {
            "enabled": False,
            "state": "disabled",
            "manager_url": None,
            "node_id": None,
            "registered": False,
            "has_registration_token": False,
            "connected_since": None,
            "last_error": None,
            "last_error_at": None,
            "next_attempt_in_secs": None,
            "events_queued": 0,
            "events_dropped": 0,
        }
        with edge.client() as client:
            assert client.get("/api/v1/manager").json() == {"success": True, "data": data}
        assert mp.data("manager", "status", "--json") == data  # piped: json by default too
        assert mp.data("manager", "status") == data

        done = mp.ok("manager", "status", "-o", "table")
        assert done.stderr == ""
        assert done.stdout == (
            "state:         disabled  (the link is off: manager.enabled is false or there is no URL)\n"
            "manager URL:   -\n"
            "node id:       -\n"
            "registered:    no (no registration token: run the setup wizard or set manager.registration_token)\n"
            "last error:    -\n"
            "events:        0 queued for the manager, 0 dropped\n"
        )
        assert mp.ok("manager", "status", "-o", "yaml").stdout.startswith("enabled: false\nstate: disabled\n")


def test_a_manager_nobody_answers(tmp_path: Path, cli_env: dict[str, str]) -> None:
    url = f"wss://127.0.0.1:{free_port()}/ws/node"  # free a moment ago: nothing listens there
    token = "reg-token-never-shown-0123456789"
    config: dict[str, Any] = {
        "version": 1,
        "server": {"listen_addr": "127.0.0.1", "listen_port": 8080},
        "manager": {"enabled": True, "url": url, "registration_token": token},
    }
    with running_edge(tmp_path, config=config) as edge:
        mp = Mp(edge.url, cli_env)
        data = wait_for(
            lambda: (d := mp.data("manager", "status", "-o", "json"))["last_error"] is not None and d, timeout=20
        )
        link = ManagerLinkStatus.model_validate(data)
        assert link.enabled and link.state in ("connecting", "waiting")
        assert link.manager_url == url and link.node_id is None
        assert not link.registered and link.has_registration_token
        assert link.last_error is not None and link.last_error.startswith("cannot reach the manager at 127.0.0.1:")
        assert link.last_error_at is not None and link.connected_since is None

        # A table while the link waits for its next attempt (backoff 1 → 60 s).
        waiting = wait_for(
            lambda: (t := mp.ok("manager", "status", "-o", "table").stdout).startswith("state:         waiting") and t,
            timeout=20,
        )
        fields = _fields(waiting)
        assert fields["state"] == "waiting  (the last attempt failed; retrying with backoff)"
        assert fields["manager URL"] == url
        assert fields["node id"] == "-"
        assert fields["registered"] == "no (will register with its registration token)"
        assert fields["next attempt"].startswith("in ") and fields["next attempt"].endswith(" s")
        assert fields["last error"].startswith("cannot reach the manager at 127.0.0.1:")
        assert fields["last error"].endswith(" ago)")
        assert fields["events"] == "0 queued for the manager, 0 dropped"
        assert "connected" not in fields
        assert token not in waiting and token not in mp.ok("manager", "status", "-o", "json").stdout


def test_auth_any_role_and_errors(tmp_path: Path, cli_env: dict[str, str]) -> None:
    config = {"version": 1, "server": {"listen_addr": "127.0.0.1", "listen_port": 8080, "auth": auth_section()}}
    with running_edge(tmp_path, config=config) as edge:
        mp = Mp(edge.url, cli_env)
        line = one_line_error(mp("manager", "status"), 4)
        assert line.endswith("(try: mp auth login)")
        monitor = {"MEDIAPLANE_CLIENT_ID": MONITOR[0], "MEDIAPLANE_CLIENT_SECRET": MONITOR[1]}
        assert mp.data("manager", "status", env=monitor)["state"] == "disabled"
        one_line_error(mp("manager", "status", "-o", "xml"), 2)

    gone = Mp(f"http://127.0.0.1:{free_port()}", cli_env)
    line = one_line_error(gone("manager", "status"), 1)
    assert "cannot reach the edge at" in line
