"""``/api/v1/events`` (interop.md 7.3): the list, the acknowledgement, the unacknowledged count.

- ``GET /api/v1/events?node_id&severity&category&flow_id&search&from&to&page&per_page``
  (viewer and above): a **bare array** of rows, newest first, with ``X-Total-Count``.
  ``search`` ≤256 chars, ``from``/``to`` RFC 3339 (inclusive), ``page`` ≥1 (1),
  ``per_page`` 1 to 200 (50). A bad parameter is 400 naming it, never its value.
- ``POST /api/v1/events/{id}/ack`` (operator and above): 200 with an empty body; idempotent
  (the first acknowledgement's who and when are kept); 404 for an unknown id.
- ``GET /api/v1/events/count`` (viewer and above): ``{count}``, the unacknowledged
  ``warning`` and ``critical`` events.

Node access (interop.md 7.1, 13): a user below ``admin`` whose ``allowed_node_ids`` is a list
sees only the events of those nodes (not the manager's own, node-less events); a
``node_id`` filter outside the list, or acknowledging such an event, is 403.
"""

from __future__ import annotations

import dataclasses
from typing import Final
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError
from quart import Blueprint, Response, request

from appliance import errors
from appliance.http.envelope import describe_validation_error, json_response
from services.manager.api.auth_routes import current_principal, require, service
from services.manager.auth import visible_node_ids
from services.manager.service import Principal, Timestamp
from services.manager.store import EventFilter, EventPage, EventRecord, EventSeverity, Role, Store
from services.manager.store import events as event_rows

__all__ = ["EventOut", "EventQuery", "bp"]

bp = Blueprint("manager_events", __name__)

MAX_PER_PAGE: Final = event_rows.MAX_PER_PAGE
SEARCH_MAX: Final = event_rows.SEARCH_MAX
_ALERTS: Final = (EventSeverity.WARNING, EventSeverity.CRITICAL)


class EventOut(BaseModel):
    """An event row: exactly the fields of interop.md 7.3."""

    id: int
    node_id: UUID | None
    severity: EventSeverity
    category: str
    message: str
    details: JsonValue
    flow_id: str | None
    created_at: Timestamp
    acknowledged: bool
    acknowledged_by: str | None

    @classmethod
    def from_record(cls, record: EventRecord) -> EventOut:
        return cls.model_validate({name: getattr(record, name) for name in cls.model_fields})


class EventQuery(BaseModel):
    """The query string of ``GET /api/v1/events``; other parameters are ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    node_id: UUID | None = None
    severity: EventSeverity | None = None
    category: str | None = Field(None, max_length=256)
    flow_id: str | None = Field(None, max_length=256)
    search: str | None = Field(None, max_length=SEARCH_MAX)
    since: AwareDatetime | None = Field(None, alias="from")
    until: AwareDatetime | None = Field(None, alias="to")
    page: int = Field(1, ge=1, le=1_000_000)
    per_page: int = Field(50, ge=1, le=MAX_PER_PAGE)

    def to_filter(self) -> EventFilter:
        return EventFilter(
            node_id=self.node_id,
            severity=self.severity,
            category=self.category,
            flow_id=self.flow_id,
            since=self.since,
            until=self.until,
            search=self.search or None,
        )


_QUERY: Final = TypeAdapter(EventQuery)


def _parse_query() -> EventQuery:
    raw = {key: request.args.get(key) for key in request.args}
    try:
        return _QUERY.validate_python(raw)
    except ValidationError as exc:
        raise errors.InvalidInput(f"Validation failed: {describe_validation_error(exc)}") from None


def allowed_nodes(principal: Principal) -> frozenset[UUID] | None:
    """The nodes the caller may see; None: every node (``auth.visible_node_ids``)."""
    return visible_node_ids(principal.user)


def _check_node_access(allowed: frozenset[UUID] | None, node_id: UUID | None) -> None:
    if allowed is not None and (node_id is None or node_id not in allowed):
        raise errors.NotAllowed("no access to this node")


async def query_events(
    store: Store, where: EventFilter, allowed: frozenset[UUID] | None, page: int, per_page: int
) -> EventPage:
    """One page, limited to ``allowed`` nodes unless it is None."""
    if allowed is not None and where.node_id is None:
        where = dataclasses.replace(where, node_ids=allowed)
    return await store.query_events(where, page=page, per_page=per_page)


async def count_alerts(store: Store, allowed: frozenset[UUID] | None) -> int:
    """Unacknowledged warning and critical events, of ``allowed`` nodes unless it is None."""
    if allowed is None:
        return await store.count_unacknowledged_alerts()
    total = 0
    for severity in _ALERTS:
        page = await query_events(store, EventFilter(severity=severity, acknowledged=False), allowed, 1, 1)
        total += page.total
    return total


# --- routes --------------------------------------------------------------------------------


@bp.get("/api/v1/events")
@require(Role.VIEWER)
async def list_events() -> Response:
    """A bare array of matching events, newest first; ``X-Total-Count`` counts every match."""
    query = _parse_query()
    allowed = allowed_nodes(current_principal())
    if query.node_id is not None:
        _check_node_access(allowed, query.node_id)
    found = await query_events(service().store, query.to_filter(), allowed, query.page, query.per_page)
    return json_response([EventOut.from_record(row) for row in found.rows], headers={"X-Total-Count": str(found.total)})


@bp.get("/api/v1/events/count")
@require(Role.VIEWER)
async def count_events() -> Response:
    """``{count}``: unacknowledged warning and critical events."""
    return json_response({"count": await count_alerts(service().store, allowed_nodes(current_principal()))})


def _event_id(text: str) -> int | None:
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        return None
    return int(text)


@bp.post("/api/v1/events/<event_id>/ack")
@require(Role.OPERATOR)
async def acknowledge_event(event_id: str) -> Response:
    """Acknowledges the event: 200, empty body; again: 200, the first ack kept."""
    principal = current_principal()
    store = service().store
    number = _event_id(event_id)
    found = None if number is None else await store.get_event(number)
    if number is None or found is None:
        raise errors.NotFound("event not found")
    _check_node_access(allowed_nodes(principal), found.node_id)
    await store.acknowledge_event(number, principal.user.username)
    return Response("", status=200)
