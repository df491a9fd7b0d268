"""The IS-04 registration client's rules (AMWA IS-04 "Behaviour: Registration"), one by one."""

from __future__ import annotations

from typing import Any

import pytest

from services.edge.nmos.registration import HEARTBEAT_INTERVAL_S, RegistrationClient, Request

A = "http://reg-a.example/x-nmos/registration/v1.3/"
B = "http://reg-b.example/x-nmos/registration/v1.3/"
NODE = "11111111-1111-4111-8111-111111111111"


def resources(version: str = "1:0", *, flows: int = 1) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {
        "node": {NODE: {"id": NODE, "version": version}},
        "device": {"dev": {"id": "dev", "version": version}},
        "source": {},
        "flow": {},
        "sender": {},
        "receiver": {},
    }
    for k in range(flows):
        out["source"][f"src{k}"] = {"id": f"src{k}", "version": version}
        out["flow"][f"flow{k}"] = {"id": f"flow{k}", "version": version}
        out["sender"][f"snd{k}"] = {"id": f"snd{k}", "version": version}
        out["receiver"][f"rcv{k}"] = {"id": f"rcv{k}", "version": version}
    return out


def drain(client: RegistrationClient, now: float, answer: Any = 201, limit: int = 50) -> list[Request]:
    """Send every due request, answering each with ``answer(request)`` (or the constant)."""
    sent = []
    for _ in range(limit):
        request = client.next_request(now)
        if request is None:
            return sent
        sent.append(request)
        status = answer(request) if callable(answer) else answer
        client.response(request, status, now)
    raise AssertionError("the client never stopped asking")


def kinds(requests: list[Request]) -> list[str]:
    return [f"{r.purpose}:{r.resource_type}" for r in requests]


def test_initial_registration_is_the_node_then_parents_before_children() -> None:
    client = RegistrationClient([A])
    client.set_resources(resources())
    sent = drain(client, 0.0)
    assert kinds(sent) == [
        "register:node",
        "register:device",
        "register:source",
        "register:flow",
        "register:sender",
        "register:receiver",
    ]
    assert sent[0].url == A + "resource" and sent[0].body == {"type": "node", "data": {"id": NODE, "version": "1:0"}}
    assert client.registered


def test_heartbeats_every_5_s_and_404_re_registers_everything_in_order() -> None:
    client = RegistrationClient([A])
    client.set_resources(resources())
    drain(client, 0.0)
    assert client.next_deadline() == HEARTBEAT_INTERVAL_S
    assert client.next_request(4.9) is None
    beat = client.next_request(5.0)
    assert beat is not None and beat.purpose == "heartbeat" and beat.url == A + f"health/nodes/{NODE}"
    client.response(beat, 200, 5.0)
    assert client.next_deadline() == 10.0
    beat = client.next_request(10.0)
    assert beat is not None
    client.response(beat, 404, 10.0)  # garbage-collected by the registry
    assert kinds(drain(client, 10.0))[:2] == ["register:node", "register:device"]
    assert len(client.registered_resources()) == 6


def test_200_on_first_node_registration_deletes_the_old_record_then_registers() -> None:
    client = RegistrationClient([A])
    client.set_resources(resources())
    answers = iter([200, 204, 201, 201, 201, 201, 201, 201])
    sent = drain(client, 0.0, answer=lambda r: next(answers))
    assert [(r.method, r.path) for r in sent[:3]] == [
        ("POST", "resource"),
        ("DELETE", f"resource/nodes/{NODE}"),
        ("POST", "resource"),
    ]
    assert client.registered


def test_changes_are_posted_and_removals_deleted_children_first() -> None:
    client = RegistrationClient([A])
    client.set_resources(resources(flows=2))
    drain(client, 0.0)
    changed = resources("2:0", flows=1)
    changed["node"][NODE]["version"] = "1:0"  # the node itself did not change
    client.set_resources(changed)
    sent = drain(client, 1.0)
    posts = [r.resource_type for r in sent if r.method == "POST"]
    deletes = [r.resource_type for r in sent if r.method == "DELETE"]
    assert posts == ["device", "source", "flow", "sender", "receiver"]
    assert deletes == ["receiver", "sender", "flow", "source"]  # children before parents
    assert drain(client, 1.0) == []


def test_a_4xx_registration_is_not_retried_until_the_resource_changes() -> None:
    client = RegistrationClient([A])
    client.set_resources(resources())
    sent = drain(client, 0.0, answer=lambda r: 400 if r.resource_type == "flow" else 201)
    assert kinds(sent).count("register:flow") == 1
    assert drain(client, 1.0) == []
    changed = resources()
    changed["flow"]["flow0"]["version"] = "3:0"
    client.set_resources(changed)
    assert kinds(drain(client, 2.0)) == ["register:flow"]


@pytest.mark.parametrize("failure", [None, 500, 503])
def test_failure_fails_over_and_the_next_registry_gets_a_heartbeat_first(failure: int | None) -> None:
    client = RegistrationClient([A, B])
    client.set_resources(resources())
    drain(client, 0.0)
    beat = client.next_request(5.0)
    assert beat is not None and beat.registry == A
    client.response(beat, failure, 5.0)
    assert client.registry == B and client.failovers == 1
    probe = client.next_request(5.0)
    assert probe is not None and probe.purpose == "heartbeat" and probe.registry == B
    client.response(probe, 404, 5.0)  # B does not know the node: register everything there
    sent = drain(client, 5.0)
    assert {r.registry for r in sent} == {B} and kinds(sent)[0] == "register:node"


def fail_over_to_b(client: RegistrationClient, now: float) -> Request:
    """Registered with A; A's heartbeat fails at ``now``: the probe heartbeat to B, unanswered."""
    beat = client.next_request(now)
    assert beat is not None and beat.registry == A and beat.purpose == "heartbeat"
    client.response(beat, None, now)
    probe = client.next_request(now)
    assert probe is not None and probe.registry == B and probe.purpose == "heartbeat"
    return probe


def test_a_heartbeat_200_on_the_new_registry_carries_on_without_registering() -> None:
    """AMWA IS-04-01 test_16: a registry of the same cluster already holds the node and its
    resources; after the fail-over the node only heartbeats there."""
    client = RegistrationClient([A, B])
    client.set_resources(resources())
    drain(client, 0.0)
    probe = fail_over_to_b(client, 5.0)
    assert not client.registered and client.registered_with is None
    client.response(probe, 200, 5.0)  # the cluster still holds the node and its resources
    assert client.registered and client.registered_with == B
    assert drain(client, 5.0) == []  # nothing registered again
    assert len(client.registered_resources()) == 6
    beat = client.next_request(10.0)
    assert beat is not None and beat.purpose == "heartbeat" and beat.registry == B
    client.response(beat, 200, 10.0)
    assert drain(client, 10.0) == []


def test_after_a_200_probe_only_what_the_cluster_was_not_told_is_sent() -> None:
    """A resource that changed while the old registry was failing (its update never answered)
    is POSTed to the new one as an update; the node and everything else are not."""
    client = RegistrationClient([A, B])
    client.set_resources(resources())
    drain(client, 0.0)
    changed = resources()
    changed["flow"]["flow0"]["version"] = "2:0"
    client.set_resources(changed)
    update = client.next_request(1.0)
    assert update is not None and update.resource_type == "flow" and update.registry == A
    client.response(update, 503, 1.0)  # A fails on the update: fail over to B
    probe = client.next_request(1.0)
    assert probe is not None and probe.purpose == "heartbeat" and probe.registry == B
    client.response(probe, 200, 1.0)
    sent = drain(client, 1.0)
    assert kinds(sent) == ["register:flow"] and sent[0].registry == B and sent[0].version == "2:0"


def test_a_404_probe_after_a_fail_over_registers_everything_node_first() -> None:
    client = RegistrationClient([A, B])
    client.set_resources(resources())
    drain(client, 0.0)
    probe = fail_over_to_b(client, 5.0)
    client.response(probe, 404, 5.0)
    assert client.registered_resources() == {}
    assert kinds(drain(client, 5.0)) == [
        "register:node",
        "register:device",
        "register:source",
        "register:flow",
        "register:sender",
        "register:receiver",
    ]
    assert client.registered_with == B


def test_all_registries_failing_backs_off_exponentially() -> None:
    client = RegistrationClient([A, B])
    client.set_resources(resources())
    first = client.next_request(0.0)
    assert first is not None
    client.response(first, None, 0.0)  # A down
    second = client.next_request(0.0)
    assert second is not None and second.registry == B
    client.response(second, 502, 0.0)  # B down too: back off 1 s, then A again
    assert client.next_request(0.5) is None and client.next_deadline() == 1.0
    again = client.next_request(1.0)
    assert again is not None and again.registry == A
    client.response(again, None, 1.0)
    third = client.next_request(1.0)
    assert third is not None
    client.response(third, None, 1.0)
    assert client.next_deadline() == 3.0  # doubled: 2 s


def test_an_answer_to_a_stale_request_is_ignored() -> None:
    client = RegistrationClient([A, B])
    client.set_resources(resources())
    first = client.next_request(0.0)
    assert first is not None
    client.set_registries([B])  # rediscovery: A is gone
    client.response(first, 201, 0.0)
    assert not client.registered and client.registry == B


def test_a_201_to_the_node_update_means_the_registry_lost_it_so_all_is_registered_again() -> None:
    client = RegistrationClient([A])
    client.set_resources(resources())
    drain(client, 0.0)
    changed = resources()
    changed["node"][NODE]["version"] = "2:0"
    client.set_resources(changed)
    sent = drain(client, 1.0)  # the node's update answered 201: created anew
    assert kinds(sent)[0] == "register:node"
    assert kinds(sent)[1:] == [
        "register:device",
        "register:source",
        "register:flow",
        "register:sender",
        "register:receiver",
    ]
