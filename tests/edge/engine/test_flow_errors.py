"""A broad catch in the engine or the analysis is never silent: logged once with its
traceback, counted, and a critical ``flow`` event (throttled to one a minute after the first).

The fault is injected (a bug cannot be ordered up): the analyser's TS feed raises.
"""

from __future__ import annotations

import logging

import pytest

from appliance.models.config import FlowConfig
from appliance.models.events import EventCategory, Severity
from services.edge.engine import flow as flow_module
from services.edge.engine.flow import FlowRuntime
from tests.helpers.media import TsSource

FLOW = FlowConfig.model_validate({"id": "f", "name": "F", "input": {"type": "udp", "bind_addr": "127.0.0.1:5000"}})


def test_an_analysis_fault_is_logged_once_counted_and_an_event(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = FlowRuntime(FLOW, lambda flow_id, error: None)

    def broken(*args: object) -> None:
        raise ZeroDivisionError("a bug in the analyser")

    monkeypatch.setattr(runtime.analysis._tr, "feed_packets", broken)
    clock = iter([100.0, 100.5, 200.0])
    monkeypatch.setattr(flow_module.time, "monotonic", lambda: next(clock))
    source = TsSource()
    caplog.set_level(logging.DEBUG, logger="mediaplane.engine")
    for report in range(3):
        for _ in range(4):
            runtime.on_ts(0, memoryview(source.datagram()), 1.0 + report)
            runtime.end_batch()
        runtime.counters(1.0 + report)  # what the worker's report loop calls every 250 ms
    assert runtime.analysis.internal_errors == 12 and runtime.internal_errors == 12
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None and "analysis failed" in errors[0].getMessage()
    events = list(runtime.pending_events)
    # The first report: an event at once; the second (0.5 s later): counted only; the third (100 s later): one more.
    assert [e.details["count"] for e in events if e.details] == [4, 12]
    assert all(e.severity is Severity.CRITICAL and e.category is EventCategory.FLOW for e in events)
    assert events[0].message == "internal error: analysis failed" and events[0].flow_id == "f"
