"""IS-04 v1.3 registration client as a sans-IO state machine (AMWA IS-04 "Behaviour: Registration").

The driver asks :meth:`RegistrationClient.next_request` what to send (one request at a time),
sends it to the current Registration API, and reports the answer with :meth:`response` (the
HTTP status, or None for a failure to connect or a timeout). :meth:`set_resources` gives the
node's current resources whenever they change; :meth:`next_deadline` says when to ask again
(the next heartbeat, or the end of a backoff). No I/O, no clock: ``now`` is the caller's
monotonic seconds.

Behaviour, each rule from the AMWA text:

- **Initial registration**: the node first (``POST /resource``). A ``201`` is the expected
  answer; a ``200`` means the registry still holds an old record of this node, so the node is
  deleted (``DELETE /resource/nodes/{id}``, which removes its sub-resources too) and registered
  again. Then the other resources in dependency order: devices, sources, flows, senders,
  receivers ("Referential Integrity").
- **Heartbeats** every 5 s (``POST /health/nodes/{id}``) while the node is registered. A ``404``
  means the registry forgot the node (garbage collection): every resource is registered again,
  in order.
- **Changes**: a resource whose body changed is POSTed again; one that went is DELETEd, children
  before parents ("Controlled Unregistration"). A ``201`` to the node's update means the registry
  had lost it, and with it the sub-resources: they are registered again.
- **4xx on a registration** (other than the heartbeat's 404): that request is not tried again
  until the resource changes ("must not be re-attempted without corrective action").
- **5xx, no connection or a timeout**: fail over to the next Registration API in priority order;
  the first request to a new one is a heartbeat. A 200 means the registry (one of the same
  cluster) already knows the node: the resources count as registered there at the versions the
  old registry acknowledged, so the node only heartbeats, and POSTs (as updates) just the
  resources that changed since; the node itself is not registered again (AMWA IS-04-01
  test_16). A 404 means it does not: everything is registered, node first, in dependency
  order. When every registry has failed, back off exponentially (1 s doubling to 30 s) and
  start again with the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "RESOURCE_ORDER",
    "RegistrationClient",
    "Request",
]

HEARTBEAT_INTERVAL_S: Final = 5.0
BACKOFF_MIN_S: Final = 1.0
BACKOFF_MAX_S: Final = 30.0
RESOURCE_ORDER: Final = ("node", "device", "source", "flow", "sender", "receiver")
"""Registration order (parents first); deletions go the other way."""

Purpose = Literal["register", "delete", "heartbeat", "clear"]
Resources = dict[str, dict[str, dict[str, Any]]]
"""``{type: {id: body}}`` with the types of :data:`RESOURCE_ORDER`."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request to send to ``registry`` (a Registration API base URL ending in ``/v1.3/``)."""

    registry: str
    method: Literal["POST", "DELETE"]
    path: str
    body: dict[str, Any] | None
    purpose: Purpose
    resource_type: str | None = None
    resource_id: str | None = None
    version: str | None = None

    @property
    def url(self) -> str:
        return self.registry + self.path


@dataclass(slots=True)
class _Registry:
    url: str
    failed: bool = False


@dataclass(slots=True)
class _State:
    registered: dict[tuple[str, str], str] = field(default_factory=dict)  # (type, id) -> version
    rejected: dict[tuple[str, str], str] = field(default_factory=dict)  # 4xx'd at this version
    node_registered: bool = False
    probe_first: bool = False  # a new registry after a failover: heartbeat before anything


class RegistrationClient:
    """Keeps one node's resources registered with the first working Registration API."""

    def __init__(self, registries: list[str]) -> None:
        self._registries = [_Registry(url if url.endswith("/") else url + "/") for url in registries]
        self._index = 0
        self._state = _State()
        self._resources: Resources = {kind: {} for kind in RESOURCE_ORDER}
        self._in_flight: Request | None = None
        self._next_heartbeat: float | None = None
        self._backoff_until: float | None = None
        self._backoff = BACKOFF_MIN_S
        self._pending_clear = False  # a 200 on the first node registration: DELETE it first
        self._cleared = False
        self.heartbeats_ok = 0
        self.failovers = 0

    # ------------------------------------------------------------------ queries
    @property
    def registry(self) -> str | None:
        """The Registration API in use, or None when there is none to use."""
        return self._registries[self._index].url if self._registries else None

    @property
    def registered(self) -> bool:
        """The node is registered with the current registry (heartbeats keep it)."""
        return self._state.node_registered

    @property
    def registered_with(self) -> str | None:
        """The Registration API the node is registered with and heartbeating to successfully,
        or None (not registered, failing over, backing off, or no registry at all)."""
        return self.registry if self._state.node_registered else None

    def registered_resources(self) -> dict[tuple[str, str], str]:
        return dict(self._state.registered)

    def next_deadline(self) -> float | None:
        """When :meth:`next_request` may have something new without any other input."""
        if self._in_flight is not None:
            return None
        if self._backoff_until is not None:
            return self._backoff_until
        return self._next_heartbeat

    # ------------------------------------------------------------------ inputs
    def set_registries(self, registries: list[str]) -> None:
        """A new discovery result (priority order). The registry in use is kept if still listed."""
        current = self.registry
        self._registries = [_Registry(url if url.endswith("/") else url + "/") for url in registries]
        urls = [r.url for r in self._registries]
        if current in urls:
            self._index = urls.index(current)
        else:
            self._index = 0
            self._switch_registry(probe=True)

    def set_resources(self, resources: Resources) -> None:
        """The node's resources now (bodies with their ``version``); changes are sent in order."""
        self._resources = {kind: dict(resources.get(kind, {})) for kind in RESOURCE_ORDER}
        if len(self._resources["node"]) > 1:
            raise ValueError("one node resource")

    def next_request(self, now: float) -> Request | None:
        """The next request to send, or None (nothing due, or one is in flight)."""
        if self._in_flight is not None or not self._registries or not self._resources["node"]:
            return None
        if self._backoff_until is not None:
            if now < self._backoff_until:
                return None
            self._backoff_until = None
        request = self._choose(now)
        self._in_flight = request
        return request

    def response(self, request: Request, status: int | None, now: float) -> None:
        """The answer to ``request``: its HTTP status, or None (no connection, timeout)."""
        if request is not self._in_flight:
            return  # an answer from before a failover or a reset: nothing to learn from it
        self._in_flight = None
        if status is None or status >= 500:
            self._fail_over(now)
            return
        self._backoff = BACKOFF_MIN_S
        state = self._state
        key = (request.resource_type or "", request.resource_id or "")
        if request.purpose == "heartbeat":
            state.probe_first = False
            if status == 200:
                self.heartbeats_ok += 1
                state.node_registered = True
                self._next_heartbeat = now + HEARTBEAT_INTERVAL_S
            elif status == 404:
                self._forget_registrations()  # garbage-collected: register everything again
            else:
                self._next_heartbeat = now + HEARTBEAT_INTERVAL_S
        elif request.purpose == "register":
            if request.resource_type == "node" and status == 200 and not state.node_registered and not self._cleared:
                # An old record of this node: delete it (and its sub-resources), register anew.
                # Once per registry: a registry that answers 200 again is taken at its word.
                self._pending_clear = self._cleared = True
            elif status in (200, 201):
                if request.resource_type == "node" and status == 201 and state.node_registered:
                    # Created, though it should have been an update: the registry lost the node
                    # (and so its sub-resources): register them again.
                    self._forget_registrations()
                state.registered[key] = request.version or ""
                state.rejected.pop(key, None)
                if request.resource_type == "node":
                    state.node_registered = True
                    self._next_heartbeat = now + HEARTBEAT_INTERVAL_S
            else:
                state.rejected[key] = request.version or ""
        elif request.purpose == "clear":
            self._forget_registrations()
        elif request.purpose == "delete":
            state.registered.pop(key, None)
            state.rejected.pop(key, None)

    # ------------------------------------------------------------------ internals
    def _node(self) -> tuple[str, dict[str, Any]]:
        node_id, body = next(iter(self._resources["node"].items()))
        return node_id, body

    def _choose(self, now: float) -> Request | None:
        registry = self._registries[self._index].url
        node_id, node_body = self._node()
        state = self._state
        heartbeat = Request(registry, "POST", f"health/nodes/{node_id}", None, "heartbeat", "node", node_id)
        if state.probe_first:
            return heartbeat
        if self._pending_clear:
            self._pending_clear = False
            return Request(registry, "DELETE", f"resource/nodes/{node_id}", None, "clear", "node", node_id)
        if not state.node_registered:
            return self._register("node", node_id, node_body, registry)
        if self._next_heartbeat is not None and now >= self._next_heartbeat:
            return heartbeat
        for kind in RESOURCE_ORDER[1:]:
            for resource_id, body in self._resources[kind].items():
                key = (kind, resource_id)
                version = str(body.get("version", ""))
                if state.registered.get(key) != version and state.rejected.get(key) != version:
                    return self._register(kind, resource_id, body, registry)
        for kind in reversed(RESOURCE_ORDER[1:]):
            for registered_type, resource_id in list(state.registered):
                if registered_type == kind and resource_id not in self._resources[kind]:
                    return Request(
                        registry, "DELETE", f"resource/{kind}s/{resource_id}", None, "delete", kind, resource_id
                    )
        if state.registered.get(("node", node_id)) != str(node_body.get("version", "")):
            return self._register("node", node_id, node_body, registry)  # the node itself changed
        return None  # nothing to change: the next heartbeat is asked for at its time

    def _register(self, kind: str, resource_id: str, body: dict[str, Any], registry: str) -> Request:
        return Request(
            registry,
            "POST",
            "resource",
            {"type": kind, "data": body},
            "register",
            kind,
            resource_id,
            str(body.get("version", "")),
        )

    def _forget_registrations(self) -> None:
        self._state.registered.clear()
        self._state.rejected.clear()
        self._state.node_registered = False
        self._next_heartbeat = None

    def _switch_registry(self, *, probe: bool) -> None:
        # What the old registry acknowledged is kept (``registered``): a registry of the same
        # cluster holds it, and a 200 to the probe heartbeat means carry on there with
        # heartbeats only, POSTing just what changed since (AMWA IS-04-01 test_16). A 404
        # forgets it all. Refusals (4xx) were the old registry's: the new one is asked afresh.
        self._state.rejected.clear()
        self._state.node_registered = False
        self._next_heartbeat = None
        if not probe:
            self._forget_registrations()
        self._state.probe_first = probe
        self._pending_clear = self._cleared = False
        self._in_flight = None

    def _fail_over(self, now: float) -> None:
        self._registries[self._index].failed = True
        self.failovers += 1
        if all(r.failed for r in self._registries):
            for registry in self._registries:
                registry.failed = False
            self._index = 0
            self._backoff_until = now + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        else:
            self._index = next(i for i, r in enumerate(self._registries) if not r.failed)
        # The first request to the next registry is a heartbeat: the node may be known there.
        self._switch_registry(probe=True)
