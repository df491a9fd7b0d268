"""The registrar over real HTTP against a test Registration API (tests/helpers/nmos_registry.py),
which validates every POST body against the AMWA schema and enforces referential integrity; and
the node's DNS-SD side of registration (which registries it hands the registrar, when it
advertises itself)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from services.edge.nmos import schemas
from services.edge.nmos.node import ADVERTISE_GRACE_S, _Advertising, registries_to_use
from services.edge.nmos.registrar import Registrar, registration_base
from tests.edge.nmos_bodies import DEVICE, NODE, bodies
from tests.helpers.nmos_registry import NmosRegistry, run_registry


def test_the_test_bodies_are_valid() -> None:
    for kind, by_id in bodies(flows=("a", "b")).items():
        for body in by_id.values():
            assert schemas.problems(schemas.IS04, f"{kind}.json", body) == [], kind


class Holder:
    def __init__(self) -> None:
        self.value: Any = bodies()

    def __call__(self) -> Any:
        return self.value


async def test_register_heartbeat_follow_changes_reregister_and_fail_over(autojump_clock: trio.abc.Clock) -> None:
    first, second = NmosRegistry(), NmosRegistry()
    holder = Holder()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_registry, first)
        await nursery.start(run_registry, second)
        registrar = Registrar(holder, [first.url, second.url])
        await nursery.start(registrar.run)

        # Registered in order, every body valid (the registry refuses anything else).
        await first.wait_for(lambda: len(first.resources) == 6)
        assert not first.rejected
        assert [entry[1] for entry in first.log[:6]] == [
            "resource node",
            "resource device",
            "resource source",
            "resource flow",
            "resource sender",
            "resource receiver",
        ]
        # Heartbeats every 5 s.
        await first.wait_for(lambda: first.heartbeats >= 3, timeout=20)

        # A flow added and one removed reach the registry.
        holder.value = bodies("2:0", flows=("cam2",))
        registrar.changed()
        wanted = {(kind, rid) for kind, by_id in holder.value.items() for rid in by_id}
        await first.wait_for(
            lambda: set(first.resources) == wanted and all(b["version"] == "2:0" for b in first.resources.values())
        )
        assert not first.rejected

        # Garbage-collected: the next heartbeat's 404 re-registers everything.
        first.forget()
        await first.wait_for(lambda: set(first.resources) == wanted, timeout=20)

        # The first registry fails: the node moves to the second (heartbeat first, then all).
        first.fail_with = 500
        await second.wait_for(lambda: set(second.resources) == wanted and second.heartbeats >= 1, timeout=30)
        assert ("node", NODE) in second.resources and not second.rejected
        assert registrar.client.registry == second.url + "/x-nmos/registration/v1.3/"
        nursery.cancel_scope.cancel()


async def test_failing_over_within_a_cluster_only_heartbeats(autojump_clock: trio.abc.Clock) -> None:
    """AMWA IS-04-01 test_16: two registries of one cluster (one store, as AMWA's mock registries
    share theirs). When the first fails, the node heartbeats the second and registers nothing."""
    first, second = NmosRegistry(), NmosRegistry()
    second.resources = first.resources  # the cluster's shared store
    holder = Holder()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_registry, first)
        await nursery.start(run_registry, second)
        registrar = Registrar(holder, [first.url, second.url])
        await nursery.start(registrar.run)
        await first.wait_for(lambda: len(first.resources) == 6 and first.heartbeats >= 1, timeout=20)

        first.fail_with = 500
        await second.wait_for(lambda: second.heartbeats >= 3, timeout=30)
        assert {entry[1] for entry in second.log} == {"health"}  # no POST /resource at all
        assert registrar.client.registered_with == second.url + "/x-nmos/registration/v1.3/"

        # A change made afterwards is sent there as an update; the node is still not re-POSTed.
        holder.value = bodies()
        holder.value["device"][DEVICE]["version"] = "2:0"
        registrar.changed()
        await second.wait_for(lambda: second.resources[("device", DEVICE)]["version"] == "2:0")
        assert [entry[1] for entry in second.log if entry[1] != "health"] == ["resource device"]
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- DNS-SD side (node.py)
# AMWA IS-04-01 test_12_01: the tool withdraws every registry advert and at once advertises a new
# registry; a node registered all along must not advertise _nmos-node._tcp meanwhile.

RA, RB = "http://192.0.2.10:8235", "http://192.0.2.20:8235"


def test_the_registry_in_use_stays_listed_while_it_answers_though_its_record_went() -> None:
    in_use = registration_base(RA)
    assert registries_to_use([], [RA], in_use) == [RA]  # every advert withdrawn: kept
    assert registries_to_use([RB], [RA], in_use) == [RB, RA]  # a new one: kept too, last
    assert registries_to_use([RA, RB], [RA], in_use) == [RA, RB]  # still advertised: as found
    assert registries_to_use([RB], [RA, RB], None) == [RB]  # failed (not registered): dropped
    assert registries_to_use([], [], None) == []


class FakeAdvert:
    """Stands for the mDNS advertisement: ``on`` while it runs."""

    def __init__(self) -> None:
        self.on = False
        self.starts = 0

    async def __call__(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.on = True
        self.starts += 1
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self.on = False


async def test_the_node_advertises_only_after_no_registry_was_usable_for_the_grace_period(
    autojump_clock: trio.abc.Clock,
) -> None:
    usable = False
    advert = FakeAdvert()
    advertising = _Advertising(lambda: usable, advert)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        nursery.start_soon(advertising.keep)
        # No registry at all (boot): advertised once the grace period has passed, not before.
        await trio.sleep(ADVERTISE_GRACE_S - 0.1)
        assert not advert.on
        await trio.sleep(0.2)
        assert advert.on and advertising.advertising
        assert trio.current_time() - start >= ADVERTISE_GRACE_S

        # Registered: withdrawn at once.
        usable = True
        advertising.update()
        await trio.testing.wait_all_tasks_blocked()
        assert not advert.on

        # The registry unusable for a moment (its adverts withdrawn and a new one registered
        # with, a fail-over): nothing is advertised.
        usable = False
        advertising.update()
        await trio.sleep(ADVERTISE_GRACE_S - 1)
        usable = True
        advertising.update()
        await trio.sleep(ADVERTISE_GRACE_S * 3)
        assert not advert.on and advert.starts == 1

        # Unusable for longer than the grace: advertised again.
        usable = False
        advertising.update()
        await trio.sleep(ADVERTISE_GRACE_S + 0.1)
        assert advert.on and advert.starts == 2
        nursery.cancel_scope.cancel()


async def test_the_registrar_reports_the_registry_it_is_registered_with(autojump_clock: trio.abc.Clock) -> None:
    first, second = NmosRegistry(), NmosRegistry()
    told: list[str | None] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(run_registry, first)
        await nursery.start(run_registry, second)
        registrar = Registrar(Holder(), [first.url, second.url], on_health=told.append)
        await nursery.start(registrar.run)
        await first.wait_for(lambda: first.heartbeats >= 1, timeout=20)
        assert told == [registration_base(first.url)]
        first.fail_with = 500  # fail-over: not registered for a moment, then with the second
        await second.wait_for(lambda: second.heartbeats >= 1, timeout=30)
        await trio.testing.wait_all_tasks_blocked()
        assert told == [registration_base(first.url), None, registration_base(second.url)]
        nursery.cancel_scope.cancel()
