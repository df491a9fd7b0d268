"""The trio driver of :class:`~services.edge.nmos.registration.RegistrationClient`: HTTP to the
Registration APIs with httpx, the node's resources taken from a callable, the registries from
the config and from DNS-SD.

One request at a time, each with a 2 s timeout (a registry that does not answer in time is
treated as down: IS-04 "Inability To Connect, Or A Timeout"). The resources are read again
after every answer and whenever :meth:`Registrar.changed` is called, so a flow added or removed
reaches the registry within one round trip; they are also read every second (``POLL_S``), so a
change nobody announced is sent within a second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import httpx
import trio

from services.edge.nmos.registration import RegistrationClient, Request, Resources

__all__ = ["REGISTRATION_PATH", "REQUEST_TIMEOUT_S", "Registrar", "registration_base"]

REGISTRATION_PATH: Final = "/x-nmos/registration/v1.3/"
REQUEST_TIMEOUT_S: Final = 2.0
POLL_S: Final = 1.0
"""How often the resources are read again without a ``changed()`` call: a change made
anywhere (a flow started by the engine, an output gone) reaches the registry within this."""
_log = logging.getLogger("mediaplane.nmos")


def registration_base(url: str) -> str:
    """``http://host:port`` (or a base already ending in the API path) → the v1.3 API base."""
    url = url.rstrip("/")
    return url + "/" if url.endswith(REGISTRATION_PATH.rstrip("/")) else url + REGISTRATION_PATH


class Registrar:
    """Keeps the node registered. Start :meth:`run` in a nursery; call :meth:`set_registries`
    with each discovery result and :meth:`changed` when the resources change. ``on_health`` is
    called with :attr:`RegistrationClient.registered_with` each time it changes."""

    def __init__(
        self,
        resources: Callable[[], Resources],
        registries: list[str],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        on_health: Callable[[str | None], None] | None = None,
    ) -> None:
        self._resources = resources
        self.client = RegistrationClient([registration_base(url) for url in registries])
        self._transport = transport
        self._wake = trio.Event()
        self._on_health = on_health
        self._told: str | None = None

    def set_registries(self, registries: list[str]) -> None:
        """A new list in priority order (the static one first, then DNS-SD's)."""
        self.client.set_registries([registration_base(url) for url in registries])
        self._wake.set()

    def changed(self) -> None:
        """The resources changed: send the changes now rather than at the next heartbeat."""
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, transport=self._transport) as http:
            task_status.started()
            while True:
                self._wake = trio.Event()
                self._tell_health()
                self.client.set_resources(self._resources())
                request = self.client.next_request(trio.current_time())
                if request is not None:
                    status = await self._send(http, request)
                    self.client.response(request, status, trio.current_time())
                    continue
                deadline = self.client.next_deadline()
                poll_at = trio.current_time() + POLL_S
                with trio.move_on_at(poll_at if deadline is None else min(deadline, poll_at)):
                    await self._wake.wait()

    def _tell_health(self) -> None:
        """``on_health(registered_with)`` whenever the registry the node is registered with
        (and heartbeating to) changes, None included: the node's DNS-SD side follows it."""
        now = self.client.registered_with
        if now != self._told:
            self._told = now
            if self._on_health is not None:
                self._on_health(now)

    async def _send(self, http: httpx.AsyncClient, request: Request) -> int | None:
        try:
            answer = await http.request(request.method, request.url, json=request.body)
        except httpx.HTTPError as exc:
            _log.warning("NMOS registry %s: %s (%s)", request.registry, request.purpose, type(exc).__name__)
            return None
        if answer.status_code >= 400:
            _log.warning(
                "NMOS registry %s answered %d to %s %s",
                request.registry,
                answer.status_code,
                request.purpose,
                request.resource_type,
            )
        return answer.status_code
