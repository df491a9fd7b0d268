"""The edge's one event bus: numbers, timestamps, journals, keeps and fans out events.

Every event of the edge control process goes through ``EventBus.publish``: the
engine workers' events (relayed over the IPC), the service's lifecycle events,
and later the manager link's. The bus

- numbers it: ids from 1, strictly increasing, never reused while the process
  lives (an edge restart starts again at 1; a client that sees ``last_id`` go
  down knows the edge restarted);
- timestamps it from the injected ``clock`` (RFC 3339, UTC, milliseconds, ``Z``);
- keeps the last ``capacity`` events in a ring (``GET /api/v1/events`` reads it);
- writes one journal line per event on logger ``mediaplane.events``, so
  ``journalctl -u mp-edge | grep 'event .* flow=cam1'`` finds a flow's history;
- calls each listener synchronously (the manager uplink adds one).

Sans-IO apart from logging: no trio, no sockets. Publishing never raises
because of a listener, so a broken listener cannot cost a lifecycle change.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import islice
from typing import Final

from appliance.models.events import Event, Severity, StoredEvent

_log = logging.getLogger("mediaplane.events")

DEFAULT_CAPACITY: Final = 1000
"""How many events the ring keeps (the oldest is dropped first)."""

# interop.md 11 has no `error` severity; the journal's priorities map onto ours here.
_LOG_LEVEL: Final[dict[Severity, int]] = {
    Severity.INFO: logging.INFO,
    Severity.WARNING: logging.WARNING,
    Severity.CRITICAL: logging.ERROR,
}

EventListener = Callable[[StoredEvent], None]


def rfc3339_utc_ms(epoch_s: float) -> str:
    """``epoch_s`` as RFC 3339 UTC with milliseconds and ``Z``: ``2026-11-27T09:12:03.412Z``."""
    stamp = datetime.fromtimestamp(epoch_s, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def journal_line(event: StoredEvent) -> str:
    """The one log line of an event: ``event 17 warning srt flow=cam1: <message> {details}``.

    Newlines in the message are written as ``\\n`` so one event stays one line.
    Details, if any, follow as compact JSON.
    """
    flow = f" flow={event.flow_id}" if event.flow_id else ""
    text = event.message.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")
    line = f"event {event.id} {event.severity.value} {event.category.value}{flow}: {text}"
    if event.details:
        line += " " + json.dumps(event.details, separators=(",", ":"), ensure_ascii=False, default=str)
    return line


class EventBus:
    """Numbers, timestamps, logs, keeps and fans out the edge's events.

    ``capacity`` bounds the ring of kept events; ``clock`` gives seconds since
    the epoch (``time.time`` in the service, a fixed value in tests).
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise ValueError("capacity must be 1 or more")
        self.capacity: Final = capacity
        self._clock = clock
        self._ring: deque[StoredEvent] = deque(maxlen=capacity)
        self._last_id = 0
        self.listeners: list[EventListener] = []
        """Called in order with each published event; one that raises is logged and skipped."""

    @property
    def last_id(self) -> int:
        """The id of the last published event; 0 before the first."""
        return self._last_id

    def publish(self, event: Event) -> StoredEvent:
        """Number, timestamp, keep, log and fan out ``event``; return it as stored.

        Never raises because of a listener: a listener's exception is logged
        with its traceback and the next listener is called.
        """
        self._last_id += 1
        stored = StoredEvent(
            severity=event.severity,
            category=event.category,
            message=event.message,
            details=event.details,
            flow_id=event.flow_id,
            id=self._last_id,
            timestamp=rfc3339_utc_ms(self._clock()),
        )
        self._ring.append(stored)
        _log.log(_LOG_LEVEL[stored.severity], "%s", journal_line(stored))
        for listener in list(self.listeners):  # a listener may remove itself
            try:
                listener(stored)
            except Exception:  # a broken listener must not stop the others, nor the publisher
                _log.exception("event %d: listener %r failed", stored.id, listener)
        return stored

    def since(self, event_id: int, limit: int | None = None) -> list[StoredEvent]:
        """The kept events with an id above ``event_id``, oldest first (at most ``limit``).

        With a limit, the *oldest* matching events are returned, so a client
        that asks again with the last id it saw catches up without a gap.
        """
        if not self._ring or event_id >= self._last_id:
            return []
        # Kept ids are consecutive (one per publish, the ring drops from the left),
        # so the first wanted event's position is a subtraction.
        skip = max(0, event_id - self._ring[0].id + 1)
        stop = None if limit is None else skip + max(0, limit)
        return list(islice(self._ring, skip, stop))
