"""Flow watch: a running flow's successive reports turned into events, once per transition.

Sans-IO: fed the flow's typed counters, its input signal state and the time; answers
the events to send. Two families (interop.md 11 and the analysis category):

- **Input signal**: ``listening`` → ``receiving`` is "input receiving" (info);
  ``receiving`` → ``waiting`` (silent for a second) is "input lost" (critical);
  ``waiting`` → ``receiving`` is "input restored" (info).
- **TR 101 290 alarms**, per indicator (``Tr101290Stats`` declares which fields are
  indicators and their priority, ETSI TR 101 290 §5.2): *raised* when its counter
  moves (priority 1 critical, priority 2 warning), *cleared* (info) once it has not
  moved for ``clear_after_s`` (the health window of interop.md 11, 10 s, so an alarm
  clears when the health it caused does). While an alarm holds, further errors only
  extend it: one event per transition, none while the state holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from appliance.models.events import Event, EventCategory, critical, info
from appliance.models.events import warning as warning_event
from appliance.models.stats import TR101290_INDICATORS, Tr101290Stats

CLEAR_AFTER_S: Final = 10.0


@dataclass
class _Alarm:
    last_count: int = 0
    raised: bool = False
    last_error_at: float = 0.0


class FlowWatch:
    """The event rules of one running flow (a new one per start)."""

    def __init__(self, flow_id: str, clear_after_s: float = CLEAR_AFTER_S) -> None:
        self.flow_id = flow_id
        self.clear_after_s = clear_after_s
        self._signal = "listening"
        self._alarms = {name: _Alarm() for name in TR101290_INDICATORS}

    def update(self, signal: str, tr101290: Tr101290Stats | None, now: float) -> list[Event]:
        """The events of this report (``signal``: ``listening``/``receiving``/``waiting``)."""
        events: list[Event] = []
        previous, self._signal = self._signal, signal
        if signal != previous:
            if signal == "receiving":
                text = "input receiving" if previous == "listening" else "input restored"
                events.append(info(EventCategory.FLOW, text, flow_id=self.flow_id))
            elif signal == "waiting" and previous == "receiving":
                events.append(critical(EventCategory.FLOW, "input lost", flow_id=self.flow_id))
        if tr101290 is not None:
            events.extend(self._alarm_events(tr101290, now))
        return events

    def _alarm_events(self, tr: Tr101290Stats, now: float) -> list[Event]:
        events = []
        for name, (priority, label) in TR101290_INDICATORS.items():
            alarm = self._alarms[name]
            count = int(getattr(tr, name))
            if count > alarm.last_count:
                alarm.last_error_at = now
                if not alarm.raised:
                    alarm.raised = True
                    make = critical if priority == 1 else warning_event
                    events.append(self._alarm_event(make, "raised", name, priority, label, count))
            elif alarm.raised and now - alarm.last_error_at >= self.clear_after_s:
                alarm.raised = False
                events.append(self._alarm_event(info, "cleared", name, priority, label, count))
            alarm.last_count = count
        return events

    def _alarm_event(
        self, make: Callable[..., Event], action: str, name: str, priority: int, label: str, count: int
    ) -> Event:
        return make(
            EventCategory.ANALYSIS,
            f"TR 101 290 priority {priority} alarm {action}: {label}",
            flow_id=self.flow_id,
            indicator=name,
            priority=priority,
            count=count,
        )
