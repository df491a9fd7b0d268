"""Chunk stream canned bytes (RTMP 1.0 §5.3, §5.4): every header type, extended timestamps,
chunk size change, abort, acknowledgement window, caps."""

from __future__ import annotations

import pytest

from services.edge.core.rtmp.chunk import (
    ChunkReader,
    ChunkWriter,
    MessageType,
    RtmpMessage,
    encode_basic_header,
)
from services.edge.core.rtmp.errors import ProtocolError


def fmt0(cs: int, ts: int, length: int, type_id: int, stream: int) -> bytes:
    return (
        bytes([cs])
        + ts.to_bytes(3, "big")
        + length.to_bytes(3, "big")
        + bytes([type_id])
        + stream.to_bytes(4, "little")
    )


def test_type0_header_single_chunk() -> None:
    reader = ChunkReader()
    data = fmt0(3, 1000, 5, 20, 1) + b"hello"
    assert reader.feed(data) == [RtmpMessage(3, 20, 1, 1000, b"hello")]
    assert reader.bytes_received == len(data)


def test_type1_type2_type3_headers_reuse_the_previous_fields() -> None:
    reader = ChunkReader()
    data = (
        fmt0(4, 1000, 3, 9, 1) + b"abc"
        + b"\x44" + (40).to_bytes(3, "big") + (2).to_bytes(3, "big") + b"\x08" + b"de"  # fmt 1: delta, length, type
        + b"\x84" + (20).to_bytes(3, "big") + b"fg"  # fmt 2: delta only
        + b"\xc4" + b"hi"  # fmt 3 starting a new message: the delta repeats (§5.3.1.2.4)
    )  # fmt: skip
    assert reader.feed(data) == [
        RtmpMessage(4, 9, 1, 1000, b"abc"),
        RtmpMessage(4, 8, 1, 1040, b"de"),
        RtmpMessage(4, 8, 1, 1060, b"fg"),
        RtmpMessage(4, 8, 1, 1080, b"hi"),
    ]


def test_two_and_three_octet_basic_headers() -> None:
    assert encode_basic_header(0, 63) == b"\x3f"
    assert encode_basic_header(0, 64) == b"\x00\x00"
    assert encode_basic_header(1, 319) == b"\x40\xff"
    assert encode_basic_header(0, 320) == b"\x01\x00\x01"
    assert encode_basic_header(3, 65599) == b"\xc1\xff\xff"
    reader = ChunkReader()
    two = b"\x00\x06" + fmt0(0, 0, 1, 9, 1)[1:] + b"x"  # cs 64 + 6
    three = b"\x01\x10\x02" + fmt0(0, 0, 1, 9, 1)[1:] + b"y"  # cs 64 + 0x10 + 2*256
    assert reader.feed(two + three) == [RtmpMessage(70, 9, 1, 0, b"x"), RtmpMessage(592, 9, 1, 0, b"y")]
    with pytest.raises(ValueError):
        encode_basic_header(0, 1)


def test_extended_timestamp_and_its_repeat_in_type3_continuations() -> None:
    reader = ChunkReader()
    payload = bytes(range(200))
    ext = (0x01020304).to_bytes(4, "big")
    data = (
        bytes([5]) + b"\xff\xff\xff" + (200).to_bytes(3, "big") + b"\x09" + b"\x01\x00\x00\x00" + ext
        + payload[:128]
        + b"\xc5" + ext + payload[128:]  # §5.3.1.3: the extended timestamp again in the fmt 3 chunk
    )  # fmt: skip
    assert reader.feed(data) == [RtmpMessage(5, 9, 1, 0x01020304, payload)]
    writer = ChunkWriter()
    assert writer.write(5, 9, 1, 0x01020304, payload) == data


def test_extended_timestamp_delta_and_32_bit_wrap() -> None:
    writer = ChunkWriter()
    reader = ChunkReader()
    first = writer.write(4, 9, 1, 0xFFFFFFF0, b"a")
    second = writer.write(4, 9, 1, 0x1_0000_0010, b"b")  # wraps: delta 0x20, fmt 2
    assert second[0] >> 6 == 2
    assert reader.feed(first + second) == [RtmpMessage(4, 9, 1, 0xFFFFFFF0, b"a"), RtmpMessage(4, 9, 1, 0x10, b"b")]
    big_delta = writer.write(4, 9, 1, 0x10 + 0x1000000, b"c")  # delta >= 0xFFFFFF: extended delta
    assert big_delta[1:4] == b"\xff\xff\xff"
    assert reader.feed(big_delta) == [RtmpMessage(4, 9, 1, 0x1000010, b"c")]


def test_writer_picks_the_smallest_header() -> None:
    writer = ChunkWriter()
    assert writer.write(3, 20, 0, 0, b"ab") == fmt0(3, 0, 2, 20, 0) + b"ab"
    assert writer.write(3, 20, 0, 10, b"cd") == b"\x83\x00\x00\x0acd"  # same length/type: fmt 2
    assert writer.write(3, 18, 0, 10, b"e") == b"\x43\x00\x00\x00\x00\x00\x01\x12e"  # fmt 1
    assert writer.write(3, 18, 1, 10, b"f")[0] >> 6 == 0  # other message stream: fmt 0
    assert writer.write(3, 18, 1, 5, b"g")[0] >> 6 == 0  # backwards: fmt 0


def test_chunk_size_change_mid_stream() -> None:
    reader = ChunkReader()
    writer = ChunkWriter()
    before = writer.write(6, 9, 1, 0, bytes(300))  # 128-octet chunks
    change = writer.set_chunk_size(256)
    assert change == fmt0(2, 0, 4, 1, 0) + (256).to_bytes(4, "big")
    after = writer.write(6, 9, 1, 40, bytes(range(256)) + b"tail")  # 256 + 4
    assert after[0] == 0x46 and after[8 + 256] == 0xC6 and len(after) == 8 + 256 + 1 + 4  # fmt 1, then fmt 3
    messages = reader.feed(before + change + after)
    assert [m.type_id for m in messages] == [9, MessageType.SET_CHUNK_SIZE, 9]
    assert reader.chunk_size == 256
    assert messages[2].payload == bytes(range(256)) + b"tail"


def test_abort_drops_the_partial_message() -> None:
    reader = ChunkReader()
    partial = fmt0(4, 0, 200, 9, 1) + bytes(128)
    abort = fmt0(2, 0, 4, 2, 0) + (4).to_bytes(4, "big")
    fresh = fmt0(4, 50, 3, 9, 1) + b"new"
    assert reader.feed(partial) == []
    assert reader.buffered_bytes == 128
    messages = reader.feed(abort + fresh)
    assert [m.payload for m in messages] == [(4).to_bytes(4, "big"), b"new"]
    assert reader.buffered_bytes == 0


def test_acknowledgement_window() -> None:
    reader = ChunkReader()
    window = fmt0(2, 0, 4, 5, 0) + (100).to_bytes(4, "big")
    reader.feed(window)
    assert reader.ack_window == 100
    assert reader.take_ack_due() is None  # 16 octets so far
    reader.feed(fmt0(4, 0, 90, 9, 1) + bytes(90))
    assert reader.take_ack_due() == 16 + 12 + 90
    assert reader.take_ack_due() is None
    reader.feed(fmt0(4, 0, 99, 9, 1) + bytes(99))
    assert reader.take_ack_due() == 16 + 12 + 90 + 12 + 99


def test_byte_at_a_time_equals_all_at_once() -> None:
    writer = ChunkWriter(chunk_size=64)
    data = b"".join(
        writer.write(cs, 9, 1, ts * 40, bytes([cs % 256]) * (ts * 37 % 300)) for ts in range(20) for cs in (4, 6, 400)
    )
    whole = ChunkReader()
    whole.chunk_size = 64
    expected = whole.feed(data)
    assert len(expected) == 60
    single = ChunkReader()
    single.chunk_size = 64
    got: list[RtmpMessage] = []
    for i in range(len(data)):
        got += single.feed(data[i : i + 1])
        assert single.buffered_bytes <= 18 + 300 * 3
    assert got == expected


def test_interleaved_chunk_streams_reassemble() -> None:
    reader = ChunkReader()
    data = fmt0(4, 0, 200, 9, 1) + bytes(128) + fmt0(5, 0, 2, 8, 1) + b"au" + b"\xc4" + bytes(72)
    assert [(m.chunk_stream_id, len(m.payload)) for m in reader.feed(data)] == [(5, 2), (4, 200)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x44\x00\x00\x00\x00\x00\x01\x09x", "compressed header"),  # fmt 1 before any fmt 0
        (b"\xc7x", "compressed header"),  # fmt 3 before any fmt 0
        (fmt0(3, 0, 2000, 9, 1), "exceeds"),  # over the message cap
        (fmt0(2, 0, 4, 1, 0) + bytes(4), "Set Chunk Size of 0"),
        (fmt0(2, 0, 2, 1, 0) + bytes(2), "too short"),
    ],
)
def test_protocol_errors(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        ChunkReader(max_message_size=1000).feed(data)


def test_chunk_stream_count_and_partial_bytes_are_capped() -> None:
    reader = ChunkReader(max_chunk_streams=4)
    with pytest.raises(ProtocolError, match="chunk streams"):
        reader.feed(b"".join(fmt0(cs, 0, 1, 9, 1) + b"x" for cs in range(3, 10)))
    reader = ChunkReader(max_message_size=1000)  # partial cap defaults to 2 x 1000
    reader.chunk_size = 500
    first_chunks = [fmt0(cs, 0, 1000, 9, 1) + bytes(500) for cs in range(3, 8)]  # 5 half messages
    reader.feed(b"".join(first_chunks[:4]))
    assert reader.buffered_bytes == 2000
    with pytest.raises(ProtocolError, match="buffer cap"):
        reader.feed(first_chunks[4])
