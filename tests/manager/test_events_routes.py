"""``/api/v1/events`` against a real ``mp-manager serve`` (interop.md 7.3, 7.1 node access, 13).

Events are written into the manager's own SQLite file by a second ``Store``, as a node's
``event`` messages would be by the hub.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import httpx
import pytest
import trio

from services.manager.store import EventSeverity, NewEvent, Store, sqlite_url
from tests.helpers.manager import Manager, login, start_manager
from tests.manager.test_auth import prepared_data_dir

pytestmark = pytest.mark.e2e

NODE_A = "11111111-1111-4111-8111-111111111111"
NODE_B = "22222222-2222-4222-8222-222222222222"
NODE_C = "33333333-3333-4333-8333-333333333333"
T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
ROW_KEYS = {
    "id",
    "node_id",
    "severity",
    "category",
    "message",
    "details",
    "flow_id",
    "created_at",
    "acknowledged",
    "acknowledged_by",
}
PASSWORD = "Events-passw0rd"
USERS = {
    "viewer": ("viewer", None),
    "viewer-a": ("viewer", [NODE_A]),
    "viewer-ab": ("viewer", [NODE_A, NODE_B]),
    "viewer-none": ("viewer", []),
    "operator": ("operator", None),
    "operator-a": ("operator", [NODE_A]),
    "admin": ("admin", [NODE_C]),  # admins see every node whatever the list says
}


def events_for(node: str, i: int) -> NewEvent:
    severity = (EventSeverity.INFO, EventSeverity.WARNING, EventSeverity.CRITICAL)[i % 3]
    return NewEvent(
        node_id=None if node == "-" else UUID(node),
        severity=severity,
        category="flow" if i % 2 else "connection",
        message=f"{node[:4]} event {i} 100%_done",
        details={"i": i},
        flow_id=f"flow-{i % 4}",
        created_at=T0 + dt.timedelta(minutes=i),
    )


def insert(data_dir: Path, batch: list[NewEvent]) -> None:
    async def write() -> None:
        async with await Store.open(sqlite_url(data_dir)) as store:
            await store.add_events(batch)

    trio.run(write)


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    data_dir = prepared_data_dir(tmp_path_factory.mktemp("events"))
    # 30 events: 10 per node A, B, C, and 3 manager events with no node.
    batch = [events_for(node, i) for i, node in enumerate([NODE_A, NODE_B, NODE_C] * 10)]
    batch += [events_for("-", 30 + i) for i in range(3)]
    insert(data_dir, batch)
    started = start_manager(data_dir)
    try:
        with started.client() as root:
            login(root)
            for name, (role, nodes) in USERS.items():
                body = {"username": name, "password": PASSWORD, "role": role, "allowed_node_ids": nodes}
                assert root.post("/api/v1/users", json=body).status_code == 201
        yield started
    finally:
        started.stop()


@contextlib.contextmanager
def as_user(manager: Manager, name: str | None = None) -> Iterator[httpx.Client]:
    with manager.client() as c:
        r = login(c) if name is None else login(c, name, PASSWORD)
        assert r.status_code == 200, r.text
        yield c


@pytest.fixture
def root(manager: Manager) -> Iterator[httpx.Client]:
    with as_user(manager) as c:
        yield c


def test_list_is_a_bare_array_newest_first_with_a_total(root: httpx.Client) -> None:
    r = root.get("/api/v1/events")
    assert r.status_code == 200
    rows = r.json()
    assert isinstance(rows, list) and len(rows) == 33
    assert r.headers["X-Total-Count"] == "33"
    assert all(set(row) == ROW_KEYS for row in rows)
    times = [row["created_at"] for row in rows]
    assert times == sorted(times, reverse=True)
    assert rows[-1]["created_at"] == "2026-11-20T08:00:00.000Z"
    assert rows[-1]["details"] == {"i": 0} and rows[-1]["acknowledged"] is False


def test_pages(root: httpx.Client) -> None:
    first = root.get("/api/v1/events", params={"per_page": 10})
    assert len(first.json()) == 10 and first.headers["X-Total-Count"] == "33"
    last = root.get("/api/v1/events", params={"per_page": 10, "page": 4})
    assert len(last.json()) == 3 and last.headers["X-Total-Count"] == "33"
    beyond = root.get("/api/v1/events", params={"per_page": 10, "page": 5})
    assert beyond.json() == [] and beyond.headers["X-Total-Count"] == "33"
    assert len(root.get("/api/v1/events", params={"per_page": 200}).json()) == 33


def test_filters(root: httpx.Client) -> None:
    def total(**params: str) -> int:
        r = root.get("/api/v1/events", params=params)
        assert r.status_code == 200, r.text
        assert len(r.json()) == int(r.headers["X-Total-Count"])
        return len(r.json())

    assert total(node_id=NODE_A) == 10
    assert total(severity="critical") == 11
    assert total(category="flow") == 16
    assert total(flow_id="flow-1") == 8
    assert total(node_id=NODE_B, severity="warning") == 10  # node i % 3, severity i % 3
    assert total(node_id=NODE_B, severity="critical") == 0
    assert total(search="2222") == 10  # node id match
    assert total(search="CRITICAL") == 11  # severity, case-insensitive
    assert total(search="event 1") == 11  # message: 1, 10-19
    assert total(search="100%_") == 33  # % and _ are literal
    assert total(search="0%x") == 0
    assert total(**{"from": "2026-11-20T08:10:00Z", "to": "2026-11-20T08:19:00+00:00"}) == 10
    assert total(**{"from": "2026-11-20T09:10:00.000+01:00"}) == 23


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"per_page": "201"}, "per_page"),
        ({"per_page": "0"}, "per_page"),
        ({"page": "0"}, "page"),
        ({"page": "x-secret-x"}, "page"),
        ({"search": "s" * 257}, "search"),
        ({"from": "yesterday-secret"}, "from"),
        ({"to": "2026-11-20T08:00:00"}, "to"),  # no offset: not RFC 3339
        ({"severity": "fatal-secret"}, "severity"),
        ({"node_id": "not-a-uuid-secret"}, "node_id"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter_not_the_value(
    root: httpx.Client, params: dict[str, str], named: str
) -> None:
    r = root.get("/api/v1/events", params=params)
    assert r.status_code == 400
    error = r.json()["error"]
    assert named in error and "secret" not in error and "sss" not in error


def test_search_of_256_chars_is_accepted(root: httpx.Client) -> None:
    r = root.get("/api/v1/events", params={"search": "s" * 256})
    assert r.status_code == 200 and r.json() == []


def test_ack_is_idempotent_and_counts_follow(manager: Manager, root: httpx.Client) -> None:
    before = root.get("/api/v1/events/count")
    assert before.status_code == 200 and set(before.json()) == {"count"}
    target = root.get("/api/v1/events", params={"node_id": NODE_C, "severity": "critical"}).json()[0]
    with as_user(manager, "operator") as operator:
        r = operator.post(f"/api/v1/events/{target['id']}/ack")
        assert r.status_code == 200 and r.content == b""
        assert operator.get("/api/v1/events/count").json() == {"count": before.json()["count"] - 1}
        again = operator.post(f"/api/v1/events/{target['id']}/ack")
        assert again.status_code == 200 and again.content == b""
    # Acked again by someone else: the first acknowledgement is kept.
    assert root.post(f"/api/v1/events/{target['id']}/ack").status_code == 200
    row = next(e for e in root.get("/api/v1/events", params={"node_id": NODE_C}).json() if e["id"] == target["id"])
    assert row["acknowledged"] is True and row["acknowledged_by"] == "operator"
    assert root.get("/api/v1/events/count").json() == {"count": before.json()["count"] - 1}
    # An info event acked does not change the count.
    info = root.get("/api/v1/events", params={"severity": "info", "node_id": NODE_A}).json()[0]
    assert root.post(f"/api/v1/events/{info['id']}/ack").status_code == 200
    assert root.get("/api/v1/events/count").json() == {"count": before.json()["count"] - 1}


@pytest.mark.parametrize("event_id", ["999999", "abc", "-1", "1.5"])
def test_ack_of_an_unknown_event_is_404(root: httpx.Client, event_id: str) -> None:
    r = root.post(f"/api/v1/events/{event_id}/ack")
    assert r.status_code == 404 and r.json() == {"error": "event not found"}


def test_role_matrix(manager: Manager) -> None:
    with manager.client() as anonymous:
        assert anonymous.get("/api/v1/events").status_code == 401
        assert anonymous.get("/api/v1/events/count").status_code == 401
        assert anonymous.post("/api/v1/events/1/ack", headers={"X-CSRF-Token": "x"}).status_code == 401
    with as_user(manager, "viewer") as viewer:
        assert viewer.get("/api/v1/events").status_code == 200
        assert viewer.get("/api/v1/events/count").status_code == 200
        assert viewer.post("/api/v1/events/1/ack").status_code == 403
        # 403 role comes before 404 lookup (interop.md 13).
        assert viewer.post("/api/v1/events/999999/ack").status_code == 403
    with as_user(manager, "operator") as operator:
        csrf = operator.headers.pop("X-CSRF-Token")
        assert operator.post("/api/v1/events/1/ack").status_code == 403  # CSRF
        operator.headers["X-CSRF-Token"] = csrf
        assert operator.post("/api/v1/events/1/ack").status_code == 200


def test_viewers_see_only_their_nodes(manager: Manager, root: httpx.Client) -> None:
    def nodes_seen(c: httpx.Client, **params: str) -> tuple[set[str | None], str]:
        r = c.get("/api/v1/events", params={"per_page": 200, **params})
        assert r.status_code == 200, r.text
        return {row["node_id"] for row in r.json()}, r.headers["X-Total-Count"]

    with as_user(manager, "viewer-a") as a:
        assert nodes_seen(a) == ({NODE_A}, "10")
        assert nodes_seen(a, node_id=NODE_A) == ({NODE_A}, "10")
        assert a.get("/api/v1/events", params={"node_id": NODE_B}).status_code == 403
        assert nodes_seen(a, search="3333") == (set(), "0")
        counted = a.get("/api/v1/events/count").json()["count"]
        expected = root.get("/api/v1/events", params={"node_id": NODE_A, "per_page": 200}).json()
        assert counted == sum(1 for e in expected if e["severity"] != "info" and not e["acknowledged"])
    with as_user(manager, "viewer-ab") as ab:
        assert nodes_seen(ab) == ({NODE_A, NODE_B}, "20")
        assert nodes_seen(ab, severity="warning")[0] <= {NODE_A, NODE_B}
        page = ab.get("/api/v1/events", params={"per_page": 5, "page": 2})
        assert len(page.json()) == 5 and page.headers["X-Total-Count"] == "20"
        assert ab.get("/api/v1/events", params={"node_id": NODE_C}).status_code == 403
    with as_user(manager, "viewer-none") as none:
        assert nodes_seen(none) == (set(), "0")
        assert none.get("/api/v1/events/count").json() == {"count": 0}
    with as_user(manager, "admin") as admin:
        assert nodes_seen(admin)[1] == "33"
    c_event = root.get("/api/v1/events", params={"node_id": NODE_C}).json()[0]
    a_event = root.get("/api/v1/events", params={"node_id": NODE_A}).json()[0]
    with as_user(manager, "operator-a") as operator_a:
        assert operator_a.post(f"/api/v1/events/{c_event['id']}/ack").status_code == 403
        assert operator_a.post(f"/api/v1/events/{a_event['id']}/ack").status_code == 200
        assert nodes_seen(operator_a)[0] == {NODE_A}
