"""The registrar over real HTTP against a test Registration API (tests/helpers/nmos_registry.py),
which validates every POST body against the AMWA schema and enforces referential integrity."""

from __future__ import annotations

from typing import Any

import trio

from services.edge.nmos import schemas
from services.edge.nmos.registrar import Registrar
from tests.edge.nmos_bodies import NODE, bodies
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
