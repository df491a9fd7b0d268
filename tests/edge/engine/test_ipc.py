"""Control ↔ worker framing (sans-IO) with canned bytes."""

from __future__ import annotations

import struct

import pytest

from services.edge.engine.ipc import MAX_FRAME_BYTES, FrameDecoder, FrameError, encode_message


def test_round_trip_in_any_split() -> None:
    messages = [{"op": "stats", "flows": {"f1": {"input": {"packets_received": i}}}} for i in range(5)]
    data = b"".join(encode_message(m) for m in messages)
    for cut in range(1, len(data)):
        decoder = FrameDecoder()
        assert decoder.feed(data[:cut]) + decoder.feed(data[cut:]) == messages


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack("!I", 3) + b"{x}",
        struct.pack("!I", 2) + b"[]",
        struct.pack("!I", MAX_FRAME_BYTES + 1),
    ],
)
def test_bad_frames_raise(frame: bytes) -> None:
    with pytest.raises(FrameError):
        FrameDecoder().feed(frame)
