"""Field types shared by the node protocol's models: timestamps, secrets, raw JSON objects."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Annotated, Final

from pydantic import AwareDatetime, BaseModel, BeforeValidator, PlainSerializer, SecretStr, ValidationError

from appliance.untrusted import JsonTooDeep, error_message, load_json

JsonObject = dict[str, object]
"""A JSON object kept as received: flows, outputs, tunnels and configs inside commands (the
manager relays them verbatim, interop.md 13), stats and health payloads, event details."""


def format_timestamp(value: datetime) -> str:
    """RFC 3339 UTC with milliseconds and ``Z`` (interop.md conventions: ``2026-11-21T15:04:05.123Z``)."""
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def _timestamp_text(value: object) -> object:
    # A JSON number would pass pydantic's lax datetime parsing as a Unix time; the envelope
    # carries RFC 3339 text (interop.md 6 "Envelope").
    if isinstance(value, str | datetime):
        return value
    raise ValueError("expected an RFC 3339 timestamp")


Timestamp = Annotated[
    AwareDatetime,
    BeforeValidator(_timestamp_text),
    PlainSerializer(format_timestamp, return_type=str),
]
"""An aware datetime; read from any RFC 3339 offset, written as UTC milliseconds with ``Z``."""


def _reveal(value: SecretStr) -> str:
    return value.get_secret_value()


WireSecret = Annotated[SecretStr, PlainSerializer(_reveal, return_type=str, when_used="json")]
"""A credential on the wire (node secret, registration token, bind token): ``repr`` and Python
dumps show ``**********``; only the JSON encoding (the frame) carries the value."""

_UNION_TAGS: Final = frozenset({"token", "secret"})  # the auth variants' tags (node.py)


def describe_validation_error(
    exc: ValidationError, prefix: str = "payload", *, tags: Collection[str] = _UNION_TAGS
) -> str:
    """One line naming each JSON path and problem, never a value from the frame.

    Like ``appliance.http.envelope.describe_validation_error`` (which lives above the cores):
    built from ``exc.errors(include_input=False)``, worded by ``appliance.untrusted.error_message``;
    an unknown key is reported without its name (the key is frame content too). ``tags`` are
    the discriminated unions' tags, which pydantic puts in the location but the JSON path lacks.
    """
    parts: list[str] = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = [str(p) for p in error.get("loc", ()) if not (isinstance(p, str) and p in tags)]
        message = error_message(error)
        if error.get("type") == "extra_forbidden":
            loc = loc[:-1]
            message = "unknown key"
        path = ".".join([prefix, *loc]) if prefix else ".".join(loc)
        parts.append(f"{path or 'message'}: {message}")
        if len(parts) == 3:
            break
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def load_json_object(frame: str | bytes) -> dict[str, object]:
    """A frame's JSON object. ``ProtocolError`` ``MALFORMED`` (not UTF-8, not JSON, nested too
    deep, not an object) with a text that never quotes the frame."""
    from appliance.protocol.errors import ErrorKind, ProtocolError

    if isinstance(frame, bytes):
        try:
            frame = frame.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(ErrorKind.MALFORMED, "Frame is not UTF-8 text") from None
    try:
        document = load_json(frame)
    except JsonTooDeep:
        raise ProtocolError(ErrorKind.MALFORMED, "Frame nests JSON too deep") from None
    except ValueError:
        # from None: a JSONDecodeError keeps the document in its ``doc`` attribute.
        raise ProtocolError(ErrorKind.MALFORMED, "Frame is not valid JSON") from None
    if not isinstance(document, dict):
        raise ProtocolError(ErrorKind.MALFORMED, "Frame is not a JSON object")
    return document


def parse_typed_json(frame: str | bytes, models: Mapping[str, type[BaseModel]]) -> BaseModel:
    """A frame's JSON object as the model its ``type`` names (the node protocol and the relay's).

    Raises ``ProtocolError``: ``MALFORMED`` (see :func:`load_json_object`; or no string
    ``type``), ``UnknownMessageType``, or ``INVALID``. No text quotes the frame.
    """
    from appliance.protocol.errors import ErrorKind, ProtocolError, UnknownMessageType

    document = load_json_object(frame)
    kind = document.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorKind.MALFORMED, "Frame has no message type")
    model = models.get(kind)
    if model is None:
        raise UnknownMessageType()
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        # from None: a ValidationError's own text quotes the input values.
        raise ProtocolError(
            ErrorKind.INVALID, f"Invalid {kind} message: {describe_validation_error(exc, '')}"
        ) from None
