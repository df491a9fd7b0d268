from __future__ import annotations

from collections.abc import Callable

import pytest

from services.edge.core import analysis as analysis_mod
from services.edge.core.analysis import FlowAnalysis

Feeder = Callable[[FlowAnalysis, list[bytes], list[float]], None]


def _feed_datagrams(fa: FlowAnalysis, datagrams: list[bytes], times: list[float]) -> None:
    for d, t in zip(datagrams, times, strict=True):
        fa.on_datagram(memoryview(d), t, None)


def _feed_batches(fa: FlowAnalysis, datagrams: list[bytes], times: list[float]) -> None:
    for i in range(0, len(datagrams), 64):
        fa.on_batch([memoryview(d) for d in datagrams[i : i + 64]], times[i : i + 64], [None] * len(times[i : i + 64]))


@pytest.fixture(params=["python", "numpy"])
def analysis_feed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Feeder:
    """Feed datagrams through one path: per datagram (Python) or in batches forced onto numpy."""
    if request.param == "numpy":
        monkeypatch.setattr(analysis_mod, "NUMPY_MIN_PACKETS", 0)
        return _feed_batches
    return _feed_datagrams
