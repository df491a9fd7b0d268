"""Events: what happened to a flow, an input, an output or the node (interop.md 11).

An event is ``{severity, category, message, details?, flow_id?}``. Engine workers
send them over the IPC (``op: "event"``), the control process adds its own
(lifecycle transitions), and the one event bus (``services.edge.events``) numbers,
timestamps, logs and keeps them; the manager link forwards them. The same models
are used at both ends, so a field cannot be renamed on one side only.

Severities are ``info``, ``warning`` and ``critical`` (there is no ``error``).
Messages and details never carry a secret (a passphrase, a token, a key).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class EventCategory(StrEnum):
    """interop.md 11 categories, plus ``analysis`` (TR 101 290 alarms raised and cleared)."""

    FLOW = "flow"
    SRT = "srt"
    REDUNDANCY = "redundancy"
    ANALYSIS = "analysis"
    RTMP = "rtmp"
    RTSP = "rtsp"
    HLS = "hls"
    WEBRTC = "webrtc"
    TUNNEL = "tunnel"
    MANAGER = "manager"
    CONFIG = "config"


class Event(BaseModel):
    """One event as produced (worker or control process), before the bus numbers it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    severity: Severity
    category: EventCategory
    message: str = Field(min_length=1, max_length=1024)
    details: dict[str, Any] | None = None
    flow_id: str | None = None


class StoredEvent(Event):
    """An event as the bus keeps and serves it: numbered from 1, with its UTC time."""

    id: int = Field(ge=1)
    timestamp: str  # RFC 3339, UTC, millisecond precision: "2026-11-27T09:12:03.412Z"


def info(category: EventCategory, message: str, *, flow_id: str | None = None, **details: Any) -> Event:
    """An ``info`` event (details given as keyword arguments; none means no ``details``)."""
    return Event(severity=Severity.INFO, category=category, message=message, flow_id=flow_id, details=details or None)


def warning(category: EventCategory, message: str, *, flow_id: str | None = None, **details: Any) -> Event:
    """A ``warning`` event."""
    return Event(
        severity=Severity.WARNING, category=category, message=message, flow_id=flow_id, details=details or None
    )


def critical(category: EventCategory, message: str, *, flow_id: str | None = None, **details: Any) -> Event:
    """A ``critical`` event."""
    return Event(
        severity=Severity.CRITICAL, category=category, message=message, flow_id=flow_id, details=details or None
    )
