"""srt-live-transmit for the edge's SRT tests: the tool check and a process wrapper."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.edge import Edge

SLT = shutil.which("srt-live-transmit")


def require(found: object, what: str) -> None:
    """Skip when a tool is missing, but fail in CI, where a skip would be a silent pass."""
    if not found:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} is missing in CI")
        pytest.skip(f"{what} is not installed")


def stats(edge: Edge, flow_id: str) -> dict[str, object]:
    """``GET /api/v1/stats/{flow_id}``'s data."""
    with edge.client() as api:
        data: dict[str, object] = api.get(f"/api/v1/stats/{flow_id}").json()["data"]
        return data


class Slt:
    """One srt-live-transmit process, its output in ``log``."""

    def __init__(self, log: Path, source: str, target: str, *, quiet: bool = True) -> None:
        self.log = log
        args = [str(SLT), *(["-q"] if quiet else []), source, target]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
