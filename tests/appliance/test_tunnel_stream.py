"""Tunnel payload encryption on TCP streams (interop.md 10 "TCP chunk", "TCP sequence"; 8.3 stream_nonce)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from uuid import UUID

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from appliance.tunnel.payload import PayloadError, Side, build_aad, parse_key
from appliance.tunnel.stream import (
    CHUNK_OVERHEAD,
    LEN_SIZE,
    MAX_PLAINTEXT,
    MAX_WIRE_LEN,
    StreamBroken,
    StreamOpener,
    StreamSealer,
)

# Key and tunnel of the interop.md 10 / 8.4 test vector.
KEY = parse_key("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
TUNNEL = UUID("6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b")
VECTOR_NONCE = bytes.fromhex("000102030405060708090a0b")
VECTOR_PLAINTEXT = bytes.fromhex("47000000")
VECTOR_AAD = bytes.fromhex("6d65646961706c616e652d74756e6e656c2d76316f1c2b3a4d5e4f608a7b9c0d1e2f3a4b000000000000000001")
VECTOR_UDP_SEALED = bytes.fromhex("6bf8ae5285a73792d1d640d85d7eb5e6bea2f28d")
STREAM_NONCE = bytes(range(0x10, 0x20))
OTHER_STREAM_NONCE = bytes(range(0x20, 0x30))


def nonce(n: int) -> bytes:
    return n.to_bytes(12, "big")


def nonces(start: int = 1000) -> Callable[[], bytes]:
    counter = itertools.count(start)
    return lambda: nonce(next(counter))


def pair(side: Side = Side.EGRESS, stream_nonce: bytes = STREAM_NONCE) -> tuple[StreamSealer, StreamOpener]:
    return StreamSealer(KEY, TUNNEL, side, stream_nonce), StreamOpener(KEY, TUNNEL, side, stream_nonce)


def chunks(sealer: StreamSealer, *plaintexts: bytes) -> list[bytes]:
    return [sealer.seal_chunk(p, nonce(i)) for i, p in enumerate(plaintexts)]


def feed_in_pieces(opener: StreamOpener, wire: bytes, size: int) -> list[bytes]:
    out: list[bytes] = []
    for start in range(0, len(wire), size):
        out += opener.feed(wire[start : start + size])
    return out


# --- the document's vector, carried over to TCP ---------------------------------------


def test_tcp_aad_is_the_udp_vector_aad_plus_stream_nonce() -> None:
    assert build_aad(TUNNEL, Side.EGRESS, 1, STREAM_NONCE) == VECTOR_AAD + STREAM_NONCE


def test_tcp_chunk_layout_with_the_vector_inputs() -> None:
    # interop.md 10 gives no TCP vector; the UDP one's inputs at seq 1 in a TCP frame.
    sealer = StreamSealer(KEY, TUNNEL, Side.EGRESS, STREAM_NONCE)
    sealer.next_seq = 1
    chunk = sealer.seal_chunk(VECTOR_PLAINTEXT, VECTOR_NONCE)
    sealed = ChaCha20Poly1305(KEY).encrypt(VECTOR_NONCE, VECTOR_PLAINTEXT, VECTOR_AAD + STREAM_NONCE)
    assert chunk == (8 + 12 + 20).to_bytes(4, "big") + (1).to_bytes(8, "big") + VECTOR_NONCE + sealed
    assert len(chunk) == LEN_SIZE + CHUNK_OVERHEAD + len(VECTOR_PLAINTEXT)
    # Same stream cipher (ciphertext equal), different AAD (tag differs from the UDP vector).
    assert sealed[:4] == VECTOR_UDP_SEALED[:4] and sealed[4:] != VECTOR_UDP_SEALED[4:]
    opener = StreamOpener(KEY, TUNNEL, Side.EGRESS, STREAM_NONCE)
    opener.next_seq = 1
    assert opener.feed(chunk) == [VECTOR_PLAINTEXT]


def test_sequence_starts_at_zero_and_counts_by_one() -> None:
    sealer, _ = pair()
    wire = chunks(sealer, b"a", b"b", b"c")
    assert [int.from_bytes(c[4:12], "big") for c in wire] == [0, 1, 2]
    assert sealer.next_seq == 3 and sealer.chunks == 3 and sealer.plaintext_bytes == 3
    assert sealer.wire_bytes == sum(map(len, wire))


# --- round trip -------------------------------------------------------------------------


@pytest.mark.parametrize("piece", [1, 2, 3, 4, 5, 6, 7, None])
def test_round_trip_with_arbitrary_splits(piece: int | None) -> None:
    sealer, opener = pair()
    messages = [b"", b"x", bytes(range(256)) * 3, b"hello world", bytes(100)]
    wire = b"".join(sealer.seal(m, nonces(10 * i)) for i, m in enumerate(messages))
    got = opener.feed(wire) if piece is None else feed_in_pieces(opener, wire, piece)
    assert b"".join(got) == b"".join(messages)
    assert len(got) == 4  # the empty message makes no chunk
    assert opener.pending == 0 and opener.next_seq == 4 and opener.chunks == 4
    assert opener.plaintext_bytes == sum(map(len, messages)) and opener.wire_bytes == len(wire)
    opener.eof()


def test_partial_header_and_body_are_held_until_complete() -> None:
    sealer, opener = pair()
    chunk = sealer.seal(b"payload", nonce(1))
    assert opener.feed(chunk[:3]) == [] and opener.pending == 3
    assert opener.feed(chunk[3:-1]) == [] and opener.pending == len(chunk) - 1
    assert opener.feed(chunk[-1:]) == [b"payload"] and opener.pending == 0


def test_both_directions_are_independent() -> None:
    up_seal, up_open = pair(Side.EGRESS)
    down_seal, down_open = pair(Side.INGRESS)
    assert up_open.feed(up_seal.seal(b"req", nonce(1))) == [b"req"]
    assert down_open.feed(down_seal.seal(b"resp", nonce(1))) == [b"resp"]


# --- the 64 KiB limit ---------------------------------------------------------------------


def test_exactly_at_the_limit_is_one_chunk() -> None:
    sealer, opener = pair()
    data = bytes(MAX_PLAINTEXT)
    wire = sealer.seal(data, nonce(1))
    assert int.from_bytes(wire[:4], "big") == MAX_PLAINTEXT + CHUNK_OVERHEAD
    assert len(wire) == LEN_SIZE + MAX_PLAINTEXT + CHUNK_OVERHEAD
    assert opener.feed(wire) == [data]


def test_over_the_limit_is_split_and_needs_a_nonce_per_chunk() -> None:
    sealer, opener = pair()
    data = bytes(range(256)) * (MAX_PLAINTEXT // 256) * 2 + b"tail"
    assert sealer.chunk_count(len(data)) == 3
    with pytest.raises(ValueError, match="nonce source"):
        sealer.seal(data, nonce(1))
    assert sealer.next_seq == 0  # nothing sealed
    wire = sealer.seal(data, nonces())
    got = feed_in_pieces(opener, wire, 4096)
    assert [len(p) for p in got] == [MAX_PLAINTEXT, MAX_PLAINTEXT, 4]
    assert b"".join(got) == data


def test_seal_chunk_refuses_oversize_and_bad_nonce() -> None:
    sealer, _ = pair()
    with pytest.raises(ValueError):
        sealer.seal_chunk(bytes(MAX_PLAINTEXT + 1), nonce(1))
    with pytest.raises(ValueError):
        sealer.seal_chunk(b"x", bytes(11))
    with pytest.raises(ValueError, match="repeated"):
        sealer.seal(bytes(MAX_PLAINTEXT + 1), lambda: nonce(7))


def test_oversize_length_breaks_as_soon_as_the_prefix_arrives() -> None:
    _, opener = pair()
    with pytest.raises(StreamBroken) as info:
        opener.feed((MAX_PLAINTEXT + CHUNK_OVERHEAD + 1).to_bytes(4, "big"))
    assert info.value.reason == "length" and opener.pending == 0


def test_a_1_mib_chunk_is_refused_by_default_but_the_ceiling_is_1_mib() -> None:
    _, opener = pair()
    with pytest.raises(StreamBroken):
        opener.feed(MAX_WIRE_LEN.to_bytes(4, "big"))
    StreamOpener(KEY, TUNNEL, Side.EGRESS, STREAM_NONCE, max_plaintext=MAX_WIRE_LEN - CHUNK_OVERHEAD)
    with pytest.raises(ValueError):
        StreamOpener(KEY, TUNNEL, Side.EGRESS, STREAM_NONCE, max_plaintext=MAX_WIRE_LEN)


def test_length_too_short_for_the_overhead_breaks() -> None:
    _, opener = pair()
    with pytest.raises(StreamBroken) as info:
        opener.feed((CHUNK_OVERHEAD - 1).to_bytes(4, "big") + bytes(CHUNK_OVERHEAD - 1))
    assert info.value.reason == "length"


# --- sequence violations ------------------------------------------------------------------


def test_reordered_chunks_break() -> None:
    sealer, opener = pair()
    first, second = chunks(sealer, b"1", b"2")
    with pytest.raises(StreamBroken) as info:
        opener.feed(second + first)
    assert info.value.reason == "sequence"


def test_duplicated_chunk_breaks_and_keeps_the_earlier_plaintext() -> None:
    sealer, opener = pair()
    first, second = chunks(sealer, b"1", b"2")
    with pytest.raises(StreamBroken) as info:
        opener.feed(first + second + second)
    assert info.value.reason == "sequence" and info.value.opened == [b"1", b"2"]


def test_skipped_chunk_breaks() -> None:
    sealer, opener = pair()
    first, _, third = chunks(sealer, b"1", b"2", b"3")
    assert opener.feed(first) == [b"1"]
    with pytest.raises(StreamBroken):
        opener.feed(third)


def test_a_broken_stream_stays_broken() -> None:
    sealer, opener = pair()
    first, second = chunks(sealer, b"1", b"2")
    with pytest.raises(StreamBroken):
        opener.feed(second)
    with pytest.raises(StreamBroken) as info:
        opener.feed(first)
    assert info.value.reason == "broken" and opener.broken == "sequence"
    with pytest.raises(StreamBroken):
        opener.eof()


def test_stream_broken_is_a_payload_error() -> None:
    assert issubclass(StreamBroken, PayloadError)


# --- authentication -----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["tag", "ciphertext", "nonce"])
def test_tampering_breaks(where: str) -> None:
    sealer, opener = pair()
    chunk = bytearray(sealer.seal(b"some payload", nonce(1)))
    index = {"tag": len(chunk) - 1, "ciphertext": LEN_SIZE + 8 + 12, "nonce": LEN_SIZE + 8}[where]
    chunk[index] ^= 0x01
    with pytest.raises(StreamBroken) as info:
        opener.feed(bytes(chunk))
    assert info.value.reason == "auth" and opener.chunks == 0


def test_a_chunk_from_another_stream_fails() -> None:
    other, _ = pair(stream_nonce=OTHER_STREAM_NONCE)
    _, opener = pair()
    with pytest.raises(StreamBroken) as info:
        opener.feed(other.seal(b"moved", nonce(1)))
    assert info.value.reason == "auth"


def test_a_chunk_from_the_other_side_fails() -> None:
    reflected, _ = pair(Side.INGRESS)
    _, opener = pair(Side.EGRESS)
    with pytest.raises(StreamBroken) as info:
        opener.feed(reflected.seal(b"reflected", nonce(1)))
    assert info.value.reason == "auth"


def test_a_chunk_from_another_tunnel_or_key_fails() -> None:
    _, opener = pair()
    other_tunnel = StreamSealer(KEY, UUID(int=1), Side.EGRESS, STREAM_NONCE)
    other_key = StreamSealer(bytes(32), TUNNEL, Side.EGRESS, STREAM_NONCE)
    for sealer in (other_tunnel, other_key):
        with pytest.raises(StreamBroken):
            StreamOpener(KEY, TUNNEL, Side.EGRESS, STREAM_NONCE).feed(sealer.seal(b"x", nonce(1)))
    assert opener.broken is None


def test_a_rewritten_seq_fails_authentication() -> None:
    sealer, opener = pair()
    sealer.next_seq = 5
    chunk = bytearray(sealer.seal(b"x", nonce(1)))
    chunk[LEN_SIZE : LEN_SIZE + 8] = (0).to_bytes(8, "big")  # looks like the expected seq 0
    with pytest.raises(StreamBroken) as info:
        opener.feed(bytes(chunk))
    assert info.value.reason == "auth"


# --- end of stream and arguments ----------------------------------------------------------


def test_eof_inside_a_chunk_is_truncation() -> None:
    sealer, opener = pair()
    chunk = sealer.seal(b"payload", nonce(1))
    opener.feed(chunk[:-1])
    with pytest.raises(StreamBroken) as info:
        opener.eof()
    assert info.value.reason == "truncated"


def test_constructor_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        StreamSealer(KEY, TUNNEL, Side.EGRESS, bytes(15))
    with pytest.raises(ValueError):
        StreamOpener(KEY, TUNNEL, Side.EGRESS, bytes(17))
    with pytest.raises(ValueError):
        StreamSealer(bytes(31), TUNNEL, Side.EGRESS, STREAM_NONCE)
    with pytest.raises(ValueError):
        StreamSealer(KEY, TUNNEL, Side.EGRESS, STREAM_NONCE, max_plaintext=MAX_PLAINTEXT + 1)
