"""Stats aggregation: zeros for stopped flows, bitrate, and the health rules of interop.md 11."""

from __future__ import annotations

import pytest

from appliance.models.config import FlowConfig
from appliance.models.events import Event
from appliance.models.stats import FlowCounters, FlowState, Health
from services.edge.lifecycle import FlowLifecycle, Trigger
from services.edge.stats import StatsAggregator

FLOW = FlowConfig.model_validate(
    {
        "id": "f",
        "name": "F",
        "input": {"type": "rtp", "bind_addr": "127.0.0.1:5000"},
        "outputs": [{"type": "rtp", "id": "o", "name": "O", "dest_addr": "127.0.0.1:6000"}],
    }
)


def counters(
    t: float, *, lost: int = 0, cc: int = 0, tei: int = 0, sync_loss: int = 0, rate_bps: int = 8_000_000
) -> FlowCounters:
    byte_count = int(rate_bps / 8 * t)
    tr = {"ts_packets_analyzed": 100, "sync_loss_count": sync_loss, "cc_errors": cc, "tei_errors": tei}
    return FlowCounters.model_validate(
        {
            "input": {
                "state": "receiving",
                "packets_received": int(t * 1000),
                "bytes_received": byte_count,
                "packets_lost": lost,
            },
            "outputs": [{"output_id": "o", "state": "active", "packets_sent": int(t * 1000), "bytes_sent": byte_count}],
            "analysis": {
                "tr101290": tr,
                "media": None,
                "iat": {"min_us": 1.0, "max_us": 3.0, "avg_us": 2.0},
                "pdv_jitter_us": 5.0,
            },
        }
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def aggregator(*triggers: Trigger) -> tuple[StatsAggregator, list[Event]]:
    """An aggregator over a lifecycle holding flow ``f``, taken through ``triggers`` at t=0."""
    events: list[Event] = []
    lifecycle = FlowLifecycle(events.append, Clock())
    lifecycle.add("f")
    for trigger in triggers:
        lifecycle.fire("f", trigger, "boom" if "FAIL" in trigger.name else None)
    return StatsAggregator("0.1.0", 0.0, lifecycle), events


def running(samples: list[tuple[float, FlowCounters]]) -> StatsAggregator:
    agg, _ = aggregator(Trigger.START, Trigger.STARTED)
    for t, c in samples:
        agg.on_counters({"f": c}, t)
    return agg


def test_stopped_flows_report_zeros() -> None:
    agg, _ = aggregator(Trigger.START, Trigger.STARTED, Trigger.STOP)
    agg.on_counters({"f": counters(1.0)}, 1.0)  # a late report of the stopped flow is ignored
    stats = agg.flow_stats(FLOW, 5.0)
    assert stats.health is Health.HEALTHY and stats.tr101290 is None and stats.iat is None
    assert stats.input.packets_received == 0 and stats.outputs[0].packets_sent == 0


def test_bitrate_over_the_last_second() -> None:
    agg = running([(t / 4, counters(t / 4)) for t in range(0, 13)])
    stats = agg.flow_stats(FLOW, 3.0)
    assert stats.input.bitrate_bps == 8_000_000 and stats.outputs[0].bitrate_bps == 8_000_000
    assert stats.health is Health.HEALTHY and stats.uptime_secs == 3


@pytest.mark.parametrize(
    ("late", "expected"),
    [
        ({"sync_loss": 1}, Health.CRITICAL),
        ({"cc": 1}, Health.ERROR),
        ({"rate_bps": 0}, Health.CRITICAL),
        ({"lost": 101}, Health.ERROR),
        ({"tei": 1}, Health.WARNING),
        ({"lost": 1}, Health.WARNING),
        ({}, Health.HEALTHY),
    ],
)
def test_health_rules_in_order(late: dict[str, int], expected: Health) -> None:
    samples = [(t / 4, counters(t / 4)) for t in range(0, 8)]
    rate = late.pop("rate_bps", 8_000_000)
    if rate == 0:
        frozen = counters(1.75)
        samples += [(2.0 + t / 4, frozen) for t in range(0, 8)]
    else:
        samples += [(2.0 + t / 4, counters(2.0 + t / 4, **late)) for t in range(0, 8)]
    agg = running(samples)
    assert agg.flow_stats(FLOW, 4.0).health is expected


def test_errors_age_out_of_the_ten_second_window() -> None:
    samples = [(t / 4, counters(t / 4, cc=1 if t >= 4 else 0)) for t in range(0, 4 * 15)]
    agg = running(samples)
    assert agg.flow_stats(FLOW, 15.0).health is Health.HEALTHY


def test_error_state_is_critical() -> None:
    agg, _ = aggregator(Trigger.START, Trigger.START_FAILED)
    assert agg.flow_stats(FLOW, 1.0).health is Health.CRITICAL


def test_a_restart_starts_from_a_fresh_baseline() -> None:
    agg = running([(t / 4, counters(t / 4, cc=1)) for t in range(0, 8)])
    assert agg.flow_stats(FLOW, 2.0).health is Health.ERROR
    agg.lifecycle.fire("f", Trigger.STOP)
    agg.lifecycle.fire("f", Trigger.START)
    agg.lifecycle.fire("f", Trigger.STARTED)
    stats = agg.flow_stats(FLOW, 2.0)
    assert stats.state is FlowState.RUNNING and stats.tr101290 is None  # no report since the restart
