"""Two ``mp-manager`` instances on one PostgreSQL behind a real HAProxy, real edges (issue 22).

One module-scoped fleet (``tests/helpers/fleet.py``): a throwaway PostgreSQL, two
``mp-manager serve --tls-mode behind_proxy`` on one database, HAProxy in front (``leastconn``,
``GET /health`` checks), and two ``mp-edge`` registered through HAProxy, one landing on each
instance. Requests go to each instance directly, by its own port, so it is known which instance
answers. What is checked:

- a command sent to either instance reaches the edge whose socket the other holds (the outbox
  and LISTEN/NOTIFY), with its effect on the edge and the edge's error text coming back;
- an event raised on an edge is listed by the other instance, whose dashboard stream and node
  list show the edge online with its stats;
- a session made on one instance works on the other, and a logout on either ends it on both;
- through HAProxy: login, the REST API and the dashboard's WebSocket; a client's own
  ``X-Forwarded-For`` does not reach the login limit (HAProxy's view of the client does);
- a rolling restart: SIGTERM of the instance holding an edge moves it at once, and the instance
  started again rejoins;
- failover (last: it kills an instance): SIGKILL of the instance holding two edges; the live
  one is back through HAProxy on the survivor within 30 s, nothing recorded before is lost, the
  events raised during the outage arrive; the frozen one (SIGSTOP) is marked offline by the
  survivor once the dead instance's lease lapses, and comes back when thawed;
- SQLite, without PostgreSQL: a second ``serve`` on the same data directory exits 2.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.fleet import (
    LIVE,
    FleetEdge,
    ManagerFleet,
    dashboard_update,
    manager_args,
    node_in,
    require_haproxy,
    rtp_flow,
    running_manager_fleet,
    session_of,
    wait_until,
)
from tests.helpers.manager import ADMIN_PASSWORD, ADMIN_USER, Manager, start_manager
from tests.helpers.postgres import require_postgres

pytestmark = pytest.mark.e2e


@dataclass
class Fleet:
    fleet: ManagerFleet
    admins: dict[int, httpx.Client]
    """A signed-in super_admin client per instance index, direct to that instance."""
    session: str
    """A session JWT (made on m0) for the dashboard streams."""
    edges: list[FleetEdge]

    def admin(self, manager: Manager) -> httpx.Client:
        return self.admins[self.fleet.index(manager)]


def edge_flows() -> list[dict[str, Any]]:
    """cam1 running, cam2 stopped; new UDP ports on each call (one call per edge)."""
    return [rtp_flow("cam1", enabled=True), rtp_flow("cam2")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_postgres()
    require_haproxy()
    tmp_path = tmp_path_factory.mktemp("fleet")
    with running_manager_fleet(tmp_path) as managers:
        admins = {index: managers.admin(m) for index, m in enumerate(managers.managers)}
        try:
            try:
                # leastconn sends the second edge to the instance the first did not take.
                edges = managers.add_edges([(name, edge_flows()) for name in ("ob-truck-1", "ob-truck-2")])
                session, _ = session_of(managers.managers[0])
            except BaseException:
                print(managers.diagnostics())
                raise
            yield Fleet(managers, admins, session, edges)
        finally:
            for client in admins.values():
                client.close()


@pytest.fixture(autouse=True)
def _logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failing test prints every process's log (pytest shows it under "teardown")."""
    failed_before = request.session.testsfailed
    yield
    running = getattr(request.node, "funcargs", {}).get("fleet")  # only when it was set up
    if request.session.testsfailed > failed_before and isinstance(running, Fleet):
        print(running.fleet.diagnostics())


def command(admin: httpx.Client, node_id: str, action: dict[str, Any]) -> httpx.Response:
    return admin.post(f"/api/v1/nodes/{node_id}/command", json={"action": action}, timeout=30)


def events(admin: httpx.Client, node_id: str) -> list[dict[str, Any]]:
    """The manager's events of ``node_id``, oldest first."""
    answer = admin.get("/api/v1/events", params={"node_id": node_id, "per_page": 200})
    assert answer.status_code == 200, answer.text
    return list(reversed(answer.json()))


def has_event(admin: httpx.Client, node_id: str, message: str, flow_id: str, after_id: int = 0) -> bool:
    return any(
        e["message"] == message and e["flow_id"] == flow_id and e["id"] > after_id for e in events(admin, node_id)
    )


def is_live(admin: httpx.Client, node_id: str) -> bool:
    """Connected, as ``GET /api/v1/nodes`` lists it (``error``: a flow without input is Critical)."""
    return node_status(admin, node_id) in LIVE


def node_status(admin: httpx.Client, node_id: str) -> str:
    listed = {n["id"]: n for n in admin.get("/api/v1/nodes").json()}
    return str(listed[node_id]["status"])


def live_with_stats(update: dict[str, Any], node_id: str) -> bool:
    node = node_in(update, node_id)
    return node is not None and node["status"] in LIVE and bool(node["stats"] and node["stats"].get("flows"))


def test_each_edge_is_held_by_a_different_instance(fleet: Fleet) -> None:
    holders = [fleet.fleet.wait_holder(e.node_id) for e in fleet.edges]
    assert holders[0] is not holders[1], "leastconn put both edges on one instance"
    for fleet_edge in fleet.edges:
        assert fleet_edge.link()["state"] == "connected"


def test_a_command_to_either_instance_reaches_the_edge_the_other_holds(fleet: Fleet) -> None:
    for manager in fleet.fleet.managers:
        # The edge whose socket the *other* instance holds.
        remote = next(e for e in fleet.edges if fleet.fleet.holder(e.node_id) is not manager)
        _command_through(fleet, manager, remote)


def _command_through(fleet: Fleet, manager: Manager, remote: FleetEdge) -> None:
    admin = fleet.admin(manager)
    started = time.monotonic()
    stopped = command(admin, remote.node_id, {"type": "stop_flow", "flow_id": "cam1"})
    took = time.monotonic() - started
    assert stopped.status_code == 200, stopped.text
    assert stopped.json()["success"] is True
    print(f"m{fleet.fleet.index(manager)} -> {remote.name}: stop_flow answered in {took * 1000:.0f} ms")
    wait_until(lambda: remote.flow_state("cam1") == "Stopped", 10, f"{remote.name} cam1 stopped")

    # The edge's own error text comes back through the other instance too.
    again = command(admin, remote.node_id, {"type": "stop_flow", "flow_id": "nope"})
    assert again.status_code == 422, again.text
    assert again.json()["error"] == "flow 'nope' not found"

    config = command(admin, remote.node_id, {"type": "get_config"})
    assert config.status_code == 200, config.text
    assert [f["id"] for f in config.json()["data"]["flows"]] == ["cam1", "cam2"]

    restarted = command(admin, remote.node_id, {"type": "start_flow", "flow_id": "cam1"})
    assert restarted.status_code == 200, restarted.text
    wait_until(lambda: remote.flow_state("cam1") == "Running", 10, f"{remote.name} cam1 running")


def test_an_edge_event_and_its_live_stats_show_on_the_other_instance(fleet: Fleet) -> None:
    for fleet_edge in fleet.edges:
        _event_and_stats_on_the_other(fleet, fleet_edge)


def _event_and_stats_on_the_other(fleet: Fleet, fleet_edge: FleetEdge) -> None:
    holder = fleet.fleet.wait_holder(fleet_edge.node_id)
    other = fleet.fleet.other(holder)
    admin = fleet.admin(other)
    node_id = fleet_edge.node_id
    newest = max((e["id"] for e in events(admin, node_id)), default=0)
    # Raised on the edge itself (its REST API), not through a manager.
    with fleet_edge.client() as client:
        assert client.post("/api/v1/flows/cam2/start").status_code == 200
    try:
        wait_until(
            lambda: has_event(admin, node_id, "flow started", "cam2", newest),
            15,
            f"'flow started' of {fleet_edge.name} in the other instance's events",
        )
    finally:
        with fleet_edge.client() as client:
            assert client.post("/api/v1/flows/cam2/stop").status_code == 200
    wait_until(
        lambda: has_event(admin, node_id, "flow stopped", "cam2", newest),
        15,
        f"'flow stopped' of {fleet_edge.name} in the other instance's events",
    )
    assert is_live(admin, node_id), node_status(admin, node_id)

    update = dashboard_update(other, fleet.session, lambda m: live_with_stats(m, node_id))
    shown = node_in(update, node_id)
    assert shown is not None
    assert shown["name"] == fleet_edge.name and shown["device_type"] == "edge"
    assert "cam1" in {f["flow_id"] for f in shown["stats"]["flows"]}, shown["stats"]
    assert shown["health"] is not None and shown["software_version"]
    assert update["payload"]["online_count"] == 2


def test_a_session_made_on_one_instance_works_on_the_other_until_logout(fleet: Fleet) -> None:
    first, second = fleet.fleet.managers
    session, csrf = session_of(first)
    cookie = {"Cookie": f"session={session}"}
    bearer = {"Authorization": f"Bearer {session}"}
    for manager in (first, second):
        with manager.client() as client:
            for headers in (cookie, bearer):
                answer = client.get("/api/v1/nodes", headers=headers)
                assert answer.status_code == 200, answer.text
    # A settings change on one instance is what the other reads.
    with second.client(headers=cookie) as client:
        changed = client.put(
            "/api/v1/settings", json={"settings": {"stats_broadcast_interval_ms": 500}}, headers={"X-CSRF-Token": csrf}
        )
        assert changed.status_code == 200, changed.text
    try:
        assert fleet.admin(first).get("/api/v1/settings").json()["stats_broadcast_interval_ms"] == 500
    finally:
        restored = fleet.admin(first).put("/api/v1/settings", json={"settings": {"stats_broadcast_interval_ms": 1000}})
        assert restored.status_code == 200, restored.text

    with second.client() as client:
        out = client.post("/api/v1/auth/logout", headers={**bearer, "X-CSRF-Token": "bearer-client"})
        assert out.status_code == 200, out.text
    for manager in (first, second):
        with manager.client() as client:
            for headers in (cookie, bearer):
                answer = client.get("/api/v1/nodes", headers=headers)
                assert answer.status_code == 401, (manager.port, answer.status_code, answer.text)


def test_through_haproxy_rest_and_the_dashboard_stream_work_and_the_client_ip_is_haproxys(fleet: Fleet) -> None:
    lb = fleet.fleet.lb
    assert lb is not None
    spoofed = "203.0.113.9"
    before = fleet.fleet.query("SELECT coalesce(max(id), 0) FROM login_attempts")[0][0]
    with httpx.Client(base_url=lb.url, timeout=20) as client:
        # A client's own X-Forwarded-For is dropped: the login limit counts the address HAProxy saw.
        answer = client.post(
            "/api/v1/auth/login",
            json={"username": ADMIN_USER, "password": ADMIN_PASSWORD},
            headers={"X-Forwarded-For": spoofed},
        )
        assert answer.status_code == 200, answer.text
        session = client.cookies.get("session")
        assert session
        listed = client.get("/api/v1/nodes")
        assert listed.status_code == 200, listed.text
        assert {n["id"] for n in listed.json()} >= {e.node_id for e in fleet.edges}
    recorded = fleet.fleet.query("SELECT identifier FROM login_attempts WHERE kind = 'login' AND id > %s", int(before))
    assert recorded == [("127.0.0.1",)], recorded
    # The dashboard's WebSocket upgrades through HAProxy and shows every edge, wherever it is held.
    update = dashboard_update(lb, session, lambda m: all(live_with_stats(m, e.node_id) for e in fleet.edges))
    assert update["payload"]["online_count"] >= len(fleet.edges)


def test_a_second_sqlite_instance_refuses_to_start(tmp_path: Path) -> None:
    first = start_manager(tmp_path / "solo")
    try:
        second = start_manager(tmp_path / "solo", wait=False)
        try:
            code = second.process.wait(30)
        finally:
            second.stop()
        output = second.run_log()
        assert code == 2, output
        assert "another mp-manager" in output, output
        with first.client(timeout=5) as client:
            assert client.get("/health").status_code == 200
        assert first.process.poll() is None
    finally:
        first.stop()


def test_a_rolling_restart_moves_the_nodes_and_the_instance_rejoins(fleet: Fleet) -> None:
    """SIGTERM the instance holding an edge: the edge moves to the other through HAProxy at once
    (no 10 s lease to wait for); the instance, started again on its port, rejoins the fleet."""
    managers = fleet.fleet
    lb = managers.lb
    assert lb is not None
    moving = fleet.edges[0]
    stopping = managers.wait_holder(moving.node_id)
    index = managers.index(stopping)
    staying = managers.other(stopping)
    admin = fleet.admin(staying)
    newest = max((e["id"] for e in events(admin, moving.node_id)), default=0)

    stopped_at = time.monotonic()
    assert stopping.stop() == 0, stopping.run_log()[-3000:]
    wait_until(lambda: managers.holder(moving.node_id) is staying, 20, f"{moving.name} on the other instance")
    wait_until(lambda: moving.link()["state"] == "connected", 20, f"{moving.name}'s link connected")
    print(f"{moving.name} moved {time.monotonic() - stopped_at:.1f} s after SIGTERM of its instance")
    wait_until(lambda: is_live(admin, moving.node_id), 15, f"{moving.name} live on the other instance")
    # The hand-over shows in the events: disconnected (the clean stop), then connected again.
    connection = [
        e["message"] for e in events(admin, moving.node_id) if e["id"] > newest and e["category"] == "connection"
    ]
    assert connection[-1:] == ["Node connected to manager"], connection

    restarted = start_manager(stopping.data_dir, extra_args=manager_args(managers.database_url), port=stopping.port)
    managers.managers[index] = restarted
    fleet.admins[index].close()
    fleet.admins[index] = managers.admin(restarted)
    wait_until(lambda: lb.server_states().get(f"m{index}") == "UP", 15, f"HAProxy sees m{index} UP again")
    # The new instance commands the node the other holds, and lists it live.
    assert is_live(fleet.admins[index], moving.node_id)
    answer = command(fleet.admins[index], moving.node_id, {"type": "get_config"})
    assert answer.status_code == 200, answer.text


def test_failover_when_the_instance_holding_edges_is_killed(fleet: Fleet) -> None:
    """Last in the module: it leaves one instance.

    Two more edges join; the victim is the instance holding the first of them, which is frozen
    (SIGSTOP) before the kill, so it cannot reconnect: the dead instance's lease on it must
    lapse and a survivor must mark it offline. A live edge the victim held reconnects through
    HAProxy on its own. (``leastconn`` leaves the victim at least one live edge, whichever
    instance the earlier tests left the edges on.)"""
    managers = fleet.fleet
    frozen, joined = managers.add_edges([("ob-truck-3", [rtp_flow("cam1")]), ("ob-truck-4", edge_flows())])
    victim = managers.wait_holder(frozen.node_id)
    survivor = managers.other(victim)
    live = [*fleet.edges, joined]
    target = next(e for e in live if managers.holder(e.node_id) is victim)
    admin = fleet.admin(survivor)

    # Before the kill: one command through each instance, both 200, their events listed.
    before = max((e["id"] for e in events(admin, target.node_id)), default=0)
    assert command(fleet.admin(victim), target.node_id, {"type": "stop_flow", "flow_id": "cam1"}).status_code == 200
    routed = command(admin, target.node_id, {"type": "start_flow", "flow_id": "cam2"})
    assert routed.status_code == 200, routed.text
    wait_until(lambda: has_event(admin, target.node_id, "flow stopped", "cam1", before), 15, "cam1 stopped listed")
    wait_until(lambda: has_event(admin, target.node_id, "flow started", "cam2", before), 15, "cam2 started listed")
    recorded = {e.node_id: {row["id"] for row in events(admin, e.node_id)} for e in (*live, frozen)}

    frozen.edge.process.send_signal(signal.SIGSTOP)
    try:
        killed_at = time.monotonic()
        victim.stop(signal.SIGKILL)
        # Raised at once on the edge, while its link is down or coming back: queued, then delivered.
        with target.client() as client:
            assert client.post("/api/v1/flows/cam1/start").status_code == 200
        link_seen = target.link()["state"]

        wait_until(lambda: managers.holder(target.node_id) is survivor, 30, f"{target.name} held by the survivor")
        wait_until(lambda: target.link()["state"] == "connected", 30, f"{target.name}'s link connected")
        back_after = time.monotonic() - killed_at
        print(f"{target.name} back on the survivor {back_after:.1f} s after SIGKILL (link {link_seen!r} just after)")
        assert back_after < 30

        # The commands' effects stand; the outage's event arrived; nothing earlier was lost.
        assert target.flow_state("cam1") == "Running" and target.flow_state("cam2") == "Running"
        wait_until(
            lambda: has_event(admin, target.node_id, "flow started", "cam1", max(recorded[target.node_id])),
            20,
            "the event raised during the failover, on the survivor",
        )
        update = dashboard_update(survivor, fleet.session, lambda m: live_with_stats(m, target.node_id), timeout=20)
        assert live_with_stats(update, target.node_id)

        # The frozen edge: the dead instance's lease lapses (10 s) and the survivor marks it
        # offline, with the usual critical event; its stats leave the dashboard.
        wait_until(lambda: node_status(admin, frozen.node_id) == "offline", 30, f"{frozen.name} offline")
        offline_after = time.monotonic() - killed_at
        print(f"{frozen.name} (frozen) marked offline by the survivor {offline_after:.1f} s after SIGKILL")
        gone = [
            e
            for e in events(admin, frozen.node_id)
            if e["id"] not in recorded[frozen.node_id] and e["message"] == "Node disconnected from manager"
        ]
        assert gone and gone[0]["severity"] == "critical" and gone[0]["category"] == "connection", gone
        update = dashboard_update(
            survivor, fleet.session, lambda m: (node_in(m, frozen.node_id) or {}).get("status") == "offline"
        )
        assert (node_in(update, frozen.node_id) or {}).get("stats") is None
        # No instance holds it now: a command is refused at once, as for any node not connected.
        refused = command(admin, frozen.node_id, {"type": "get_config"})
        assert refused.status_code == 502, refused.text
        victim_id = managers.instance_id(victim)
        assert not managers.query("SELECT 1 FROM node_connections WHERE instance_id = %s", victim_id)
        # …and the nodes that came back are not marked offline by that sweep.
        for fleet_edge in live:
            assert is_live(admin, fleet_edge.node_id), (fleet_edge.name, node_status(admin, fleet_edge.node_id))
            assert managers.holder(fleet_edge.node_id) is survivor
    finally:
        frozen.edge.process.send_signal(signal.SIGCONT)

    for node_id, ids in recorded.items():
        assert ids <= {e["id"] for e in events(admin, node_id)}, f"events of {node_id} lost"
    # Thawed, the third edge finds the survivor through HAProxy too, and obeys it.
    wait_until(lambda: managers.holder(frozen.node_id) is survivor, 30, f"{frozen.name} back on the survivor")
    wait_until(lambda: is_live(admin, frozen.node_id), 15, f"{frozen.name} live again")
    after = command(admin, target.node_id, {"type": "stop_flow", "flow_id": "cam2"})
    assert after.status_code == 200, after.text
    wait_until(lambda: target.flow_state("cam2") == "Stopped", 10, "cam2 stopped by the survivor")
    assert command(admin, frozen.node_id, {"type": "get_config"}).status_code == 200
