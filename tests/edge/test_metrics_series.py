"""The edge collector's series beyond the interface: flow state and health (one-hot, every flow),
priority 1/2 status, and one counter per TR 101 290 indicator, from a snapshot built by hand."""

from __future__ import annotations

import re

from appliance.models.stats import (
    TR101290_INDICATORS,
    TR101290_METRICS,
    FlowState,
    FlowStats,
    Health,
    InputStats,
    StatsSnapshot,
    SystemStats,
    Tr101290Stats,
)
from services.edge.metrics import EdgeMetrics

# Every counter field of Tr101290Stats gets a distinct value, so a series read from the wrong
# field shows.
TR = Tr101290Stats(
    **{field: 100 + i for i, field in enumerate(TR101290_METRICS)},
    priority1_ok=False,
    priority2_ok=True,
)


def flow(flow_id: str, state: FlowState, health: Health, tr: Tr101290Stats | None = None) -> FlowStats:
    return FlowStats(
        flow_id=flow_id,
        flow_name=flow_id,
        state=state,
        health=health,
        input=InputStats(input_type="rtp", packets_received=7 if tr else 0),
        tr101290=tr,
    )


def render(*flows: FlowStats) -> str:
    active = sum(1 for f in flows if f.state is FlowState.RUNNING)
    snap = StatsSnapshot(
        system=SystemStats(uptime_secs=5, total_flows=len(flows), active_flows=active, version="0.1.0"),
        flows=list(flows),
    )
    return EdgeMetrics(lambda: snap).render().decode()


def samples(text: str, name: str) -> dict[str, float]:
    """'{labels}' -> value of one family's sample lines."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(re.escape(name) + r"(\{.*\})? (\S+)", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


def test_state_and_health_are_one_hot_for_every_flow() -> None:
    text = render(
        flow("run", FlowState.RUNNING, Health.ERROR, TR),
        flow("bad", FlowState.ERROR, Health.CRITICAL),
        flow("off", FlowState.STOPPED, Health.HEALTHY),
    )
    states = samples(text, "mediaplane_edge_flow_state")
    assert len(states) == 3 * len(FlowState)
    assert {k for k, v in states.items() if v == 1} == {
        '{flow_id="run",state="Running"}',
        '{flow_id="bad",state="Error"}',
        '{flow_id="off",state="Stopped"}',
    }
    health = samples(text, "mediaplane_edge_flow_health")
    assert len(health) == 3 * len(Health)
    assert {k for k, v in health.items() if v == 1} == {
        '{flow_id="run",health="Error"}',
        '{flow_id="bad",health="Critical"}',
        '{flow_id="off",health="Healthy"}',
    }
    assert "# TYPE mediaplane_edge_flow_state gauge" in text
    assert "# TYPE mediaplane_edge_flow_health gauge" in text
    # The interface's per-flow series remain for running flows only.
    other = [line for line in text.splitlines() if 'flow_id="bad"' in line or 'flow_id="off"' in line]
    assert other and all(
        line.startswith(("mediaplane_edge_flow_state{", "mediaplane_edge_flow_health{")) for line in other
    )


def test_priority_status_and_every_indicator_counter_come_from_the_json() -> None:
    text = render(flow("run", FlowState.RUNNING, Health.ERROR, TR))
    assert samples(text, "mediaplane_edge_tr101290_priority1_ok") == {'{flow_id="run"}': 0.0}
    assert samples(text, "mediaplane_edge_tr101290_priority2_ok") == {'{flow_id="run"}': 1.0}
    assert set(TR101290_INDICATORS) <= set(TR101290_METRICS)  # every indicator has a counter
    values = TR.model_dump()
    for field, suffix in TR101290_METRICS.items():
        name = f"mediaplane_edge_tr101290_{suffix}"
        assert name.endswith("_total") and f"# TYPE {name} counter" in text, name
        assert samples(text, name) == {'{flow_id="run"}': float(values[field])}, field
    priority, label = TR101290_INDICATORS["pts_errors"]
    assert f"# HELP mediaplane_edge_tr101290_pts_errors_total TR 101 290 priority {priority} indicator: {label}" in text


def test_a_flow_without_analysis_yet_has_no_priority_series() -> None:
    text = render(flow("new", FlowState.RUNNING, Health.CRITICAL))
    assert samples(text, "mediaplane_edge_tr101290_priority1_ok") == {}
    assert samples(text, "mediaplane_edge_flow_input_packets_total") == {'{flow_id="new"}': 0.0}
