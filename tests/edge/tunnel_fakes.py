"""A fake ``TunnelRunner`` for the tunnel tests, loaded in the real tunnel worker process with
``--runner tests.edge.tunnel_fakes:FakeRunner`` (``EdgeService(tunnel_runner=...)`` or
``TunnelSupervisor(runner=...)``).

The test drives it through files in ``$FAKE_TUNNEL_DIR``:

- ``<tunnel id>.state``: one line ``STATE[ REASON]``; the runner reads it every ``POLL_S`` and calls
  ``on_state`` with it on *every* poll (so the worker's "one event per transition" is what keeps
  the events single), and moves ``state``. No file: it stays ``Connecting``.
- ``<tunnel id>.runs``: the runner appends a line each time it starts (restarts show as lines).
- ``<tunnel id>.edge``: the ``edge_id`` and ``software_version`` it was given;
  ``<tunnel id>.secret``: the ``tunnel_encryption_key`` it received (to check it arrived revealed).

A tunnel named ``refuse`` raises in the constructor; one named ``explode`` raises in ``run``.
While ``Connected`` the counters grow: 1000 bytes and one datagram each way per poll.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from appliance.models.config import TunnelConfig

POLL_S = 0.01


@dataclass
class FakeCounters:
    bytes_sent: int = 0
    bytes_received: int = 0
    datagrams_sent: int = 0
    datagrams_received: int = 0
    replayed: int = 3
    decrypt_errors: int = 2
    tcp_streams_total: int = 0
    tcp_streams_active: int = 0
    dropped: int = 0
    not_in_the_contract: int = 7  # extra fields of the runner's dataclass are not reported


class FakeRunner:
    def __init__(
        self,
        tunnel: TunnelConfig,
        *,
        edge_id: str | None,
        software_version: str,
        on_state: Callable[[str, str | None], None],
    ) -> None:
        if tunnel.name == "refuse":
            raise ValueError("refused")
        self.tunnel = tunnel
        self.on_state = on_state
        self.state = "Connecting"
        self.counters = FakeCounters()
        self.dir = Path(os.environ["FAKE_TUNNEL_DIR"])
        self.key = str(tunnel.id)
        (self.dir / f"{self.key}.edge").write_text(f"{edge_id} {software_version}")
        secret = tunnel.tunnel_encryption_key
        (self.dir / f"{self.key}.secret").write_text(secret.get_secret_value() if secret is not None else "")

    async def run(self) -> None:
        with (self.dir / f"{self.key}.runs").open("a") as runs:
            runs.write("run\n")
        if self.tunnel.name == "explode":
            raise RuntimeError("boom")
        path = self.dir / f"{self.key}.state"
        while True:
            if path.exists():
                line = path.read_text().strip()
                state, _, reason = line.partition(" ")
                if state:
                    self.state = state
                    self.on_state(state, reason or None)
            if self.state == "Connected":
                c = self.counters
                c.bytes_sent += 1000
                c.bytes_received += 1000
                c.datagrams_sent += 1
                c.datagrams_received += 1
            await trio.sleep(POLL_S)
