"""Checking an edge config on the manager before sending it (services/manager/config_check.py)
and its route ``POST /api/v1/nodes/{id}/config/validate``, against a node on the real link."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from services.manager.config_check import edge_config_problems
from tests.helpers.manager import Manager
from tests.manager.test_nodes_live import OPERATOR, client_as, live_node
from tests.manager.test_nodes_live import manager as manager  # the module fixture, used by name

PASSPHRASE = "correct-horse-battery-42"
PUBLIC: dict[str, Any] = {
    "version": 1,
    "device_name": "ob-truck-3",
    "server": {"listen_addr": "0.0.0.0", "listen_port": 8080},
    "flows": [
        {
            "id": "cam1",
            "name": "Camera 1",
            "input": {"type": "udp", "bind_addr": "127.0.0.1:5000"},
            "outputs": [{"id": "o1", "name": "Out", "type": "udp", "dest_addr": "127.0.0.1:6000"}],
        }
    ],
    # As the node reports it: the tunnel's key and bind secret are stripped (interop.md 2.7).
    "tunnels": [
        {
            "id": str(uuid.uuid4()),
            "name": "to-studio",
            "protocol": "udp",
            "mode": "relay",
            "direction": "egress",
            "local_addr": "127.0.0.1:7000",
            "relay_addr": "relay.example:4433",
        }
    ],
}


def edited(**changes: Any) -> dict[str, Any]:
    config = copy.deepcopy(PUBLIC)
    config.update(changes)
    return config


def test_a_reported_config_is_valid_without_its_stripped_secrets() -> None:
    assert edge_config_problems(PUBLIC) == []


def test_problems_name_the_path_and_never_the_value() -> None:
    config = edited()
    config["flows"][0]["input"]["bind_addr"] = "not an address"
    config["flows"][0]["outputs"][0]["bogus"] = PASSPHRASE
    config["flows"].append(copy.deepcopy(config["flows"][0]) | {"outputs": []})
    config["flows"][1]["input"] = {
        "type": "srt",
        "mode": "listener",
        "local_addr": "0.0.0.0:9000",
        "passphrase": "short",
    }
    problems = edge_config_problems(config)
    paths = [p["path"] for p in problems]
    assert "flows.0.input.bind_addr" in paths
    assert "flows.0.outputs.0.bogus" in paths
    assert any(p["path"].startswith("flows.1.input") for p in problems)
    text = repr(problems)
    assert PASSPHRASE not in text and "short" not in text.replace("shorter", "") and "not an address" not in text


def test_duplicates_and_shapes() -> None:
    twice = edited(flows=[PUBLIC["flows"][0], PUBLIC["flows"][0]])
    problems = edge_config_problems(twice)
    assert len(problems) == 1 and problems[0]["path"] == "body" and "duplicate flow id" in problems[0]["message"]
    tunnels = edited(tunnels=[PUBLIC["tunnels"][0], PUBLIC["tunnels"][0]])
    assert edge_config_problems(tunnels) == [{"path": "tunnels.1.id", "message": "duplicate tunnel id"}]
    assert edge_config_problems(edited(tunnels={"a": 1})) == [{"path": "tunnels", "message": "must be a list"}]
    assert [p["path"] for p in edge_config_problems(edited(version=2))] == ["version"]
    bad_tunnel = edited(tunnels=[PUBLIC["tunnels"][0] | {"relay_addr": None}])
    assert [p["path"] for p in edge_config_problems(bad_tunnel)] == ["tunnels.0"]  # relay_addr required
    assert edge_config_problems(edited(tunnels=[PUBLIC["tunnels"][0] | {"direction": "sideways"}]))[0]["path"] == (
        "tunnels.0.direction"
    )


@pytest.mark.e2e
async def test_the_route(manager: Manager) -> None:
    async with client_as(manager) as root, live_node(manager, root) as (node_id, _node):
        url = f"/api/v1/nodes/{node_id}/config/validate"
        r = await root.post(url, json=PUBLIC)
        assert r.status_code == 200 and r.json() == {"valid": True, "errors": []}
        bad = edited(flows=[{"id": "cam1"}])
        r = await root.post(url, json=bad)
        assert r.status_code == 200 and r.json()["valid"] is False
        assert {"path": "flows.0.name", "message": "Field required"} in r.json()["errors"]
        assert (await root.post(url, content=b"[1]", headers={"Content-Type": "application/json"})).status_code == 400
        big = edited(device_name="x" * (101 * 1024))
        assert (await root.post(url, json=big)).status_code == 413
        assert (await root.post(f"/api/v1/nodes/{uuid.uuid4()}/config/validate", json=PUBLIC)).status_code == 404
        async with live_node(manager, root, device_type="relay") as (relay_id, _relay):
            r = await root.post(f"/api/v1/nodes/{relay_id}/config/validate", json=PUBLIC)
            assert r.status_code == 400
        async with client_as(manager, *OPERATOR) as operator:
            assert (await operator.post(url, json=PUBLIC)).status_code == 200
