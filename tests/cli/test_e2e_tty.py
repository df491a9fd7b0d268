"""`mp` on a real terminal (tmux): the live stats table, prompts, Ctrl-C; and the piped stream's reconnect."""

from __future__ import annotations

import itertools
import os
import re
import selectors
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import MP, Mp
from tests.helpers.edge import Edge, free_udp_port, running_edge, start_edge, wait_for
from tests.helpers.media import rtp_stream, send_datagrams

pytestmark = pytest.mark.e2e
_sessions = itertools.count()


class Tmux:
    """One private tmux server (its own socket) running one command in a 160x24 pane."""

    def __init__(self, command: str, env: dict[str, str], tmp_path: Path) -> None:
        self.socket = f"mp-cli-test-{os.getpid()}-{next(_sessions)}"
        self.env = env  # the tmux server, and so the pane, gets exactly this environment
        script = tmp_path / f"{self.socket}.sh"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items() if k.isidentifier())
        # The pane stays open after mp exits so the test can read the exit status; tmux kill-server ends it.
        script.write_text(f'{exports}{command}\necho "EXIT=$?"\nsleep 300\n')
        self._tmux("new-session", "-d", "-x", "160", "-y", "24", "-s", "mp", f"bash --norc --noprofile {script}")

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self, colours: bool = False) -> str:
        return self._tmux("capture-pane", "-p", *(["-e"] if colours else []), "-t", "mp")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "mp", *keys)

    def wait(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        return wait_for(lambda: re.search(pattern, self.screen(), re.MULTILINE), timeout=timeout, interval=0.2)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=30)
        socket_dir = Path(self.env.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
        (socket_dir / self.socket).unlink(missing_ok=True)  # kill-server leaves the socket file behind


@pytest.fixture
def tmux_env(cli_env: dict[str, str]) -> dict[str, str]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    env = dict(cli_env)
    env.pop("NO_COLOR", None)  # a real terminal: colour on
    env["PATH"] = str(Path(MP).parent) + os.pathsep + env.get("PATH", "")
    env["TERM"] = "xterm-256color"
    return env


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    with running_edge(tmp_path) as started:
        yield started


def _packets(screen: str, flow_id: str) -> int | None:
    for line in screen.splitlines():  # FLOW STATE HEALTH INPUT BITRATE (3.2 Mb/s) PACKETS (1,234) ...
        match = re.match(rf"{re.escape(flow_id)} +\S+ +\S+ +\S+ +[\d.]+ [kMG]?b/s +([\d,]+) ", line)
        if match:
            return int(match[1].replace(",", ""))
    return None


def test_stats_watch_redraws_in_place_with_live_counters_and_ctrl_c_exits_130(
    edge: Edge, tmux_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_udp_port()
    mp = Mp(edge.url, tmux_env)
    mp.ok(
        "flow",
        "create",
        "t1",
        "--name",
        "Live",
        "--input",
        f"rtp://127.0.0.1:{port}",
        "--output",
        f"udp://127.0.0.1:{free_udp_port()}",
    )
    sender = threading.Thread(
        target=send_datagrams, args=(("127.0.0.1", port), rtp_stream(6000)), kwargs={"pps": 300}, daemon=True
    )  # bounded: 6000 datagrams, 20 s
    sender.start()
    term = Tmux(f"mp --url {edge.url} stats --watch", tmux_env, tmp_path)
    try:
        term.wait(r"^t1 .*Running")
        first = wait_for(lambda: _packets(term.screen(), "t1"), timeout=20)
        later = wait_for(lambda: (n := _packets(term.screen(), "t1")) and n > first and n, timeout=20)
        assert later > first
        screen = term.screen()
        assert screen.count("FLOW") == 1, screen  # redrawn in place, not scrolled
        assert re.search(r"PACKETS.*LOST.*FEC.*P1.*P2.*OUTPUTS", screen)
        assert re.search(r"^t1 .* ok +ok +out1 [\d.]+ [kM]b/s$", screen, re.MULTILINE), screen
        assert f"{edge.url}  updated" in screen
        row = next(line for line in term.screen(colours=True).splitlines() if "t1" in line and "Running" in line)
        assert "\x1b[3" in row  # coloured by health
        term.keys("C-c")
        term.wait(r"^EXIT=130$")
        assert "Traceback" not in term.screen()
    finally:
        term.close()
        sender.join(30)


def test_flow_create_prompts_for_missing_values_and_delete_asks_first(
    edge: Edge, tmux_env: dict[str, str], tmp_path: Path
) -> None:
    mp = Mp(edge.url, tmux_env)
    port, out_port = free_udp_port(), free_udp_port()
    term = Tmux(f"mp --url {edge.url} flow create", tmux_env, tmp_path)
    try:
        term.wait(r"Flow id: ?$")
        term.keys("tty1", "Enter")
        term.wait(r"Name \[tty1\]: ?$")
        term.keys("TTY flow", "Enter")
        term.wait(r"Input URL .*: ?$")
        term.keys(f"rtp://127.0.0.1:{port}", "Enter")
        term.wait(r"Output URL \(empty to finish\): ?$")
        term.keys("ftp://nowhere:1", "Enter")  # a bad URL is explained and asked again
        term.wait(r"scheme must be one of")
        term.keys(f"udp://127.0.0.1:{out_port}", "Enter")
        wait_for(lambda: term.screen().count("Output URL (empty to finish):") == 3, timeout=30)
        term.keys("Enter")
        term.wait(r"^EXIT=0$")
        assert "flow 'tty1' created and started" in term.screen()
    finally:
        term.close()
    flow = mp.data("flow", "show", "tty1")
    assert (flow["name"], flow["input"]["bind_addr"], flow["outputs"][0]["dest_addr"]) == (
        "TTY flow",
        f"127.0.0.1:{port}",
        f"127.0.0.1:{out_port}",
    )

    term = Tmux(f"mp --url {edge.url} flow delete tty1", tmux_env, tmp_path)
    try:
        term.wait(r"Delete flow 'tty1'\? A running flow goes off air\. \[y/N\]: ?$")
        term.keys("n", "Enter")
        term.wait(r"^EXIT=1$")
    finally:
        term.close()
    assert mp.data("flow", "show", "tty1")["id"] == "tty1"
    mp_url = f"mp --url {edge.url}"
    term = Tmux(f"NO_COLOR=1 {mp_url} flow list; {mp_url} flow list; {mp_url} flow delete tty1", tmux_env, tmp_path)
    try:
        term.wait(r"^ID +NAME +ENABLED +INPUT +OUTPUTS")  # a table by default on a terminal
        term.wait(r"\[y/N\]: ?$")
        headers = [line for line in term.screen(colours=True).splitlines() if "ENABLED" in line]
        assert len(headers) == 2
        assert "\x1b[" not in headers[0]  # NO_COLOR=1: plain
        assert "\x1b[1m" in headers[1]  # otherwise a bold header on a terminal
        term.keys("y", "Enter")
        term.wait(r"^EXIT=0$")
    finally:
        term.close()
    assert mp("flow", "show", "tty1").returncode == 3


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no line from mp within {timeout}s")
    return proc.stdout.readline()


def test_piped_watch_reconnects_when_the_edge_restarts(tmp_path: Path, cli_env: dict[str, str]) -> None:
    edge = start_edge(tmp_path / "edge")
    Mp(edge.url, cli_env).ok(
        "flow", "create", "r1", "--name", "R", "--disabled", "--input", f"rtp://127.0.0.1:{free_udp_port()}"
    )
    proc = subprocess.Popen(
        [MP, "--url", edge.url, "stats", "r1", "--watch"],
        env=cli_env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert '"flow_id":"r1"' in _read_line(proc, 30)
        assert edge.stop() == 0
        edge = start_edge(edge.config_dir, port=edge.port)
        for _ in range(3):  # lines buffered before the restart, then one from the new edge
            line = _read_line(proc, 40)
        assert '"flow_id":"r1"' in line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "reconnecting" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        edge.stop()


def test_a_first_connection_that_fails_is_one_line(cli_env: dict[str, str]) -> None:
    from tests.helpers.edge import free_port

    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [MP, "--url", url, "stats", "--watch"], env=cli_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        f"mp: cannot open the stats stream at ws://{url[7:]}/api/v1/ws/stats: connection refused "
        "(is mp-edge running? try: mp health)\n"
    )
