"""Issue 15 item 2: `mp flow show <Tab>` completes flow ids from the edge, not file names.

Driven through the protocol the shell script uses (Typer's names: `_MP_COMPLETE=complete_bash`,
`COMP_WORDS`, `COMP_CWORD`) with the real `mp` binary against a real `mp-edge`.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from cli.completion import TIMEOUT_S
from tests.cli.helpers import MP
from tests.helpers.edge import ADMIN, Edge, auth_section, free_port, free_udp_port, running_edge

pytestmark = pytest.mark.e2e

FLOWS = ("cam1", "cam2", "studio")


def complete(words: list[str], env: dict[str, str], *, cword: int | None = None) -> subprocess.CompletedProcess[str]:
    """Ask `mp` for bash completions of the last word of `words` (add "" to complete a new word)."""
    return subprocess.run(
        [MP],
        env={
            **env,
            "_MP_COMPLETE": "complete_bash",
            "COMP_WORDS": " ".join(words),
            "COMP_CWORD": str(len(words) - 1 if cword is None else cword),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def candidates(words: list[str], env: dict[str, str]) -> list[str]:
    done = complete(words, env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.split()


def _flow(flow_id: str, outputs: list[str]) -> dict[str, object]:
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "enabled": False,
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
        "outputs": [{"type": "udp", "id": o, "name": o, "dest_addr": f"127.0.0.1:{free_udp_port()}"} for o in outputs],
    }


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("complete")) as started:
        with started.client() as http:
            for n, flow_id in enumerate(FLOWS):
                outputs = ["out1", "out2", "studio-b"] if n == 0 else []
                http.post("/api/v1/flows", json=_flow(flow_id, outputs)).raise_for_status()
        yield started


@pytest.fixture
def env(edge: Edge, cli_env: dict[str, str]) -> dict[str, str]:
    return {**cli_env, "MEDIAPLANE_URL": edge.url}


@pytest.mark.parametrize("verb", ["show", "start", "stop", "restart", "delete", "update"])
def test_flow_commands_complete_flow_ids(verb: str, env: dict[str, str]) -> None:
    assert candidates(["mp", "flow", verb, ""], env) == list(FLOWS)
    assert candidates(["mp", "flow", verb, "ca"], env) == ["cam1", "cam2"]
    assert candidates(["mp", "flow", verb, "x"], env) == []


def test_stats_and_output_commands_complete_flow_ids(env: dict[str, str]) -> None:
    assert candidates(["mp", "stats", ""], env) == list(FLOWS)
    assert candidates(["mp", "stats", "--watch", "st"], env) == ["studio"]
    assert candidates(["mp", "output", "list", "c"], env) == ["cam1", "cam2"]
    assert candidates(["mp", "output", "remove", ""], env) == list(FLOWS)
    assert candidates(["mp", "output", "add", "s"], env) == ["studio"]
    assert candidates(["mp", "events", "--flow", "cam"], env) == ["cam1", "cam2"]


def test_output_remove_completes_the_flows_output_ids(env: dict[str, str]) -> None:
    assert candidates(["mp", "output", "remove", "cam1", ""], env) == ["out1", "out2", "studio-b"]
    assert candidates(["mp", "output", "remove", "cam1", "out"], env) == ["out1", "out2"]
    assert candidates(["mp", "output", "remove", "cam2", ""], env) == []  # no outputs
    assert candidates(["mp", "output", "remove", "nope", ""], env) == []  # 404: nothing, quietly


def test_flow_create_does_not_offer_existing_ids(env: dict[str, str]) -> None:
    assert candidates(["mp", "flow", "create", ""], env) == []


def test_commands_and_options_still_complete(env: dict[str, str]) -> None:
    assert candidates(["mp", "flow", "sh"], env) == ["show"]
    assert "--yes" in candidates(["mp", "flow", "delete", "cam1", "--y"], env)


def test_the_url_flag_is_honoured(edge: Edge, cli_env: dict[str, str]) -> None:
    assert candidates(["mp", "--url", edge.url, "flow", "show", ""], cli_env) == list(FLOWS)
    bare = edge.url.removeprefix("http://")
    assert candidates(["mp", "--url", bare, "--timeout", "5", "stats", "cam"], cli_env) == ["cam1", "cam2"]


def test_a_profile_is_honoured(edge: Edge, cli_env: dict[str, str]) -> None:
    from pathlib import Path

    path = Path(cli_env["XDG_CONFIG_HOME"]) / "mp" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'[truck3]\nurl = "{edge.url}"\n')
    assert candidates(["mp", "-p", "truck3", "flow", "show", ""], cli_env) == list(FLOWS)
    assert candidates(["mp", "-p", "nosuch", "flow", "show", ""], cli_env) == []  # a usage error: no candidates


def test_a_down_edge_gives_nothing_quickly_and_silently(cli_env: dict[str, str]) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    started = time.monotonic()
    done = complete(["mp", "--url", down, "flow", "show", ""], cli_env)
    elapsed = time.monotonic() - started
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "", "")
    assert elapsed < 5  # the start of `mp` itself; a refused connection costs nothing


def test_a_silent_edge_costs_at_most_the_completion_timeout(cli_env: dict[str, str]) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        baseline_start = time.monotonic()
        complete(["mp", "--url", url, "flow", "sh"], cli_env)  # no request: just mp's start
        baseline = time.monotonic() - baseline_start
        started = time.monotonic()
        done = complete(["mp", "--url", url, "--timeout", "30", "flow", "show", ""], cli_env)
        elapsed = time.monotonic() - started
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "", "")
    assert TIMEOUT_S * 0.9 <= elapsed < baseline + TIMEOUT_S + 1.5, (elapsed, baseline)


@pytest.fixture(scope="module")
def auth_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    config = {"version": 1, "server": {"listen_addr": "127.0.0.1", "listen_port": 8080, "auth": auth_section()}}
    with running_edge(tmp_path_factory.mktemp("complete-auth"), config=config) as started:
        with started.client("admin") as http:
            http.post("/api/v1/flows", json=_flow("secure1", ["out1"])).raise_for_status()
        yield started


def test_credentials_are_used_as_commands_use_them(auth_edge: Edge, cli_env: dict[str, str]) -> None:
    env = {**cli_env, "MEDIAPLANE_URL": auth_edge.url}
    assert candidates(["mp", "flow", "show", ""], env) == []  # 401: nothing, quietly
    token = auth_edge.token("admin")
    assert candidates(["mp", "--token", token, "flow", "show", ""], env) == ["secure1"]
    assert candidates(["mp", "flow", "show", ""], {**env, "MEDIAPLANE_TOKEN": token}) == ["secure1"]
    # refused credentials: nothing, quietly (before a good exchange caches a token for this URL)
    assert candidates(["mp", "--client-id", ADMIN[0], "--client-secret", "wrong-0123456789", "stats", ""], env) == []
    creds = ["--client-id", ADMIN[0], "--client-secret", ADMIN[1]]
    assert candidates(["mp", *creds, "output", "remove", "secure1", ""], env) == ["out1"]
