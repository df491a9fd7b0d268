"""The manager's bit-rate history (services/manager/history.py) and its route
``GET /api/v1/nodes/{id}/history``, with a node sending ``stats`` over the real link."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trio

from services.manager.history import DEFAULT_WINDOW_S, MAX_FLOWS_PER_NODE, SWEEP_INTERVAL_S, BitrateHistory
from tests.helpers.manager import Manager
from tests.manager.test_nodes_live import OPERATOR, client_as, live_node
from tests.manager.test_nodes_live import manager as manager  # the module fixture, used by name

NODE = uuid.UUID(int=1)


def stats(*flows: tuple[str, float, list[float]]) -> dict[str, Any]:
    return {
        "flows": [
            {
                "flow_id": fid,
                "flow_name": fid.upper(),
                "input": {"bitrate_bps": inp},
                "outputs": [{"bitrate_bps": o} for o in outs],
            }
            for fid, inp, outs in flows
        ]
    }


def test_samples_once_a_second_and_sums_the_outputs() -> None:
    history = BitrateHistory()
    history.record(NODE, stats(("cam1", 8e6, [8e6, 4e6])), 1000.0)
    history.record(NODE, stats(("cam1", 9e6, [1e6])), 1000.5)  # too soon: skipped
    history.record(NODE, stats(("cam1", 7e6, [])), 1001.0)
    got = history.series(NODE, now=1001.0)
    assert got == {
        "window_secs": DEFAULT_WINDOW_S,
        "flows": [
            {
                "flow_id": "cam1",
                "flow_name": "CAM1",
                "t": [1000.0, 1001.0],
                "input_bps": [8_000_000, 7_000_000],
                "output_bps": [12_000_000, 0],
            }
        ],
    }
    assert history.series(NODE, now=1001.0, seconds=0)["window_secs"] == 1  # at least a second
    assert history.series(uuid.UUID(int=2), now=1001.0) == {"window_secs": DEFAULT_WINDOW_S, "flows": []}


def test_the_ring_keeps_the_last_window_in_order() -> None:
    history = BitrateHistory(window_s=5)
    for second in range(12):
        history.record(NODE, stats(("f", float(second), [])), 100.0 + second)
    flow = history.series(NODE, now=111.0)["flows"][0]
    assert flow["t"] == [106.0, 107.0, 108.0, 109.0, 110.0, 111.0][1:]
    assert flow["input_bps"] == [7, 8, 9, 10, 11]
    assert history.series(NODE, now=111.0, seconds=2)["flows"][0]["t"] == [109.0, 110.0, 111.0]


def test_malformed_payloads_are_skipped() -> None:
    history = BitrateHistory()
    history.record(NODE, {"flows": "nope"}, 1.0)
    history.record(NODE, {"flows": [1, {"flow_id": 5}, {"flow_id": ""}, {"no": "id"}]}, 2.0)
    history.record(
        NODE,
        {
            "flows": [
                {
                    "flow_id": "x",
                    "input": {"bitrate_bps": float("nan")},
                    "outputs": [{"bitrate_bps": -5}, "z", {"bitrate_bps": True}],
                }
            ]
        },
        3.0,
    )
    assert history.series(NODE, now=3.0)["flows"] == [
        {"flow_id": "x", "flow_name": "", "t": [3.0], "input_bps": [0], "output_bps": [0]}
    ]


def test_bounded_flows_and_expiry() -> None:
    history = BitrateHistory(window_s=10)
    many: list[tuple[str, float, list[float]]] = [(f"f{i:03}", 1.0, []) for i in range(MAX_FLOWS_PER_NODE + 5)]
    history.record(NODE, stats(*many), 0.0)
    assert len(history.series(NODE, now=0.0)["flows"]) == MAX_FLOWS_PER_NODE
    other = uuid.UUID(int=3)
    history.record(other, stats(("g", 1.0, [])), 0.0)
    history.record(NODE, stats(("f000", 1.0, [])), 5.0)
    history.record(NODE, stats(("f000", 1.0, [])), 11.0)  # the others sent nothing for > 10 s
    assert [f["flow_id"] for f in history.series(NODE, now=11.0)["flows"]] == ["f000"]
    assert history.node_count() == 2  # the other node is swept once a minute
    history.record(NODE, stats(("f000", 1.0, [])), SWEEP_INTERVAL_S + 1)
    assert history.node_count() == 1


@pytest.mark.e2e
async def test_the_route_serves_what_the_node_sent(manager: Manager) -> None:
    async with client_as(manager) as root, live_node(manager, root) as (node_id, node):
        for rate in (5_000_000, 6_000_000):
            # The hub keeps one sample a second: the node reports (as an edge does, again and
            # again) until the new rate is in the history.
            with trio.fail_after(10):
                while True:
                    await node.send_stats(stats(("cam1", rate, [rate])))
                    got = (await root.get(f"/api/v1/nodes/{node_id}/history")).json()
                    if got["flows"] and rate in got["flows"][0]["input_bps"]:
                        break
                    await trio.sleep(0.2)
        assert got["flows"][0]["flow_id"] == "cam1" and got["window_secs"] == DEFAULT_WINDOW_S
        r = await root.get(f"/api/v1/nodes/{node_id}/history", params={"seconds": "60"})
        assert r.status_code == 200 and r.json()["window_secs"] == 60
        for bad in ("0", "3601", "x", "-1"):
            r = await root.get(f"/api/v1/nodes/{node_id}/history", params={"seconds": bad})
            assert r.status_code == 400 and bad not in r.json()["error"].replace("3600", "")
        assert (await root.get(f"/api/v1/nodes/{uuid.uuid4()}/history")).status_code == 404
        async with client_as(manager, *OPERATOR) as operator:
            assert (await operator.get(f"/api/v1/nodes/{node_id}/history")).status_code == 200
