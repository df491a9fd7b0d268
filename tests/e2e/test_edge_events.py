"""The event bus end to end: ``GET /api/v1/events`` and ``mp events [--follow]`` on a real ``mp-edge``.

The flow events come from the service's lifecycle (flow started: info, category
``flow``); the route and the CLI only read the bus.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.cli.helpers import MP, Mp, one_line_error
from tests.helpers.edge import Edge, auth_section, free_udp_port, running_edge, start_edge, wait_for

pytestmark = pytest.mark.e2e

TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
EVENT_KEYS = {"id", "timestamp", "severity", "category", "message", "details", "flow_id"}


def rtp_to_udp_flow(flow_id: str) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": f"Events {flow_id}",
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{free_udp_port()}"},
        "outputs": [{"type": "udp", "id": "o1", "name": "out", "dest_addr": f"127.0.0.1:{free_udp_port()}"}],
    }


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    with running_edge(tmp_path_factory.mktemp("events")) as started:
        yield started


@pytest.fixture
def api(edge: Edge) -> Iterator[httpx.Client]:
    with edge.client() as client:
        yield client


def get_events(api: httpx.Client, **params: Any) -> dict[str, Any]:
    r = api.get("/api/v1/events", params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"success", "data"} and body["success"] is True
    return body["data"]  # type: ignore[no-any-return]


def flow_started(events: list[dict[str, Any]], flow_id: str) -> dict[str, Any] | None:
    return next(
        (e for e in events if e["category"] == "flow" and e["severity"] == "info" and e["flow_id"] == flow_id), None
    )


# --------------------------------------------------------------------------- the route


def test_the_envelope_and_the_event_shape(api: httpx.Client) -> None:
    data = get_events(api)
    assert set(data) == {"events", "last_id"}
    assert isinstance(data["events"], list) and isinstance(data["last_id"], int) and data["last_id"] >= 0
    assert len(data["events"]) <= min(data["last_id"], 1000)
    ids = [e["id"] for e in data["events"]]
    assert ids == sorted(ids) and (not ids or ids[-1] == data["last_id"])
    for event in data["events"]:
        assert set(event) == EVENT_KEYS and TIMESTAMP.fullmatch(event["timestamp"])
    # ahead of the bus, and the longest `since` accepted (18 digits): nothing, still 200
    assert get_events(api, since=data["last_id"] + 1000)["events"] == []
    assert get_events(api, since="9" * 18)["events"] == []
    assert get_events(api, since="000", limit="1000")["last_id"] >= data["last_id"]  # leading zeros are digits
    assert api.get("/api/v1/events/").status_code == 200  # a trailing slash, as on every route


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("since=-1", "since must be a non-negative integer"),
        ("since=abc", "since must be a non-negative integer"),
        ("since=", "since must be a non-negative integer"),
        ("since=1.5", "since must be a non-negative integer"),
        ("since=%2B1", "since must be a non-negative integer"),  # +1
        ("since=%201", "since must be a non-negative integer"),  # " 1"
        ("since=1_000", "since must be a non-negative integer"),
        ("since=%EF%BC%91", "since must be a non-negative integer"),  # a full-width digit one
        ("since=" + "1" * 19, "since must be a non-negative integer"),
        ("limit=0", "limit must be an integer from 1 to 1000"),
        ("limit=1001", "limit must be an integer from 1 to 1000"),
        ("limit=-5", "limit must be an integer from 1 to 1000"),
        ("limit=ten", "limit must be an integer from 1 to 1000"),
        ("since=2&limit=0", "limit must be an integer from 1 to 1000"),
    ],
)
def test_a_bad_since_or_limit_is_400_without_echo(api: httpx.Client, query: str, error: str) -> None:
    r = api.get("/api/v1/events?" + query)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"success": False, "error": error}
    rejected = httpx.QueryParams(query)
    for name in ("since", "limit"):
        value = rejected.get(name)
        if value and value not in ("0", "1", "2"):
            assert value not in r.text


def test_a_created_flow_has_a_flow_event(api: httpx.Client) -> None:
    before = get_events(api)["last_id"]
    flow = rtp_to_udp_flow("ev1")
    r = api.post("/api/v1/flows", json=flow)
    assert r.status_code == 200, r.text
    try:
        event = wait_for(lambda: flow_started(get_events(api, since=before)["events"], "ev1"), timeout=20)
        assert set(event) == EVENT_KEYS
        assert event["id"] > before and TIMESTAMP.fullmatch(event["timestamp"]) and event["message"]
        # paging: since the id before it, limit 1 gives exactly the oldest new event
        page = get_events(api, since=before, limit=1)
        assert len(page["events"]) == 1 and page["events"][0]["id"] == before + 1
        assert page["last_id"] >= event["id"]
        # since its own id: it is not repeated
        assert all(e["id"] > event["id"] for e in get_events(api, since=event["id"])["events"])
    finally:
        api.delete("/api/v1/flows/ev1")


# --------------------------------------------------------------------------- auth


@pytest.fixture(scope="module")
def auth_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    config = {"version": 1, "server": {"listen_addr": "127.0.0.1", "listen_port": 8080, "auth": auth_section()}}
    with running_edge(tmp_path_factory.mktemp("events-auth"), config=config) as started:
        yield started


def test_any_role_reads_events_and_no_token_is_401(auth_edge: Edge) -> None:
    for role in ("monitor", "admin"):
        with auth_edge.client(role) as client:
            r = client.get("/api/v1/events")
            assert r.status_code == 200, r.text
            assert r.json()["success"] is True and set(r.json()["data"]) == {"events", "last_id"}
    with auth_edge.client() as anonymous:
        r = anonymous.get("/api/v1/events")
        assert r.status_code == 401 and r.json()["success"] is False
        r = anonymous.get("/api/v1/events", headers={"Authorization": "Bearer not-a-token"})
        assert r.status_code == 401 and r.json()["success"] is False
    with auth_edge.client("monitor") as client:  # the token is checked before the query
        assert client.get("/api/v1/events?since=-1").status_code == 400
    with auth_edge.client() as anonymous:
        assert anonymous.get("/api/v1/events?since=-1").status_code == 401


# --------------------------------------------------------------------------- mp events


@pytest.fixture
def mp(edge: Edge, tmp_path: Path) -> Mp:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIAPLANE_", "MP_", "XDG_CONFIG"))}
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1", "COLUMNS": "200"})
    return Mp(edge.url, env)


class LineReader:
    """Reads a subprocess's pipe on a thread, so the test can wait for a line with a deadline."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def until(self, predicate: Any, timeout: float) -> list[str]:
        """Every line read until one matches ``predicate`` (included); fail at the deadline or EOF."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching line from mp within {timeout}s; got {seen!r}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"mp closed its stdout before a matching line; got {seen!r}")
            seen.append(line)
            if predicate(line):
                return seen


def test_mp_events_once(mp: Mp, edge: Edge) -> None:
    with edge.client() as api:
        assert api.post("/api/v1/flows", json=rtp_to_udp_flow("ev2")).status_code == 200
        try:
            listed = wait_for(lambda: flow_started(mp.data("events", "-o", "json"), "ev2"), timeout=20)
            assert set(listed) == EVENT_KEYS
            assert mp.data("events", "--flow", "ev2", "--json") != []
            assert all(e["flow_id"] == "ev2" for e in mp.data("events", "--flow", "ev2", "-o", "json"))
            assert mp.data("events", "--flow", "no-such-flow", "-o", "json") == []
            assert all(e["id"] > listed["id"] for e in mp.data("events", "--since", str(listed["id"]), "-o", "json"))
            table = mp.ok("events", "--flow", "ev2", "-o", "table").stdout.splitlines()
            assert table[0].split() == ["ID", "TIME", "SEVERITY", "CATEGORY", "FLOW", "MESSAGE"]
            row = next(line for line in table[1:] if line.split()[0] == str(listed["id"]))
            assert row.split()[1:5] == [listed["timestamp"][11:], "info", "flow", "ev2"]
            assert mp.ok("events", "--flow", "no-such-flow", "-o", "table").stdout == "no events\n"
            assert mp.ok("events", "--flow", "ev2", "-o", "yaml").stdout.startswith("- severity: ")
        finally:
            api.delete("/api/v1/flows/ev2")
    assert "--since" in one_line_error(mp("events", "--since", "-1"), 2)


def test_mp_events_follow_prints_json_lines_until_ctrl_c(mp: Mp, edge: Edge) -> None:
    proc = subprocess.Popen(
        [MP, "events", "--follow", "-o", "json"],
        env=mp.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        reader = LineReader(proc.stdout)
        with edge.client() as api:
            # the flow is created after mp started following: its event must arrive by polling
            assert api.post("/api/v1/flows", json=rtp_to_udp_flow("ev3")).status_code == 200
            try:
                lines = reader.until(lambda line: flow_started([json.loads(line)], "ev3") is not None, timeout=20)
            finally:
                api.delete("/api/v1/flows/ev3")
        events = [json.loads(line) for line in lines]  # JSON Lines: every line one event object
        assert all(set(e) == EVENT_KEYS for e in events)
        ids = [e["id"] for e in events]
        assert ids == sorted(set(ids))  # in order, never repeated
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130
        assert proc.stderr is not None
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_mp_events_follow_ends_quietly_when_the_reader_goes(mp: Mp, edge: Edge) -> None:
    with edge.client() as api:
        assert api.post("/api/v1/flows", json=rtp_to_udp_flow("ev4")).status_code == 200
        api.delete("/api/v1/flows/ev4")
    # `mp events --follow | head -1`: the pipe closes while no new event is due; mp notices within a poll
    proc = subprocess.Popen(
        [MP, "events", "--follow"], env=mp.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert set(json.loads(proc.stdout.readline())) == EVENT_KEYS  # piped: JSON Lines by default
        proc.stdout.close()
        assert proc.wait(20) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_mp_events_follow_rides_out_an_edge_restart(mp: Mp, tmp_path: Path) -> None:
    edge = start_edge(tmp_path / "restarting")
    proc = subprocess.Popen(
        [MP, "--url", edge.url, "events", "--follow", "-o", "json"],
        env=mp.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = LineReader(proc.stdout), LineReader(proc.stderr)
        with edge.client() as api:
            assert api.post("/api/v1/flows", json=rtp_to_udp_flow("r1") | {"enabled": False}).status_code == 200
        before = out.until(lambda line: json.loads(line)["flow_id"] == "r1", timeout=20)
        assert edge.stop() == 0
        err.until(lambda line: "cannot reach the edge" in line and "retrying" in line, timeout=20)
        edge = start_edge(edge.config_dir, port=edge.port)
        with edge.client() as api:
            assert api.post("/api/v1/flows", json=rtp_to_udp_flow("r2") | {"enabled": False}).status_code == 200
        after = out.until(lambda line: json.loads(line)["flow_id"] == "r2", timeout=20)
        # the new edge numbers from 1 again: its events are printed from 1, and no old one again
        assert json.loads(after[0])["id"] == 1
        last_before = json.loads(before[-1])["timestamp"]
        assert all(json.loads(line)["timestamp"] > last_before for line in after)
        notes = err.until(lambda line: "restarted" in line, timeout=5)
        assert any("the edge answers again" in line for line in notes)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        edge.stop()
