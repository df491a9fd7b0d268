"""Every `mp` command against a real `mp-edge` on a free loopback port: stdout, stderr, exit code."""

from __future__ import annotations

import json
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import MP, Mp, one_line_error
from tests.helpers.edge import ADMIN, MONITOR, Edge, auth_section, free_udp_port, running_edge, wait_for
from tests.helpers.media import rtp_stream, send_datagrams

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("open")) as started:
        yield started


@pytest.fixture
def mp(edge: Edge, cli_env: dict[str, str]) -> Mp:
    return Mp(edge.url, cli_env)


def test_health_and_setup_status(mp: Mp) -> None:
    health = mp.data("health")
    assert health["status"] == "ok" and isinstance(health["uptime_secs"], int)
    table = mp.ok("health", "-o", "table").stdout
    assert table.startswith("status:        ok\n") and "running of" in table
    assert mp.ok("health", "-o", "yaml").stdout.startswith("status: ok\n")
    setup = mp.data("setup", "status")
    assert setup["registration_token"] is None and "setup_enabled" in setup


def test_flow_lifecycle(mp: Mp, tmp_path: Path) -> None:
    port, out_port = free_udp_port(), free_udp_port()
    assert mp.data("flow", "list") == {"flows": []}
    assert mp.ok("flow", "list", "-o", "table").stdout == "no flows (try: mp flow create)\n"

    done = mp.ok(
        "flow",
        "create",
        "f1",
        "--name",
        "Cam 1",
        "--input",
        f"rtp://127.0.0.1:{port}",
        "--output",
        f"udp://127.0.0.1:{out_port}",
    )
    created = json.loads(done.stdout)
    assert created["id"] == "f1" and created["input"]["bind_addr"] == f"127.0.0.1:{port}"
    assert (
        created["outputs"][0].items()
        >= {"type": "udp", "id": "out1", "name": "out1", "dest_addr": f"127.0.0.1:{out_port}"}.items()
    )
    assert done.stderr == "flow 'f1' created and started\n"

    line = one_line_error(mp("flow", "create", "f1", "--name", "again", "--input", f"rtp://127.0.0.1:{port}"), 1)
    assert "f1" in line  # the API's 409 text

    table = mp.ok("flow", "list", "-o", "table").stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "ENABLED", "INPUT", "OUTPUTS"]
    assert table[1].split() == ["f1", "Cam", "1", "yes", "rtp", "1"]
    assert mp.ok("flow", "list", "--quiet").stdout == "f1\n"
    assert mp.data("flow", "show", "f1")["name"] == "Cam 1"
    assert "bind_addr: 127.0.0.1:" in mp.ok("flow", "show", "f1", "-o", "table").stdout

    line = one_line_error(mp("flow", "show", "nope"), 3)
    assert "'nope'" in line and line.endswith("(try: mp flow list)")

    # start/stop/restart and their 409s
    assert mp.ok("flow", "stop", "f1").stderr == "flow 'f1' stopped\n"
    assert "f1" in one_line_error(mp("flow", "stop", "f1"), 1)
    assert mp.ok("flow", "start", "f1").stderr == "flow 'f1' started\n"
    assert "already running" in one_line_error(mp("flow", "start", "f1"), 1)
    assert mp.ok("flow", "restart", "f1").stderr == "flow 'f1' restarted\n"
    one_line_error(mp("flow", "restart", "nope"), 3)

    # update from flags (fetch, patch, PUT) and from a file
    done = mp.ok("flow", "update", "f1", "--name", "Cam 1b")
    assert json.loads(done.stdout)["name"] == "Cam 1b" and done.stderr == "flow 'f1' updated\n"
    assert mp.data("flow", "show", "f1")["outputs"][0]["id"] == "out1"  # untouched outputs kept
    body = mp.data("flow", "show", "f1") | {"name": "From file", "id": "ignored-path-wins"}
    (tmp_path / "f1.json").write_text(json.dumps(body))
    mp.ok("flow", "update", "f1", "-f", str(tmp_path / "f1.json"))
    assert mp.data("flow", "show", "f1")["name"] == "From file"
    assert "nothing to change" in one_line_error(mp("flow", "update", "f1"), 2)
    line = one_line_error(mp("flow", "update", "f1", "--input", "rtp://127.0.0.1:0"), 2)
    assert line.startswith("mp: invalid flow: input.bind_addr: ")

    # outputs, hot
    added = mp.data("output", "add", "f1", f"rtp://127.0.0.1:{free_udp_port()}", "--name", "To studio B")
    assert (added["id"], added["type"], added["name"]) == ("out2", "rtp", "To studio B")
    assert [o["id"] for o in mp.data("output", "list", "f1")] == ["out1", "out2"]
    assert mp.ok("output", "list", "f1", "-o", "table").stdout.splitlines()[0].split() == [
        "ID",
        "NAME",
        "TYPE",
        "MODE",
        "ADDRESS",
    ]
    assert "out2" in one_line_error(mp("output", "add", "f1", "udp://127.0.0.1:9", "--id", "out2"), 1)  # 409
    one_line_error(mp("output", "add", "nope", "udp://127.0.0.1:9", "--id", "x"), 3)
    assert mp.ok("output", "remove", "f1", "out2", "--yes").stderr == "output 'out2' removed from flow 'f1'\n"
    line = one_line_error(mp("output", "remove", "f1", "out2", "--yes"), 3)
    assert line.endswith("(try: mp output list f1)")
    assert mp.ok("output", "remove", "f1", "out1").returncode == 0  # no terminal: no question, no --yes needed

    # delete
    assert mp.ok("flow", "delete", "f1", "--yes").stderr == "flow 'f1' deleted\n"
    one_line_error(mp("flow", "delete", "f1", "--yes"), 3)
    assert mp.data("flow", "list") == {"flows": []}


def test_flow_create_from_a_file_on_stdin(mp: Mp) -> None:
    body = {
        "id": "from-stdin",
        "name": "Stdin",
        "enabled": False,
        "input": {"type": "udp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
        "outputs": [],
    }
    done = mp.ok("flow", "create", "-f", "-", input=json.dumps(body))
    try:
        assert json.loads(done.stdout)["id"] == "from-stdin"
        assert done.stderr == "flow 'from-stdin' created (disabled)\n"
        assert mp.data("flow", "show", "from-stdin")["input"]["type"] == "udp"
    finally:
        mp.ok("flow", "delete", "from-stdin", "--yes")


def test_srt_urls_reach_the_edge_as_the_srt_field_set(mp: Mp) -> None:
    args = [
        "flow",
        "create",
        "srt1",
        "--name",
        "SRT in",
        "--disabled",
        "--input",
        f"srt://:{free_udp_port()}?latency=200",
        "--output",
        "srt://203.0.113.7:9000?mode=caller&latency=120&passphrase=correct-horse-42",
    ]
    body = mp.data(*args, "--dry-run")  # checked by the local model, nothing sent
    assert body["input"] == {
        "type": "srt",
        "mode": "listener",
        "local_addr": body["input"]["local_addr"],
        "latency_ms": 200,
    }
    done = mp(*args)
    if done.returncode == 1 and "not supported" in done.stderr:
        pytest.skip(f"this edge has no SRT yet: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    try:
        out = json.loads(done.stdout)["outputs"][0]
        assert (out["mode"], out["remote_addr"], out["local_addr"], out["latency_ms"]) == (
            "caller",
            "203.0.113.7:9000",
            "0.0.0.0:0",
            120,
        )
        shown = mp.data("config", "show")
        assert next(f for f in shown["flows"] if f["id"] == "srt1")["outputs"][0]["passphrase"] == "**********"
    finally:
        mp.ok("flow", "delete", "srt1", "--yes")


def test_stats_once_and_watch_piped(mp: Mp) -> None:
    port = free_udp_port()
    mp.ok(
        "flow",
        "create",
        "st1",
        "--name",
        "Stats",
        "--input",
        f"rtp://127.0.0.1:{port}",
        "--output",
        f"udp://127.0.0.1:{free_udp_port()}",
    )
    try:
        send_datagrams(("127.0.0.1", port), rtp_stream(200), pps=1000)
        wait_for(lambda: mp.data("stats", "st1")["input"]["packets_received"] >= 200)
        data = mp.data("stats")
        assert set(data) == {"system", "flows"} and [f["flow_id"] for f in data["flows"]] == ["st1"]
        table = mp.ok("stats", "-o", "table").stdout.splitlines()
        assert table[0].split()[:5] == ["FLOW", "STATE", "HEALTH", "INPUT", "BITRATE"]
        assert table[1].split()[:2] == ["st1", "Running"] and " 200 " in table[1]
        assert table[1].split()[9:11] == ["ok", "ok"]  # TR-101290 P1, P2 on a clean stream (BITRATE: 2 words)
        one_line_error(mp("stats", "nope"), 3)
        one_line_error(mp("stats", "--count", "2"), 2)

        done = mp.ok("stats", "st1", "--watch", "--count", "2", timeout=30)
        lines = done.stdout.splitlines()
        assert len(lines) == 2
        assert [json.loads(line)["flow_id"] for line in lines] == ["st1", "st1"]
        done = mp.ok("stats", "--watch", "--count", "1", "-o", "json", timeout=30)
        assert [f["flow_id"] for f in json.loads(done.stdout)["flows"]] == ["st1"]
        one_line_error(mp("stats", "nope", "--watch"), 3)

        # `mp stats --watch | head -1`: a closed pipe ends the watch quietly, with status 0
        proc = subprocess.Popen(
            [MP, "stats", "--watch"], env=mp.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            assert proc.stdout is not None and proc.stderr is not None
            assert json.loads(proc.stdout.readline())["flows"][0]["flow_id"] == "st1"
            proc.stdout.close()
            assert proc.wait(30) == 0
            assert proc.stderr.read() == ""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    finally:
        mp.ok("flow", "delete", "st1", "--yes")


def test_config_show_apply_reload(mp: Mp, tmp_path: Path) -> None:
    mp.ok("flow", "create", "c1", "--name", "Config", "--disabled", "--input", f"rtp://127.0.0.1:{free_udp_port()}")
    try:
        shown = mp.data("config", "show")
        assert shown["version"] == 1 and [f["id"] for f in shown["flows"]] == ["c1"]
        assert "jwt_secret" not in json.dumps(shown)
        assert mp.ok("config", "show", "-o", "yaml").stdout.startswith("version: 1\n")
        assert "flows:" in mp.ok("config", "show", "-o", "table").stdout
        backup = mp.ok("config", "show", "--show-secrets", "-o", "json").stdout
        new = json.loads(backup)
        new["flows"][0]["name"] = "Applied"
        (tmp_path / "new.json").write_text(json.dumps(new))
        done = mp.ok("config", "apply", "-f", str(tmp_path / "new.json"), "--yes")
        assert done.stderr == "configuration applied (1 flow)\n"
        assert mp.data("flow", "show", "c1")["name"] == "Applied"
        (tmp_path / "bad.json").write_text(json.dumps(new | {"flows": new["flows"] * 2}))
        assert "duplicate flow id 'c1'" in one_line_error(mp("config", "apply", "-f", str(tmp_path / "bad.json")), 2)
        assert mp.ok("config", "reload", "--yes").stderr == "configuration reloaded\n"
        assert mp.data("flow", "show", "c1")["name"] == "Applied"
    finally:
        mp.ok("flow", "delete", "c1", "--yes")


def test_auth_status_when_auth_is_off(mp: Mp) -> None:
    status = mp.data("auth", "status")
    assert status.items() >= {"credentials": "none", "accepted": True, "auth_required": False}.items()


# ------------------------------------------------------------------------------ with auth


@pytest.fixture(scope="module")
def auth_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    config = {"version": 1, "server": {"listen_addr": "127.0.0.1", "listen_port": 8080, "auth": auth_section()}}
    with running_edge(tmp_path_factory.mktemp("auth"), config=config) as started:
        yield started


def test_auth_login_status_logout(auth_edge: Edge, cli_env: dict[str, str]) -> None:
    mp = Mp(auth_edge.url, cli_env)
    assert mp.data("health")["status"] == "ok"  # public
    line = one_line_error(mp("flow", "list"), 4)
    assert line.endswith("(try: mp auth login)")
    assert mp("auth", "status").returncode == 4

    line = one_line_error(
        mp("auth", "login", "--client-id", ADMIN[0], "--client-secret-stdin", input="wrong-secret-0000\n"), 4
    )
    assert f"refused the client credentials for '{ADMIN[0]}'" in line
    done = mp.ok("auth", "login", "--client-id", ADMIN[0], "--client-secret-stdin", input=ADMIN[1] + "\n")
    assert done.stderr.startswith(f"logged in to {auth_edge.url} as {ADMIN[0]} (admin); token valid 5")
    cache = Path(cli_env["XDG_CONFIG_HOME"]) / "mp" / "tokens.json"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert ADMIN[1] not in done.stdout + done.stderr

    assert mp.data("flow", "list") == {"flows": []}
    status = mp.data("auth", "status")
    assert status.items() >= {"credentials": "login", "client_id": ADMIN[0], "role": "admin", "accepted": True}.items()
    assert 3500 < status["expires_in_secs"] <= 3600
    # the WebSocket stream takes the same token
    assert json.loads(mp.ok("stats", "--watch", "--count", "1", timeout=30).stdout) == {"flows": []}

    assert mp.ok("auth", "logout").stderr == f"logged out of {auth_edge.url}\n"
    one_line_error(mp("flow", "list"), 4)


def test_roles_tokens_and_profiles(auth_edge: Edge, cli_env: dict[str, str]) -> None:
    mp = Mp(auth_edge.url, cli_env)
    monitor = {"MEDIAPLANE_CLIENT_ID": MONITOR[0], "MEDIAPLANE_CLIENT_SECRET": MONITOR[1]}
    assert mp.data("flow", "list", env=monitor) == {"flows": []}
    line = one_line_error(mp("flow", "create", "m1", "--name", "M", "--input", "rtp://127.0.0.1:5000", env=monitor), 4)
    assert "admin" in line
    one_line_error(mp("flow", "list", env={"MEDIAPLANE_TOKEN": "not-a-token"}), 4)
    one_line_error(mp("--token", "not-a-token", "flow", "list"), 4)
    one_line_error(mp("--token", "not-a-token", "stats", "--watch", "--count", "1"), 4)  # 401 before the upgrade
    good = auth_edge.token("admin")
    assert mp.data("--token", good, "flow", "list") == {"flows": []}

    # the profile file, selected by --profile; env beats it
    profile = Path(cli_env["XDG_CONFIG_HOME"]) / "mp" / "config.toml"
    profile.parent.mkdir(parents=True, exist_ok=True)
    profile.write_text(
        f'[lab]\nurl = "{auth_edge.url}"\nclient_id = "{ADMIN[0]}"\nclient_secret = "{ADMIN[1]}"\n'
        '[dead]\nurl = "http://127.0.0.1:1"\n'
    )
    no_url = {k: v for k, v in mp.env.items() if k != "MEDIAPLANE_URL"}
    bare = Mp(auth_edge.url, no_url)
    bare.env.pop("MEDIAPLANE_URL")
    assert bare.data("--profile", "lab", "flow", "list") == {"flows": []}
    line = one_line_error(bare("--profile", "dead", "flow", "list"), 1)
    assert line.startswith("mp: cannot reach the edge at http://127.0.0.1:1")
    assert bare.data("--profile", "dead", "health", env={"MEDIAPLANE_URL": auth_edge.url})["status"] == "ok"
    assert "profile 'nope' not found" in one_line_error(bare("--profile", "nope", "flow", "list"), 2)
