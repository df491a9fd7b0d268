"""The ``update_config`` planner (``services.edge.config_diff``): what changes at runtime, table-driven."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from appliance.config.store import merge_kept_secrets
from appliance.models.config import AppConfig
from services.edge.config_diff import ConfigPlan, plan_config_change

TUNNEL_ID = str(uuid.UUID(int=0x1234, version=4))
KEY_A = "ab" * 32
KEY_B = "cd" * 32


def flow(flow_id: str, port: int, *outputs: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "id": flow_id,
        "name": f"Flow {flow_id}",
        "input": {"type": "rtp", "bind_addr": f"127.0.0.1:{port}"},
        "outputs": list(outputs) or [output("o1", port + 1000)],
        **fields,
    }


def output(output_id: str, port: int, **fields: Any) -> dict[str, Any]:
    return {"type": "rtp", "id": output_id, "name": output_id, "dest_addr": f"127.0.0.1:{port}", **fields}


def tunnel(**fields: Any) -> dict[str, Any]:
    return {
        "id": TUNNEL_ID,
        "name": "t",
        "protocol": "udp",
        "mode": "relay",
        "direction": "egress",
        "local_addr": "127.0.0.1:7000",
        "relay_addr": "relay.example:4433",
        "tunnel_encryption_key": KEY_A,
        **fields,
    }


BASE: dict[str, Any] = {
    "server": {"auth": {"enabled": True, "jwt_secret": "0123456789abcdef" * 4}},
    "manager": {"enabled": False, "node_secret": "node-secret-1"},
    "flows": [flow("f1", 5000), flow("f2", 5002), flow("f3", 5004)],
    "tunnels": [tunnel()],
}

Edit = Callable[[dict[str, Any]], None]


def set_flow(index: int, **fields: Any) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        raw["flows"][index].update(fields)

    return edit


def set_input(index: int, **fields: Any) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        raw["flows"][index]["input"].update(fields)

    return edit


def set_outputs(index: int, *outputs: dict[str, Any]) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        raw["flows"][index]["outputs"] = list(outputs)

    return edit


def both(*edits: Edit) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        for one in edits:
            one(raw)

    return edit


def no_change(raw: dict[str, Any]) -> None:
    pass


def summary(plan: ConfigPlan) -> dict[str, Any]:
    """The plan as plain ids (outputs as ``flow:output``), empty parts left out."""
    parts: dict[str, Any] = {
        "deleted": list(plan.deleted),
        "created": [f.id for f in plan.created],
        "replaced": [f.id for f in plan.replaced],
        "removed": [f"{c.flow_id}:{o}" for c in plan.output_changes for o in c.removed],
        "added": [f"{c.flow_id}:{o.id}" for c in plan.output_changes for o in c.added],
        "tunnels_added": list(plan.tunnels_added),
        "tunnels_removed": list(plan.tunnels_removed),
        "tunnels_changed": list(plan.tunnels_changed),
    }
    return {key: value for key, value in parts.items() if value}


CASES: list[tuple[str, Edit, dict[str, Any], list[str]]] = [
    ("unchanged", no_change, {}, ["f1", "f2", "f3"]),
    ("explicit default equals omitted", set_flow(0, enabled=True, media_analysis=True), {}, ["f1", "f2", "f3"]),
    ("name change restarts", set_flow(1, name="Renamed"), {"replaced": ["f2"]}, ["f1", "f3"]),
    ("media_analysis restarts", set_flow(1, media_analysis=False), {"replaced": ["f2"]}, ["f1", "f3"]),
    ("enabled toggle restarts", set_flow(2, enabled=False), {"replaced": ["f3"]}, ["f1", "f2"]),
    ("input port restarts", set_input(0, bind_addr="127.0.0.1:5900"), {"replaced": ["f1"]}, ["f2", "f3"]),
    (
        "input option restarts",
        set_input(0, allowed_payload_types=[33]),
        {"replaced": ["f1"]},
        ["f2", "f3"],
    ),
    (
        "input and outputs changed: one restart, no output plan",
        both(set_input(1, bind_addr="127.0.0.1:5901"), set_outputs(1, output("o9", 6100))),
        {"replaced": ["f2"]},
        ["f1", "f3"],
    ),
    (
        "output added",
        set_outputs(2, output("o1", 6004), output("o2", 6104)),
        {"added": ["f3:o2"]},
        ["f1", "f2"],
    ),
    ("output removed", set_outputs(2), {"removed": ["f3:o1"]}, ["f1", "f2"]),
    (
        "output changed is removed then added",
        set_outputs(1, output("o1", 6999)),
        {"removed": ["f2:o1"], "added": ["f2:o1"]},
        ["f1", "f3"],
    ),
    (
        "output option changed",
        set_outputs(1, output("o1", 6002, dscp=10)),
        {"removed": ["f2:o1"], "added": ["f2:o1"]},
        ["f1", "f3"],
    ),
    (
        "outputs added and removed in one flow",
        set_outputs(0, output("o2", 6100), output("o3", 6200)),
        {"removed": ["f1:o1"], "added": ["f1:o2", "f1:o3"]},
        ["f2", "f3"],
    ),
    (
        "flow added",
        lambda raw: raw["flows"].append(flow("f4", 5006)),
        {"created": ["f4"]},
        ["f1", "f2", "f3"],
    ),
    ("flow removed", lambda raw: raw["flows"].pop(0), {"deleted": ["f1"]}, ["f2", "f3"]),
    (
        "flow id renamed is a delete and a create",
        set_flow(0, id="g1"),
        {"deleted": ["f1"], "created": ["g1"]},
        ["f2", "f3"],
    ),
    ("tunnel removed", lambda raw: raw.update(tunnels=[]), {"tunnels_removed": [TUNNEL_ID]}, ["f1", "f2", "f3"]),
    (
        "tunnel changed",
        lambda raw: raw["tunnels"][0].update(local_addr="127.0.0.1:7001"),
        {"tunnels_changed": [TUNNEL_ID]},
        ["f1", "f2", "f3"],
    ),
    (
        "tunnel secret changed",
        lambda raw: raw["tunnels"][0].update(tunnel_encryption_key=KEY_B),
        {"tunnels_changed": [TUNNEL_ID]},
        ["f1", "f2", "f3"],
    ),
    (
        "tunnel added",
        lambda raw: raw["tunnels"].append(tunnel(id=str(uuid.UUID(int=0x5678, version=4)))),
        {"tunnels_added": [str(uuid.UUID(int=0x5678, version=4))]},
        ["f1", "f2", "f3"],
    ),
    (
        "infrastructure secrets only: nothing at runtime",
        both(
            lambda raw: raw["server"]["auth"].update(jwt_secret="fedcba9876543210" * 4),
            lambda raw: raw["manager"].update(node_secret="node-secret-2"),
        ),
        {},
        ["f1", "f2", "f3"],
    ),
    (
        "input filter added restarts",
        set_input(0, allowed_sources=["127.0.0.1"]),
        {"replaced": ["f1"]},
        ["f2", "f3"],
    ),
    (
        "input type changed restarts",
        lambda raw: raw["flows"][0].update(input={"type": "udp", "bind_addr": "127.0.0.1:5000"}),
        {"replaced": ["f1"]},
        ["f2", "f3"],
    ),
]


@pytest.mark.parametrize(("edit", "expected", "unchanged"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plan(edit: Edit, expected: dict[str, Any], unchanged: list[str]) -> None:
    current = AppConfig.model_validate(BASE)
    raw = copy.deepcopy(BASE)
    edit(raw)
    plan = plan_config_change(current, AppConfig.model_validate(raw))
    assert summary(plan) == expected
    assert list(plan.unchanged) == unchanged
    assert plan.is_empty == (not expected)


def test_outputs_reordered_change_nothing() -> None:
    two = copy.deepcopy(BASE)
    two["flows"][0]["outputs"] = [output("o1", 6000), output("o2", 6100)]
    swapped = copy.deepcopy(two)
    swapped["flows"][0]["outputs"].reverse()
    plan = plan_config_change(AppConfig.model_validate(two), AppConfig.model_validate(swapped))
    assert plan.is_empty and list(plan.unchanged) == ["f1", "f2", "f3"]


def test_the_plan_carries_the_new_configs() -> None:
    current = AppConfig.model_validate(BASE)
    raw = copy.deepcopy(BASE)
    raw["flows"][1]["name"] = "Renamed"
    raw["flows"][2]["outputs"].append(output("o2", 6104))
    raw["flows"].append(flow("f4", 5006))
    new = AppConfig.model_validate(raw)
    plan = plan_config_change(current, new)
    assert plan.replaced == (new.flows[1],)
    assert plan.created == (new.flows[3],)
    (change,) = plan.output_changes
    assert change.flow == new.flows[2] and change.added == (new.flows[2].outputs[1],) and change.removed == ()
    assert plan.changed_flow_ids == ("f4", "f2", "f3")


def test_omitted_secrets_merged_first_change_nothing() -> None:
    """A manager body echoing the stripped config back (interop.md 2.7): once merged, nothing changes."""
    current = AppConfig.model_validate(BASE)
    raw = copy.deepcopy(BASE)
    del raw["server"]["auth"]
    del raw["manager"]["node_secret"]
    stripped = AppConfig.model_validate({**raw, "tunnels": []}).model_copy(
        # without its key (a relay tunnel needs one to validate: the body is filled before, fill_kept_secrets)
        update={"tunnels": [current.tunnels[0].model_copy(update={"tunnel_encryption_key": None})]}
    )
    assert plan_config_change(current, stripped).tunnels_changed == (TUNNEL_ID,)
    merged = merge_kept_secrets(stripped, current)
    plan = plan_config_change(current, merged)
    assert plan.is_empty and list(plan.tunnels_unchanged) == [TUNNEL_ID]


def test_a_flow_secret_is_a_flow_parameter() -> None:
    """An SRT passphrase is a user parameter (interop.md 2.7), not merged: a new one restarts the flow."""
    srt = {"type": "srt", "mode": "listener", "local_addr": "127.0.0.1:5000", "passphrase": "first-secret-1"}
    raw = copy.deepcopy(BASE)
    raw["flows"][0]["input"] = srt
    current = AppConfig.model_validate(raw)
    raw["flows"][0]["input"] = {**srt, "passphrase": "second-secret-2"}
    assert summary(plan_config_change(current, AppConfig.model_validate(raw))) == {"replaced": ["f1"]}
    assert plan_config_change(current, merge_kept_secrets(current, current)).is_empty
