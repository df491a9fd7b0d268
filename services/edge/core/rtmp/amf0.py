"""AMF0 encoding and decoding (Adobe "Action Message Format -- AMF 0", December 2007), sans-IO.

Python mapping (AMF0 §2):

=====================  ==============================================
AMF0 type (marker)     Python
=====================  ==============================================
number (0x00)          ``float`` (``int`` is accepted when encoding)
boolean (0x01)         ``bool``
string (0x02)          ``str`` up to 65535 UTF-8 octets
object (0x03)          ``dict[str, value]``
null (0x05)            ``None``
undefined (0x06)       :data:`UNDEFINED`
ECMA array (0x08)      :class:`EcmaArray` (a ``dict`` subclass)
strict array (0x0A)    ``list``
date (0x0B)            :class:`AmfDate` (decode only is typical; encodes too)
long string (0x0C)     ``str`` over 65535 octets (chosen automatically)
=====================  ==============================================

Decoding is bounded: nesting depth (:data:`MAX_DEPTH`) and the number of entries in one
container (:data:`MAX_ENTRIES`); any malformed or truncated input raises :class:`AmfError`
(a :class:`~services.edge.core.rtmp.errors.ProtocolError`). References (0x07), typed objects
(0x10), movieclip/recordset/XML and the AMF3 switch (0x11) are rejected.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from .errors import AmfError

# AMF0 §2.1 type markers
NUMBER: Final = 0x00
BOOLEAN: Final = 0x01
STRING: Final = 0x02
OBJECT: Final = 0x03
NULL: Final = 0x05
UNDEFINED_MARKER: Final = 0x06
REFERENCE: Final = 0x07
ECMA_ARRAY: Final = 0x08
OBJECT_END: Final = 0x09
STRICT_ARRAY: Final = 0x0A
DATE: Final = 0x0B
LONG_STRING: Final = 0x0C

MAX_DEPTH: Final = 32  # nested objects/arrays
MAX_ENTRIES: Final = 65536  # properties or elements in one container

_DOUBLE: Final = struct.Struct(">d")


class _Undefined:
    """The AMF0 ``undefined`` value (§2.8); use the :data:`UNDEFINED` singleton."""

    _instance: _Undefined | None = None

    def __new__(cls) -> _Undefined:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNDEFINED"

    def __bool__(self) -> bool:
        return False


UNDEFINED: Final = _Undefined()


class EcmaArray(dict[str, "AmfValue"]):
    """An AMF0 ECMA array (§2.10): an associative array, encoded with marker 0x08.

    Decodes to this type so a round trip keeps the marker; onMetaData uses it.
    """


@dataclass(frozen=True, slots=True)
class AmfDate:
    """An AMF0 date (§2.13): milliseconds since the epoch (UTC) and the reserved time-zone field."""

    milliseconds: float
    timezone: int = 0


AmfValue: TypeAlias = float | int | bool | str | _Undefined | AmfDate | dict[str, "AmfValue"] | list["AmfValue"] | None


# ---------------------------------------------------------------------------- encoding


def _encode_utf8(text: str, out: bytearray) -> None:
    """A UTF-8 string without its marker (§1.3 UTF-8, 16-bit length)."""
    raw = text.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"AMF0 property name too long ({len(raw)} octets)")
    out += len(raw).to_bytes(2, "big") + raw


def _encode_properties(items: Mapping[str, AmfValue], out: bytearray, depth: int) -> None:
    for key, item in items.items():
        if not isinstance(key, str):
            raise TypeError(f"AMF0 object keys are strings, not {type(key).__name__}")
        _encode_utf8(key, out)
        _encode_into(item, out, depth + 1)
    out += b"\x00\x00" + bytes([OBJECT_END])  # §2.11 object-end: empty name + 0x09


def _encode_into(value: AmfValue, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError("AMF0 value nested too deeply")
    if value is None:
        out.append(NULL)
    elif value is UNDEFINED:
        out.append(UNDEFINED_MARKER)
    elif isinstance(value, bool):  # before int: bool is an int subclass
        out += bytes([BOOLEAN, 1 if value else 0])
    elif isinstance(value, int | float):
        out.append(NUMBER)
        out += _DOUBLE.pack(float(value))
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        if len(raw) <= 0xFFFF:
            out.append(STRING)
            out += len(raw).to_bytes(2, "big") + raw
        else:  # §2.14 long string, 32-bit length
            out.append(LONG_STRING)
            out += len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, AmfDate):
        out.append(DATE)
        out += _DOUBLE.pack(value.milliseconds) + (value.timezone & 0xFFFF).to_bytes(2, "big")
    elif isinstance(value, EcmaArray):
        out.append(ECMA_ARRAY)
        out += len(value).to_bytes(4, "big")  # §2.10 associative-count (a hint)
        _encode_properties(value, out, depth)
    elif isinstance(value, Mapping):
        out.append(OBJECT)
        _encode_properties(value, out, depth)
    elif isinstance(value, Sequence):
        out.append(STRICT_ARRAY)
        out += len(value).to_bytes(4, "big")
        for item in value:
            _encode_into(item, out, depth + 1)
    else:
        raise TypeError(f"no AMF0 encoding for {type(value).__name__}")


def encode(value: AmfValue) -> bytes:
    """Encode one value. Raises TypeError/ValueError for values AMF0 cannot carry."""
    out = bytearray()
    _encode_into(value, out, 0)
    return bytes(out)


def encode_values(*values: AmfValue) -> bytes:
    """Encode values back to back, as in a command message body (RTMP §7.1.1)."""
    out = bytearray()
    for value in values:
        _encode_into(value, out, 0)
    return bytes(out)


# ---------------------------------------------------------------------------- decoding


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int) -> None:
        self.data = bytes(data)
        self.pos = pos

    def take(self, count: int) -> bytes:
        end = self.pos + count
        if end > len(self.data):
            raise AmfError(f"AMF0 data truncated at offset {self.pos} (need {count} octets)")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "big")

    def utf8(self, length: int) -> str:
        raw = self.take(length)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AmfError(f"AMF0 string is not UTF-8: {exc}") from None


def _decode_properties(reader: _Reader, target: dict[str, AmfValue], depth: int) -> None:
    """Read name/value pairs until the object-end marker (§2.5, §2.11)."""
    while True:
        name = reader.utf8(reader.u16())
        if name == "" and reader.pos < len(reader.data) and reader.data[reader.pos] == OBJECT_END:
            reader.pos += 1
            return
        if len(target) >= MAX_ENTRIES:
            raise AmfError("AMF0 object has too many properties")
        target[name] = _decode_value(reader, depth + 1)


def _decode_value(reader: _Reader, depth: int) -> AmfValue:
    if depth > MAX_DEPTH:
        raise AmfError("AMF0 value nested too deeply")
    marker = reader.u8()
    if marker == NUMBER:
        return float(_DOUBLE.unpack(reader.take(8))[0])
    if marker == BOOLEAN:
        return reader.u8() != 0
    if marker == STRING:
        return reader.utf8(reader.u16())
    if marker == LONG_STRING:
        length = reader.u32()
        if length > len(reader.data) - reader.pos:
            raise AmfError("AMF0 long string longer than the data")
        return reader.utf8(length)
    if marker == OBJECT:
        obj: dict[str, AmfValue] = {}
        _decode_properties(reader, obj, depth)
        return obj
    if marker == ECMA_ARRAY:
        reader.u32()  # associative-count: a hint only, the object-end marker terminates
        array = EcmaArray()
        _decode_properties(reader, array, depth)
        return array
    if marker == STRICT_ARRAY:
        count = reader.u32()
        if count > MAX_ENTRIES or count > len(reader.data) - reader.pos:  # each element >= 1 octet
            raise AmfError(f"AMF0 strict array count {count} out of bounds")
        return [_decode_value(reader, depth + 1) for _ in range(count)]
    if marker == NULL:
        return None
    if marker == UNDEFINED_MARKER:
        return UNDEFINED
    if marker == DATE:
        milliseconds = _DOUBLE.unpack(reader.take(8))[0]
        timezone = int.from_bytes(reader.take(2), "big", signed=True)
        if math.isnan(milliseconds):
            milliseconds = 0.0
        return AmfDate(milliseconds, timezone)
    if marker == OBJECT_END:
        raise AmfError("AMF0 object-end marker outside an object")
    raise AmfError(f"unsupported AMF0 type marker 0x{marker:02x}")


def decode(data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[AmfValue, int]:
    """Decode one value at ``offset``; answers (value, offset after it). Raises AmfError."""
    reader = _Reader(data, offset)
    return _decode_value(reader, 0), reader.pos


def decode_all(data: bytes | bytearray | memoryview, max_values: int = 64) -> list[AmfValue]:
    """Decode every value in ``data`` (a command or data message body). Raises AmfError."""
    reader = _Reader(data, 0)
    values: list[AmfValue] = []
    while reader.pos < len(reader.data):
        if len(values) >= max_values:
            raise AmfError("too many AMF0 values in one message")
        values.append(_decode_value(reader, 0))
    return values
