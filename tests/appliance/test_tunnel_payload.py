"""Tunnel payload encryption and replay window (interop.md 10; RFC 4303 §3.4.3 window)."""

from __future__ import annotations

from uuid import UUID

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from appliance.tunnel.payload import (
    HEADER_SIZE,
    OVERHEAD,
    REPLAY_WINDOW_SIZE,
    SEQ_MAX,
    DatagramCodec,
    PayloadError,
    ReplayWindow,
    SequenceExhausted,
    Side,
    TunnelReceiver,
    TunnelSender,
    build_aad,
    parse_key,
)

# interop.md 10 test vector (key and tunnel of 8.4).
KEY_HEX = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
KEY = parse_key(KEY_HEX)
TUNNEL = UUID("6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b")
VECTOR_NONCE = bytes.fromhex("000102030405060708090a0b")
VECTOR_PLAINTEXT = bytes.fromhex("47000000")
VECTOR_AAD = bytes.fromhex("6d65646961706c616e652d74756e6e656c2d76316f1c2b3a4d5e4f608a7b9c0d1e2f3a4b000000000000000001")
VECTOR_SEALED = bytes.fromhex("6bf8ae5285a73792d1d640d85d7eb5e6bea2f28d")
VECTOR_DATAGRAM = TUNNEL.bytes + (1).to_bytes(8, "big") + VECTOR_NONCE + VECTOR_SEALED

START = 1_790_000_000_000_000_000  # a wall clock in ns, as the sender starts (interop.md 10)


def nonce(n: int) -> bytes:
    return n.to_bytes(12, "big")


# --- test vector -------------------------------------------------------------------


def test_vector_aad() -> None:
    assert build_aad(TUNNEL, Side.EGRESS, 1) == VECTOR_AAD


def test_vector_seal_gives_the_documents_bytes() -> None:
    datagram = DatagramCodec(KEY, TUNNEL).seal(Side.EGRESS, 1, VECTOR_NONCE, VECTOR_PLAINTEXT)
    assert datagram == VECTOR_DATAGRAM
    assert datagram[HEADER_SIZE:] == VECTOR_SEALED
    # Cross-check with the library directly: [ciphertext][tag] of the document.
    assert ChaCha20Poly1305(KEY).encrypt(VECTOR_NONCE, VECTOR_PLAINTEXT, VECTOR_AAD) == VECTOR_SEALED


def test_vector_sender_numbers_from_first_seq() -> None:
    sender = TunnelSender(KEY, TUNNEL, Side.of_direction("egress"), first_seq=1)
    assert sender.seal(VECTOR_PLAINTEXT, VECTOR_NONCE) == VECTOR_DATAGRAM
    assert sender.next_seq == 2 and sender.sent == 1


def test_vector_open_gives_the_plaintext_back() -> None:
    opened = DatagramCodec(KEY, TUNNEL).open(Side.EGRESS, VECTOR_DATAGRAM)
    assert (opened.seq, opened.plaintext) == (1, VECTOR_PLAINTEXT)
    receiver = TunnelReceiver(KEY, TUNNEL, peer_side=Side.of_direction("ingress").peer)
    assert receiver.open(VECTOR_DATAGRAM) == VECTOR_PLAINTEXT
    assert (receiver.accepted, receiver.replayed, receiver.decrypt_errors) == (1, 0, 0)


def test_layout_and_overhead() -> None:
    payload = bytes(1316)
    datagram = DatagramCodec(KEY, TUNNEL).seal(Side.INGRESS, 7, nonce(9), payload)
    assert len(datagram) == 16 + len(payload) + OVERHEAD
    assert OVERHEAD == 36
    assert datagram[:16] == TUNNEL.bytes
    assert datagram[16:24] == (7).to_bytes(8, "big")
    assert datagram[24:36] == nonce(9)


# --- keys and sides ----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", KEY_HEX[:-2], KEY_HEX + "00", "zz" + KEY_HEX[2:], KEY_HEX[:-1] + "\n"])
def test_parse_key_rejects_anything_but_64_hex(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_key(bad)


def test_parse_key_accepts_upper_case() -> None:
    assert parse_key(KEY_HEX.upper()) == KEY


def test_wrong_key_length_is_refused() -> None:
    with pytest.raises(ValueError):
        DatagramCodec(KEY[:16], TUNNEL)


def test_sides() -> None:
    assert Side.of_direction("egress") == 0x00
    assert Side.of_direction("ingress") == 0x01
    assert Side.EGRESS.peer is Side.INGRESS and Side.INGRESS.peer is Side.EGRESS
    with pytest.raises(ValueError):
        Side.of_direction("sideways")


def test_bad_nonce_length_is_refused() -> None:
    with pytest.raises(ValueError):
        DatagramCodec(KEY, TUNNEL).seal(Side.EGRESS, 1, bytes(8), b"x")


def test_tcp_aad_appends_stream_nonce() -> None:
    stream_nonce = bytes(range(16))
    assert build_aad(TUNNEL, Side.EGRESS, 0, stream_nonce) == build_aad(TUNNEL, Side.EGRESS, 0) + stream_nonce
    with pytest.raises(ValueError):
        build_aad(TUNNEL, Side.EGRESS, 0, bytes(15))


# --- round trips -------------------------------------------------------------------


def pair(sender_direction: str = "egress", first_seq: int = START) -> tuple[TunnelSender, TunnelReceiver]:
    side = Side.of_direction(sender_direction)
    return TunnelSender(KEY, TUNNEL, side, first_seq), TunnelReceiver(KEY, TUNNEL, side)


@pytest.mark.parametrize("direction", ["egress", "ingress"])
def test_round_trip_both_directions(direction: str) -> None:
    sender, receiver = pair(direction)
    payloads = [b"", b"\x47" + bytes(187), bytes(1316), b"x" * 5000]
    for i, payload in enumerate(payloads):
        assert receiver.open(sender.seal(payload, nonce(i))) == payload
    assert receiver.accepted == len(payloads)
    assert receiver.window.highest == START + len(payloads) - 1


def test_direction_is_bound() -> None:
    # A datagram reflected back to its sender (same key, other side expected) fails.
    sender = TunnelSender(KEY, TUNNEL, Side.EGRESS, START)
    reflected_to = TunnelReceiver(KEY, TUNNEL, peer_side=Side.INGRESS)
    assert reflected_to.open(sender.seal(b"ts", nonce(1))) is None
    assert reflected_to.decrypt_errors == 1 and reflected_to.window.highest is None


def test_tunnel_id_is_bound() -> None:
    other = UUID("11111111-2222-4333-8444-555555555555")
    datagram = TunnelSender(KEY, TUNNEL, Side.EGRESS, START).seal(b"ts", nonce(1))
    receiver = TunnelReceiver(KEY, other, Side.EGRESS)
    assert receiver.open(datagram) is None
    # Even with the prefix rewritten, the AAD still names the original tunnel.
    assert receiver.open(other.bytes + datagram[16:]) is None
    assert receiver.decrypt_errors == 2


# --- tampering ---------------------------------------------------------------------


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes((data[index] ^ 0x01,)) + data[index + 1 :]


@pytest.mark.parametrize(
    "index",
    [16 + 7, 24, HEADER_SIZE, len(VECTOR_DATAGRAM) - 1],
    ids=["seq", "nonce", "ciphertext", "tag"],
)
def test_tampering_is_a_decrypt_error(index: int) -> None:
    receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
    assert receiver.open(flip(VECTOR_DATAGRAM, index)) is None
    assert (receiver.decrypt_errors, receiver.replayed, receiver.accepted) == (1, 0, 0)
    with pytest.raises(PayloadError):
        DatagramCodec(KEY, TUNNEL).open(Side.EGRESS, flip(VECTOR_DATAGRAM, index))
    # The failure did not move the window: the genuine datagram is still accepted.
    assert receiver.window.highest is None
    assert receiver.open(VECTOR_DATAGRAM) == VECTOR_PLAINTEXT


def test_wrong_key_is_a_decrypt_error() -> None:
    receiver = TunnelReceiver(bytes(32), TUNNEL, Side.EGRESS)
    assert receiver.open(VECTOR_DATAGRAM) is None
    assert receiver.decrypt_errors == 1


@pytest.mark.parametrize("length", [0, 16, HEADER_SIZE, HEADER_SIZE + 15])
def test_short_datagram_is_a_decrypt_error(length: int) -> None:
    receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
    assert receiver.open(VECTOR_DATAGRAM[:length]) is None
    assert receiver.decrypt_errors == 1


def test_forged_future_seq_does_not_move_the_window() -> None:
    sender, receiver = pair()
    first = sender.seal(b"a", nonce(1))
    assert receiver.open(first) == b"a"
    forged = first[:16] + (START + 10_000).to_bytes(8, "big") + first[24:]
    assert receiver.open(forged) is None
    assert receiver.decrypt_errors == 1
    assert receiver.window.highest == START
    assert receiver.open(sender.seal(b"b", nonce(2))) == b"b"


# --- replay window -----------------------------------------------------------------


def sealed_run(count: int, first_seq: int = START) -> list[bytes]:
    sender = TunnelSender(KEY, TUNNEL, Side.EGRESS, first_seq)
    return [sender.seal(i.to_bytes(4, "big"), nonce(i)) for i in range(count)]


def test_duplicate_is_refused() -> None:
    receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
    datagrams = sealed_run(3)
    for d in datagrams:
        assert receiver.open(d) is not None
    for d in datagrams:
        assert receiver.open(d) is None
    assert (receiver.accepted, receiver.replayed, receiver.decrypt_errors) == (3, 3, 0)


def test_out_of_order_inside_window_accepted_once() -> None:
    receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
    datagrams = sealed_run(REPLAY_WINDOW_SIZE)
    assert receiver.open(datagrams[-1]) is not None  # highest = START + 1023
    # Every earlier one is inside the window (offsets 1..1023): accepted once, in any order.
    for d in reversed(datagrams[:-1]):
        assert receiver.open(d) is not None
    for d in datagrams:
        assert receiver.open(d) is None
    assert receiver.accepted == REPLAY_WINDOW_SIZE
    assert receiver.replayed == REPLAY_WINDOW_SIZE


def test_older_than_window_is_refused() -> None:
    receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
    datagrams = sealed_run(REPLAY_WINDOW_SIZE + 1)
    assert receiver.open(datagrams[-1]) is not None  # highest = START + 1024
    assert receiver.open(datagrams[0]) is None  # offset 1024: just outside
    assert receiver.replayed == 1
    assert receiver.open(datagrams[1]) is not None  # offset 1023: the window's oldest slot


def test_far_future_jump_is_accepted_and_window_slides() -> None:
    receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
    early = sealed_run(5)
    for d in early[:4]:
        assert receiver.open(d) is not None
    # A restarted sender continues above its old values (its start clock is later).
    jump = START + 10_000_000_000
    late = sealed_run(3, first_seq=jump)
    assert receiver.open(late[2]) is not None
    assert receiver.window.highest == jump + 2
    assert receiver.open(late[0]) is not None  # inside the new window, unseen
    assert receiver.open(late[0]) is None  # seen
    assert receiver.open(early[4]) is None  # never seen, but now far behind the window
    assert receiver.open(early[0]) is None
    assert (receiver.accepted, receiver.replayed) == (6, 3)


def test_window_slide_by_partial_shift_keeps_marks() -> None:
    window = ReplayWindow()
    for seq in (100, 98, 96):
        assert window.accept(seq)
    assert window.accept(600)  # slide by 500: 100, 98, 96 now at offsets 500, 502, 504
    assert not window.check(100) and not window.check(98) and not window.check(96)
    assert window.check(99) and window.check(97)
    assert window.check(600 - REPLAY_WINDOW_SIZE + 1)
    assert not window.check(600 - REPLAY_WINDOW_SIZE)
    assert window.accept(1500)  # slide by 900: 96 (offset 1404) drops out as too old
    assert not window.check(96) and not window.check(99)
    assert window.check(1500 - 900 + 1) and not window.check(600)


def test_window_check_does_not_mark() -> None:
    window = ReplayWindow()
    assert window.check(5) and window.check(5)
    assert window.highest is None
    assert window.accept(5) and not window.accept(5)
    assert window.accept(0)  # offset 5, inside the window
    assert not window.accept(0)


def test_first_datagram_may_have_any_seq() -> None:
    for seq in (0, SEQ_MAX):
        receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
        assert receiver.open(sealed_run(1, first_seq=seq)[0]) == bytes(4)


# --- sequence limits ---------------------------------------------------------------


def test_sender_does_not_wrap_the_sequence() -> None:
    sender = TunnelSender(KEY, TUNNEL, Side.EGRESS, first_seq=SEQ_MAX)
    receiver = TunnelReceiver(KEY, TUNNEL, Side.EGRESS)
    assert receiver.open(sender.seal(b"last", nonce(1))) == b"last"
    with pytest.raises(SequenceExhausted):
        sender.seal(b"wrapped", nonce(2))
    assert sender.sent == 1


@pytest.mark.parametrize("seq", [-1, SEQ_MAX + 1])
def test_sequence_must_fit_in_64_bits(seq: int) -> None:
    with pytest.raises(ValueError):
        TunnelSender(KEY, TUNNEL, Side.EGRESS, first_seq=seq)
    with pytest.raises(ValueError):
        build_aad(TUNNEL, Side.EGRESS, seq)


def test_rekey_due_after_2_pow_32_messages() -> None:
    sender = TunnelSender(KEY, TUNNEL, Side.EGRESS, START)
    assert not sender.rekey_due
    sender.sent = (1 << 32) - 1
    sender.seal(b"x", nonce(1))
    assert sender.rekey_due


def test_tunnel_core_does_no_io() -> None:
    # tests/test_layering.py does not list appliance/tunnel yet; hold it to the same rule (H11).
    from tests.test_layering import FORBIDDEN, ROOT, top_level_imports

    files = sorted((ROOT / "appliance" / "tunnel").rglob("*.py"))
    assert len(files) >= 2
    for path in files:
        assert not top_level_imports(path) & (FORBIDDEN | {"os", "secrets"}), path
