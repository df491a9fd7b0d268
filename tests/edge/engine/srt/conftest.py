"""Helpers for the SRT tests: free loopback ports, srt-live-transmit, a UDP sink."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from services.edge.engine.srt import binding

SLT = "srt-live-transmit"
PASSPHRASE = "mediaplane-test-1"


def _require_libsrt() -> None:
    try:
        binding.lib()
    except binding.SrtLibraryMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"libsrt missing in CI: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(autouse=True)
def libsrt() -> None:
    _require_libsrt()


class SltProcess:
    """One srt-live-transmit process; its output goes to a log file shown on failure."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, source: str, target: str) -> subprocess.Popen[bytes]:
        log = self._log_dir / f"slt-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen([SLT, "-q", source, target], stdout=out, stderr=subprocess.STDOUT)
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL: the far end vanishes without sending an SRT shutdown."""
        proc.kill()
        proc.wait(timeout=5)

    def stop_all(self) -> None:
        for proc in self._procs:
            self.stop(proc)

    def log_text(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs if p.exists())


@pytest.fixture
def slt(tmp_path: Path) -> Iterator[SltProcess]:
    if shutil.which(SLT) is None:
        if os.environ.get("CI") == "true":
            pytest.fail("srt-live-transmit missing in CI (install srt-tools)")
        pytest.skip("srt-live-transmit (srt-tools) not installed")
    procs = SltProcess(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


class UdpSink:
    """A loopback UDP socket counting (and keeping) the datagrams it receives."""

    def __init__(self) -> None:
        self.sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        self.datagrams: list[bytes] = []
        self.port = 0

    async def bind(self) -> int:
        # 4 MiB (net.core.rmem_max here): ~3000 datagrams, seconds of a starved test task
        self.sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4 * 1024 * 1024)
        await self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        return self.port

    async def run(self) -> None:
        while True:
            self.datagrams.append(await self.sock.recv(2048))


@pytest.fixture
async def udp_sink() -> AsyncIterator[UdpSink]:
    """A bound UdpSink (run ``sink.run`` in a nursery), closed after the test."""
    sink = UdpSink()
    with sink.sock:
        await sink.bind()
        yield sink


async def wait_until(predicate, timeout: float, interval: float = 0.01) -> float:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until true; returns the time it took. Fails after ``timeout``."""
    start = trio.current_time()
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(interval)
    return trio.current_time() - start


def message(i: int, size: int = 1316) -> bytes:
    """A recognisable message: its index in the first 4 bytes."""
    return i.to_bytes(4, "big") + bytes([i & 0xFF]) * (size - 4)
