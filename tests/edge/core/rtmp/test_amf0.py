"""AMF0 canned vectors (AMF0 spec §2) and malformed input."""

from __future__ import annotations

import pytest

from services.edge.core.rtmp import amf0
from services.edge.core.rtmp.amf0 import UNDEFINED, AmfDate, EcmaArray
from services.edge.core.rtmp.errors import AmfError, ProtocolError

ONE = bytes.fromhex("3ff0000000000000")

VECTORS = [
    (1.0, b"\x00" + ONE),
    (-0.5, bytes.fromhex("00bfe0000000000000")),
    (True, b"\x01\x01"),
    (False, b"\x01\x00"),
    ("ab", b"\x02\x00\x02ab"),
    ("", b"\x02\x00\x00"),
    ("é", b"\x02\x00\x02\xc3\xa9"),
    (None, b"\x05"),
    (UNDEFINED, b"\x06"),
    ({"a": 1.0}, b"\x03\x00\x01a\x00" + ONE + b"\x00\x00\x09"),
    ({}, b"\x03\x00\x00\x09"),
    (EcmaArray({"a": True}), b"\x08\x00\x00\x00\x01\x00\x01a\x01\x01\x00\x00\x09"),
    ([1.0, "x"], b"\x0a\x00\x00\x00\x02\x00" + ONE + b"\x02\x00\x01x"),
    ({"o": {"n": None}}, b"\x03\x00\x01o\x03\x00\x01n\x05\x00\x00\x09\x00\x00\x09"),
    (AmfDate(1000.0, 0), b"\x0b" + bytes.fromhex("408f400000000000") + b"\x00\x00"),
]


@pytest.mark.parametrize(("value", "wire"), VECTORS)
def test_canned_vectors_encode_and_decode(value: amf0.AmfValue, wire: bytes) -> None:
    assert amf0.encode(value) == wire
    decoded, end = amf0.decode(wire)
    assert end == len(wire)
    assert decoded == value
    assert type(decoded) is type(value)


def test_int_encodes_as_number_and_bool_stays_boolean() -> None:
    assert amf0.encode(3) == amf0.encode(3.0)
    assert amf0.encode(True) == b"\x01\x01"


def test_long_string_is_chosen_over_65535_octets() -> None:
    text = "z" * 70000
    wire = amf0.encode(text)
    assert wire[:5] == b"\x0c" + (70000).to_bytes(4, "big")
    assert amf0.decode(wire) == (text, len(wire))


def test_connect_command_round_trip() -> None:
    # The body FFmpeg sends (RTMP §7.2.1.1): name, transaction id, command object.
    props = {"app": "live", "type": "nonprivate", "flashVer": "FMLE/3.0", "tcUrl": "rtmp://h/live"}
    body = amf0.encode_values("connect", 1.0, props)
    assert body.startswith(b"\x02\x00\x07connect\x00" + ONE + b"\x03\x00\x03app\x02\x00\x04live")
    assert amf0.decode_all(body) == ["connect", 1.0, props]


def test_ecma_array_count_is_only_a_hint() -> None:
    # FFmpeg and others write a wrong associative-count; the object-end marker decides.
    wire = b"\x08\x00\x00\x00\x09\x00\x01a\x05\x00\x00\x09"
    assert amf0.decode(wire)[0] == EcmaArray({"a": None})


@pytest.mark.parametrize(
    "wire",
    [
        b"",
        b"\x00\x3f\xf0",  # truncated number
        b"\x02\x00\x05ab",  # string shorter than its length
        b"\x0c\xff\xff\xff\xffab",  # long string longer than the data
        b"\x03\x00\x01a",  # object cut after a key
        b"\x03\x00\x01a\x05",  # object without its end marker
        b"\x07\x00\x01",  # reference: unsupported
        b"\x11\x01",  # AMF3 switch: unsupported
        b"\x0d",  # unsupported marker
        b"\x09",  # object-end outside an object
        b"\x0a\xff\xff\xff\xff\x05",  # strict array count beyond the data
        b"\x02\x00\x02\xff\xfe",  # not UTF-8
        b"\x0a\x00\x00\x00\x01" * 40 + b"\x05",  # nested deeper than MAX_DEPTH
    ],
)
def test_malformed_input_raises_amf_error(wire: bytes) -> None:
    with pytest.raises(AmfError):
        amf0.decode(wire)
    assert issubclass(AmfError, ProtocolError)


def test_decode_all_is_bounded_in_value_count() -> None:
    with pytest.raises(AmfError):
        amf0.decode_all(b"\x05" * 100, max_values=64)
    assert amf0.decode_all(b"\x05" * 64, max_values=64) == [None] * 64


def test_encoding_rejects_what_amf0_cannot_carry() -> None:
    with pytest.raises(TypeError):
        amf0.encode(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        amf0.encode({1: 2.0})  # type: ignore[dict-item]
