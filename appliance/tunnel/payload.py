"""Tunnel payload encryption for UDP datagrams (interop.md 10), sans-IO.

Wire form of one UDP tunnel datagram (interop.md 10)::

    [tunnel_uuid 16][seq 8, big-endian][nonce 12][ciphertext][tag 16]

    AAD = b"mediaplane-tunnel-v1" ‖ tunnel_uuid(16) ‖ dir(1) ‖ seq(8, big-endian)
    dir = 0x00 when sent by the "egress" (source) edge, 0x01 when sent by the "ingress" edge

The cipher is ChaCha20-Poly1305 (RFC 8439) from ``cryptography``; the key is the tunnel's
``tunnel_encryption_key`` (interop.md 2.6/2.7: 64 hex chars) hex-decoded to 32 bytes.

This module does no I/O and reads no clock or randomness: the caller passes the sender's
first sequence number (its wall clock in nanoseconds when the tunnel starts, interop.md 10)
and a fresh 12-byte nonce from the OS CSPRNG for every datagram.

The receiver keeps the highest accepted ``seq`` and a 1024-entry sliding bitmap, the
anti-replay window of RFC 4303 §3.4.3 (bitmap layout in the spirit of RFC 6479); the
window moves only after authentication succeeds.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

AAD_LABEL: Final = b"mediaplane-tunnel-v1"
"""The constant prefix of every tunnel AAD (interop.md 10)."""

KEY_SIZE: Final = 32
NONCE_SIZE: Final = 12
TAG_SIZE: Final = 16
SEQ_SIZE: Final = 8
UUID_SIZE: Final = 16
STREAM_NONCE_SIZE: Final = 16
HEADER_SIZE: Final = UUID_SIZE + SEQ_SIZE + NONCE_SIZE
"""Bytes before the ciphertext in a UDP datagram: uuid, seq and nonce."""
OVERHEAD: Final = SEQ_SIZE + NONCE_SIZE + TAG_SIZE
"""AEAD overhead per datagram beyond the 16-byte uuid framing of interop.md 8.3/9 (36 bytes)."""

SEQ_MAX: Final = (1 << 64) - 1
REPLAY_WINDOW_SIZE: Final = 1024
REKEY_AFTER_MESSAGES: Final = 1 << 32
"""Re-key (create a new tunnel) after this many messages (interop.md 10 "Re-keying")."""

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class Side(enum.IntEnum):
    """The ``dir`` byte of the AAD: which edge sent the message (interop.md 10, 2.6)."""

    EGRESS = 0x00
    """Sent by the edge whose ``direction`` is ``"egress"`` (the source side)."""
    INGRESS = 0x01
    """Sent by the edge whose ``direction`` is ``"ingress"`` (the sink side)."""

    @classmethod
    def of_direction(cls, direction: str) -> Side:
        """The side byte for an edge whose tunnel ``direction`` is ``"egress"`` or ``"ingress"``."""
        if direction == "egress":
            return cls.EGRESS
        if direction == "ingress":
            return cls.INGRESS
        raise ValueError(f"unknown tunnel direction {direction!r}")

    @property
    def peer(self) -> Side:
        """The other edge's side: what a receiver expects in the AAD of what it receives."""
        return Side.INGRESS if self is Side.EGRESS else Side.EGRESS


class PayloadError(ValueError):
    """A datagram that cannot be opened: malformed, for another tunnel, or failing authentication."""


class SequenceExhausted(RuntimeError):
    """The sender's 64-bit sequence number would wrap; the tunnel must be re-keyed (interop.md 10)."""


def parse_key(hex_key: str) -> bytes:
    """Decode ``tunnel_encryption_key``: exactly 64 hex chars to exactly 32 bytes (interop.md 2.6, 10)."""
    if not _HEX64.fullmatch(hex_key):
        raise ValueError("tunnel_encryption_key must be 64 hex characters")
    return bytes.fromhex(hex_key)


def _cipher(key: bytes) -> ChaCha20Poly1305:
    if len(key) != KEY_SIZE:
        raise ValueError(f"tunnel key must be {KEY_SIZE} bytes, got {len(key)}")
    return ChaCha20Poly1305(key)


def _check_seq(seq: int) -> None:
    if not 0 <= seq <= SEQ_MAX:
        raise ValueError(f"sequence number {seq} does not fit in 64 bits")


def build_aad(tunnel_id: UUID, side: Side, seq: int, stream_nonce: bytes | None = None) -> bytes:
    """The AEAD associated data of interop.md 10.

    ``b"mediaplane-tunnel-v1" ‖ tunnel_uuid(16) ‖ dir(1) ‖ seq(8, BE)``, followed by the
    16-byte ``stream_nonce`` for TCP chunks only (interop.md 8.3, 10).
    """
    _check_seq(seq)
    aad = AAD_LABEL + tunnel_id.bytes + bytes((side,)) + seq.to_bytes(SEQ_SIZE, "big")
    if stream_nonce is not None:
        if len(stream_nonce) != STREAM_NONCE_SIZE:
            raise ValueError(f"stream_nonce must be {STREAM_NONCE_SIZE} bytes")
        aad += stream_nonce
    return aad


@dataclass(frozen=True, slots=True)
class OpenedDatagram:
    """An authenticated datagram: its sequence number and plaintext."""

    seq: int
    plaintext: bytes


class DatagramCodec:
    """Seal and open single UDP tunnel datagrams for one tunnel and key (interop.md 10).

    Stateless apart from the key schedule: no numbering, no replay check. Use
    :class:`TunnelSender` and :class:`TunnelReceiver` for those.
    """

    def __init__(self, key: bytes, tunnel_id: UUID) -> None:
        self._aead = _cipher(key)
        self.tunnel_id = tunnel_id

    def seal(self, side: Side, seq: int, nonce: bytes, plaintext: bytes) -> bytes:
        """``[tunnel_uuid][seq][nonce][ciphertext][tag]`` sent by ``side``.

        ``nonce`` must be 12 fresh bytes from the OS CSPRNG for every message (interop.md 10).
        """
        if len(nonce) != NONCE_SIZE:
            raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
        aad = build_aad(self.tunnel_id, side, seq)
        sealed = self._aead.encrypt(nonce, plaintext, aad)
        return self.tunnel_id.bytes + seq.to_bytes(SEQ_SIZE, "big") + nonce + sealed

    @staticmethod
    def peek_seq(datagram: bytes) -> int:
        """The (unauthenticated) sequence number of a datagram; :class:`PayloadError` if too short."""
        if len(datagram) < HEADER_SIZE + TAG_SIZE:
            raise PayloadError("datagram too short")
        return int.from_bytes(datagram[UUID_SIZE : UUID_SIZE + SEQ_SIZE], "big")

    def open(self, side: Side, datagram: bytes) -> OpenedDatagram:
        """Authenticate and decrypt a datagram sent by ``side``; :class:`PayloadError` on any failure."""
        seq = self.peek_seq(datagram)
        if datagram[:UUID_SIZE] != self.tunnel_id.bytes:
            raise PayloadError("datagram is for another tunnel")
        nonce = datagram[UUID_SIZE + SEQ_SIZE : HEADER_SIZE]
        aad = build_aad(self.tunnel_id, side, seq)
        try:
            plaintext = self._aead.decrypt(nonce, datagram[HEADER_SIZE:], aad)
        except InvalidTag:
            raise PayloadError("authentication failed") from None
        return OpenedDatagram(seq, plaintext)


class ReplayWindow:
    """The 1024-entry anti-replay window of interop.md 10 (RFC 4303 §3.4.3, RFC 6479).

    ``highest`` is the highest accepted sequence number; bit ``i`` of the bitmap records
    whether ``highest - i`` has been accepted. A number is acceptable when it is newer than
    ``highest`` (or nothing has been accepted yet), or lies inside the window
    ``(highest - size, highest]`` and is not marked. Check with :meth:`check` before
    authentication and :meth:`accept` only after it succeeds.
    """

    def __init__(self, size: int = REPLAY_WINDOW_SIZE) -> None:
        if size < 1:
            raise ValueError("window size must be positive")
        self.size = size
        self.highest: int | None = None
        self._bitmap = 0
        self._mask = (1 << size) - 1

    def check(self, seq: int) -> bool:
        """Whether ``seq`` would be accepted; does not change the window."""
        if self.highest is None or seq > self.highest:
            return True
        offset = self.highest - seq
        if offset >= self.size:
            return False  # older than the window
        return not (self._bitmap >> offset) & 1

    def accept(self, seq: int) -> bool:
        """Mark ``seq`` as seen, sliding the window forward if it is newer; False if it is refused."""
        if not self.check(seq):
            return False
        if self.highest is None:
            self.highest, self._bitmap = seq, 1
        elif seq > self.highest:
            shift = seq - self.highest
            self._bitmap = ((self._bitmap << shift) | 1) & self._mask if shift < self.size else 1
            self.highest = seq
        else:
            self._bitmap |= 1 << (self.highest - seq)
        return True


class TunnelSender:
    """Numbers and seals the datagrams one edge sends into a UDP tunnel (interop.md 10).

    ``first_seq`` is the sender's wall clock in nanoseconds when the tunnel starts, so that a
    restarted sender continues above its old values; each datagram adds 1.
    """

    def __init__(self, key: bytes, tunnel_id: UUID, side: Side, first_seq: int) -> None:
        _check_seq(first_seq)
        self._codec = DatagramCodec(key, tunnel_id)
        self.side = side
        self.next_seq = first_seq
        self.sent = 0

    @property
    def rekey_due(self) -> bool:
        """True once 2^32 messages have been sealed under this key (interop.md 10 "Re-keying")."""
        return self.sent >= REKEY_AFTER_MESSAGES

    def seal(self, plaintext: bytes, nonce: bytes) -> bytes:
        """The next datagram; ``nonce`` is 12 fresh CSPRNG bytes supplied by the caller.

        Raises :class:`SequenceExhausted` instead of wrapping the 64-bit sequence number:
        the document defines no wrap, and a wrapped number would be refused as a replay.
        """
        if self.next_seq > SEQ_MAX:
            raise SequenceExhausted("tunnel sequence number exhausted; re-key the tunnel")
        datagram = self._codec.seal(self.side, self.next_seq, nonce, plaintext)
        self.next_seq += 1
        self.sent += 1
        return datagram


class TunnelReceiver:
    """Opens the datagrams one edge receives from its peer, with replay protection (interop.md 10).

    ``peer_side`` is the sending edge's side (``Side.of_direction(own_direction).peer``).
    :meth:`open` returns the plaintext, or None when the datagram is dropped; drops are
    counted in ``replayed`` (old or repeated ``seq``) or ``decrypt_errors`` (malformed, for
    another tunnel, or failing authentication). The window moves only after authentication.
    """

    def __init__(self, key: bytes, tunnel_id: UUID, peer_side: Side) -> None:
        self._codec = DatagramCodec(key, tunnel_id)
        self.peer_side = peer_side
        self.window = ReplayWindow()
        self.accepted = 0
        self.replayed = 0
        self.decrypt_errors = 0

    def open(self, datagram: bytes) -> bytes | None:
        """The plaintext of an authentic, fresh datagram, or None (and a counter bumped)."""
        try:
            seq = self._codec.peek_seq(datagram)
        except PayloadError:
            self.decrypt_errors += 1
            return None
        if not self.window.check(seq):
            self.replayed += 1
            return None
        try:
            opened = self._codec.open(self.peer_side, datagram)
        except PayloadError:
            self.decrypt_errors += 1
            return None
        self.window.accept(opened.seq)
        self.accepted += 1
        return opened.plaintext
