"""The flow lifecycle: one transition table, the only place a flow's state changes.

Written the way h11's ``_state.py`` is: the states (interop.md 11: Idle, Starting,
Running, Error, Stopped), the triggers, and a table ``(state, trigger) -> row``. A
trigger with no row for the current state raises, so a missing case is a loud bug,
never a silent stuck state. Every transition emits exactly one event (its row says the
severity and the text), and nothing is emitted while a state holds.

The API's answers come from here too: ``require`` turns "this trigger has no row in
this state" into the 409 the edge interface §3 lists (start of a running flow, stop of
a flow that is not running), and an unknown flow is the 404.

Sans-IO: the caller passes the clock (``now``) and a ``publish`` callable (the event bus).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from appliance import errors
from appliance.models.events import Event, EventCategory, Severity
from appliance.models.stats import FlowState

Idle, Starting, Running, Error, Stopped = (
    FlowState.IDLE,
    FlowState.STARTING,
    FlowState.RUNNING,
    FlowState.ERROR,
    FlowState.STOPPED,
)


class Trigger(StrEnum):
    START = "start"  # a start was asked (the API, boot, restart, a config apply)
    STARTED = "started"  # the engine reports the input and outputs open
    START_FAILED = "start_failed"  # the engine refused or failed the start (or it was abandoned)
    STOP = "stop"  # the engine stopped it on request (the API, restart, apply, delete)
    STOP_FAILED = "stop_failed"  # the engine failed the stop (the flow is gone from it all the same)
    FAILED = "failed"  # a running flow's input died, or its worker process was lost


@dataclass(frozen=True, slots=True)
class Row:
    next: FlowState
    severity: Severity
    message: str  # "{error}" is the engine's reason


TRANSITIONS: Final[dict[tuple[FlowState, Trigger], Row]] = {
    (Idle, Trigger.START): Row(Starting, Severity.INFO, "flow starting"),
    (Stopped, Trigger.START): Row(Starting, Severity.INFO, "flow starting"),
    (Error, Trigger.START): Row(Starting, Severity.INFO, "flow starting"),
    (Starting, Trigger.STARTED): Row(Running, Severity.INFO, "flow started"),
    (Starting, Trigger.START_FAILED): Row(Error, Severity.CRITICAL, "flow failed to start: {error}"),
    (Running, Trigger.STOP): Row(Stopped, Severity.INFO, "flow stopped"),
    (Running, Trigger.STOP_FAILED): Row(Error, Severity.CRITICAL, "flow failed to stop: {error}"),
    (Running, Trigger.FAILED): Row(Error, Severity.CRITICAL, "flow failed: {error}"),
}
"""Every allowed transition. What is not here raises ``InvalidTransition``."""

# What the API answers (edge interface §3) when a requested trigger has no row.
_CONFLICT_TEXT: Final[dict[Trigger, str]] = {
    Trigger.START: "flow '{flow_id}' is already running",
    Trigger.STOP: "flow '{flow_id}' is not running",
}


class InvalidTransition(Exception):
    """A trigger with no row for the flow's state: a bug in the caller, never user input."""


@dataclass
class FlowStatus:
    """What the control process knows of one configured flow's lifecycle."""

    state: FlowState = Idle
    error: str | None = None
    started_at: float | None = None  # monotonic, while Running


class FlowLifecycle:
    """The state of every configured flow; ``fire`` is the only way to change one."""

    def __init__(self, publish: Callable[[Event], object], clock: Callable[[], float]) -> None:
        self._publish = publish
        self._clock = clock
        self._flows: dict[str, FlowStatus] = {}
        self.listeners: list[Callable[[str, FlowState, FlowState], None]] = []
        """Called with (flow_id, old, new) after each transition (the stats reset on it)."""

    # ---- membership (configured flows)

    def add(self, flow_id: str) -> None:
        """A configured flow, Idle until started (kept as it is when already known)."""
        self._flows.setdefault(flow_id, FlowStatus())

    def forget(self, flow_id: str) -> None:
        """The flow left the configuration (its engine side must already be stopped)."""
        self._flows.pop(flow_id, None)

    def ids(self) -> list[str]:
        return list(self._flows)

    # ---- queries

    def status(self, flow_id: str) -> FlowStatus:
        """The flow's status; ``NotFound`` (404) for a flow that is not configured."""
        status = self._flows.get(flow_id)
        if status is None:
            raise errors.NotFound(f"flow '{flow_id}' not found")
        return status

    def get(self, flow_id: str) -> FlowStatus | None:
        """The flow's status, or None for a flow that is not configured."""
        return self._flows.get(flow_id)

    def state(self, flow_id: str) -> FlowState:
        """The flow's state (Idle for a flow not known: nothing runs for it)."""
        status = self._flows.get(flow_id)
        return status.state if status is not None else Idle

    def allows(self, flow_id: str, trigger: Trigger) -> bool:
        return (self.state(flow_id), trigger) in TRANSITIONS

    def require(self, flow_id: str, trigger: Trigger) -> None:
        """404 for an unknown flow, 409 when ``trigger`` has no row in its state (edge interface §3)."""
        state = self.status(flow_id).state
        if (state, trigger) not in TRANSITIONS:
            text = _CONFLICT_TEXT.get(trigger, "flow '{flow_id}' cannot {trigger} while {state}")
            raise errors.Conflict(text.format(flow_id=flow_id, trigger=trigger.value, state=state.value))

    def count(self, state: FlowState) -> int:
        return sum(1 for status in self._flows.values() if status.state is state)

    # ---- the one place a state changes

    def fire(self, flow_id: str, trigger: Trigger, error: str | None = None) -> Row:
        """Apply ``trigger`` to the flow: its row, the new state, one event. Raises on a missing row."""
        status = self._flows.get(flow_id)
        if status is None:
            raise InvalidTransition(f"flow {flow_id!r} is not configured (trigger {trigger})")
        old = status.state
        row = TRANSITIONS.get((old, trigger))
        if row is None:
            raise InvalidTransition(f"flow {flow_id!r}: no transition from {old} on {trigger}")
        status.state = row.next
        status.error = error if row.next is Error else None
        status.started_at = self._clock() if row.next is Running else None
        message = row.message.format(error=error or "unknown reason")
        details = {"state": row.next.value, "previous_state": old.value}
        self._publish(
            Event(severity=row.severity, category=EventCategory.FLOW, message=message, flow_id=flow_id, details=details)
        )
        for listener in self.listeners:
            listener(flow_id, old, row.next)
        return row
