"""The flow lifecycle table: every row, a missing row raises, one event per transition."""

from __future__ import annotations

import itertools

import pytest

from appliance import errors
from appliance.models.events import Event, EventCategory, Severity
from appliance.models.stats import FlowState
from services.edge.lifecycle import TRANSITIONS, FlowLifecycle, InvalidTransition, Trigger

# How to bring a fresh (Idle) flow into each state through the table itself.
PATH_TO: dict[FlowState, tuple[Trigger, ...]] = {
    FlowState.IDLE: (),
    FlowState.STARTING: (Trigger.START,),
    FlowState.RUNNING: (Trigger.START, Trigger.STARTED),
    FlowState.STOPPED: (Trigger.START, Trigger.STARTED, Trigger.STOP),
    FlowState.ERROR: (Trigger.START, Trigger.START_FAILED),
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lifecycle_in(state: FlowState) -> tuple[FlowLifecycle, list[Event]]:
    events: list[Event] = []
    lifecycle = FlowLifecycle(events.append, Clock())
    lifecycle.add("f")
    for trigger in PATH_TO[state]:
        lifecycle.fire("f", trigger, "reason")
    assert lifecycle.state("f") is state
    events.clear()
    return lifecycle, events


@pytest.mark.parametrize(("state", "trigger"), sorted(TRANSITIONS, key=str))
def test_every_row_moves_to_its_state_with_one_event(state: FlowState, trigger: Trigger) -> None:
    lifecycle, events = lifecycle_in(state)
    row = lifecycle.fire("f", trigger, "bind failed")
    assert lifecycle.state("f") is row.next is TRANSITIONS[(state, trigger)].next
    assert len(events) == 1
    event = events[0]
    assert event.category is EventCategory.FLOW and event.flow_id == "f" and event.severity is row.severity
    assert event.details == {"state": row.next.value, "previous_state": state.value}
    status = lifecycle.status("f")
    assert (status.error == "bind failed") is (row.next is FlowState.ERROR)
    assert (status.started_at is not None) is (row.next is FlowState.RUNNING)
    if row.next is FlowState.ERROR:
        assert event.severity is Severity.CRITICAL and "bind failed" in event.message


MISSING = [
    (state, trigger) for state, trigger in itertools.product(FlowState, Trigger) if (state, trigger) not in TRANSITIONS
]


@pytest.mark.parametrize(("state", "trigger"), MISSING)
def test_a_missing_row_raises_and_changes_nothing(state: FlowState, trigger: Trigger) -> None:
    lifecycle, events = lifecycle_in(state)
    with pytest.raises(InvalidTransition):
        lifecycle.fire("f", trigger, "x")
    assert lifecycle.state("f") is state and events == []


def test_the_table_covers_what_the_service_needs() -> None:
    # Starting is left only by the engine's answer, and every state but Starting/Running can start.
    assert {t for (s, t) in TRANSITIONS if s is FlowState.STARTING} == {Trigger.STARTED, Trigger.START_FAILED}
    startable = {s for (s, t) in TRANSITIONS if t is Trigger.START}
    assert startable == {FlowState.IDLE, FlowState.STOPPED, FlowState.ERROR}
    assert len(MISSING) + len(TRANSITIONS) == len(FlowState) * len(Trigger)


def test_require_gives_the_api_its_404_and_409() -> None:
    lifecycle, _ = lifecycle_in(FlowState.RUNNING)
    with pytest.raises(errors.Conflict, match="'f' is already running"):
        lifecycle.require("f", Trigger.START)
    lifecycle.require("f", Trigger.STOP)
    lifecycle.fire("f", Trigger.STOP)
    with pytest.raises(errors.Conflict, match="'f' is not running"):
        lifecycle.require("f", Trigger.STOP)
    with pytest.raises(errors.NotFound, match="'nope' not found"):
        lifecycle.require("nope", Trigger.START)
    with pytest.raises(InvalidTransition):
        lifecycle.fire("nope", Trigger.START)


def test_no_event_while_a_state_holds_and_listeners_see_each_change() -> None:
    events: list[Event] = []
    seen: list[tuple[str, FlowState, FlowState]] = []
    lifecycle = FlowLifecycle(events.append, Clock())
    lifecycle.listeners.append(lambda *change: seen.append(change))
    lifecycle.add("f")
    lifecycle.add("f")  # known already: kept as it is, no event
    assert events == [] and lifecycle.count(FlowState.IDLE) == 1
    lifecycle.fire("f", Trigger.START)
    lifecycle.fire("f", Trigger.STARTED)
    lifecycle.add("f")
    assert lifecycle.state("f") is FlowState.RUNNING and len(events) == 2
    assert seen == [("f", FlowState.IDLE, FlowState.STARTING), ("f", FlowState.STARTING, FlowState.RUNNING)]
    lifecycle.forget("f")
    assert lifecycle.get("f") is None and lifecycle.state("f") is FlowState.IDLE
