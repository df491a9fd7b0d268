"""An in-process edge for the tunnel tests: ``EdgeService`` as mp-edge builds it, with the fake
runner of ``tunnel_fakes`` in its (real) tunnel worker, and tunnel bodies to create."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from appliance.config.store import EdgeConfigStore
from services.edge.service import EdgeService
from tests.helpers.edge import write_config

FAKE_RUNNER = "tests.edge.tunnel_fakes:FakeRunner"
KEY = "ab" * 32
BIND_SECRET = "cd" * 32
PSK = "direct-mode-pre-shared-key"


def relay_tunnel(name: str = "Studio link", **fields: object) -> dict[str, object]:
    """A relay-mode tunnel body with its secrets, as a client would POST it."""
    return {
        "id": str(uuid.uuid4()),
        "name": name,
        "protocol": "udp",
        "mode": "relay",
        "direction": "egress",
        "local_addr": "127.0.0.1:7000",
        "relay_addr": "relay.example:4433",
        "tunnel_encryption_key": KEY,
        "tunnel_bind_secret": BIND_SECRET,
        **fields,
    }


def direct_tunnel(name: str = "Direct", **fields: object) -> dict[str, object]:
    return {
        "id": str(uuid.uuid4()),
        "name": name,
        "protocol": "tcp",
        "mode": "direct",
        "direction": "ingress",
        "local_addr": "127.0.0.1:7001",
        "direct_listen_addr": "0.0.0.0:4500",
        "tunnel_psk": PSK,
        **fields,
    }


@asynccontextmanager
async def running_service(tmp_path: Path, config: dict[str, Any] | None = None) -> AsyncIterator[EdgeService]:
    """An ``EdgeService`` as mp-edge builds it (one engine worker), the fake tunnel runner in its
    tunnel worker, ``$FAKE_TUNNEL_DIR`` set to ``tmp_path / "fake"`` (the caller's monkeypatch
    must not be needed: the variable is set and restored here)."""
    fake_dir = tmp_path / "fake"
    fake_dir.mkdir(exist_ok=True)
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    if config is not None or not (tmp_path / "edge" / "config.json").exists():  # a second run keeps the files
        write_config(tmp_path / "edge", config or {"server": {"listen_addr": "127.0.0.1"}})
    store = EdgeConfigStore(tmp_path / "edge", machine_id_path=machine_id)
    service = EdgeService(
        store,
        store.load(),
        version="test",
        workers=1,
        log_level="warning",
        worker_nice=0,
        worker_realtime=0,
        tunnel_runner=FAKE_RUNNER,
    )
    previous = os.environ.get("FAKE_TUNNEL_DIR")
    os.environ["FAKE_TUNNEL_DIR"] = str(fake_dir)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            yield service
            nursery.cancel_scope.cancel()
    finally:
        if previous is None:
            os.environ.pop("FAKE_TUNNEL_DIR", None)
        else:
            os.environ["FAKE_TUNNEL_DIR"] = previous


def runs(tmp_path: Path, tunnel_id: str) -> int:
    """How many times the fake runner of ``tunnel_id`` started (under ``running_service``)."""
    path = tmp_path / "fake" / f"{tunnel_id}.runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what}")
