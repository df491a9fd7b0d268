"""Start the real ``mp-relay`` for tests: its log in a file, its ports from its listening line."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RELAY_BIN = Path(sys.executable).with_name("mp-relay")
_LISTENING = re.compile(r"mp-relay \S+ listening: api (http://127\.0\.0\.1:\d+), quic (\S+), udp (\S+)")
LOOPBACK = ["--api-addr", "127.0.0.1:0", "--quic-addr", "127.0.0.1:0", "--udp-addr", "127.0.0.1:0"]


@dataclass
class Relay:
    process: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""
    quic: str = ""
    udp: str = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return int(self.process.returncode)


def start_relay(config: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> Relay:
    """``mp-relay --config CONFIG ARGS`` with its log in a file; waits for the listening line."""
    log_path = config.with_suffix(".log")
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(RELAY_BIN), "--config", str(config), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    relay = Relay(process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mp-relay exited with {process.returncode}:\n{relay.log()}")
        found = _LISTENING.search(relay.log())
        if found:
            relay.url, relay.quic, relay.udp = found.groups()
            return relay
        time.sleep(0.05)
    relay.stop()
    raise RuntimeError(f"mp-relay did not log its listening line in {timeout} s:\n{relay.log()}")


@contextmanager
def running_relay(config: Path, *args: str, **kwargs: Any) -> Iterator[Relay]:
    relay = start_relay(config, *args, **kwargs)
    try:
        yield relay
    finally:
        relay.stop()


def wait_tunnel_delivers(entry_port: int, sink: socket.socket, payload: bytes, timeout: float = 20.0) -> None:
    """Send ``payload`` into a tunnel's source side (UDP to 127.0.0.1:``entry_port``) until it comes
    out of ``sink`` (a bound UDP socket with a receive timeout), or fail after ``timeout``: a
    tunnel's first datagrams may be dropped while its legs bind."""
    from tests.helpers.edge import wait_for

    def delivered() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(payload, ("127.0.0.1", entry_port))
        try:
            return sink.recv(65536) == payload
        except TimeoutError:
            return False

    wait_for(delivered, timeout=timeout, interval=0.1)
