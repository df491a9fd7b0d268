"""Tunnel payload encryption for TCP streams (interop.md 10, 8.3), sans-IO.

Wire form of one TCP tunnel chunk (interop.md 10)::

    [u32 BE len][seq 8, big-endian][nonce 12][ciphertext][tag 16]      len covers everything after it

    AAD = b"mediaplane-tunnel-v1" ‖ tunnel_uuid(16) ‖ dir(1) ‖ seq(8, BE) ‖ stream_nonce(16)

``stream_nonce`` is the 16 random bytes of the stream's JSON header (interop.md 8.3); binding
it into the AAD stops chunks being moved from one stream to another. Per stream and per
direction ``seq`` starts at 0 and increases by exactly 1. A gap, a repeat, an authentication
failure or a bad length means both TCP connections must be reset: the opener raises
:class:`StreamBroken` and stays broken.

Plaintext chunks are at most 64 KiB (interop.md 10). The framing line of the same section
allows ``len`` up to 1 MiB; this opener enforces the tighter plaintext limit by default
(``len`` ≤ 64 KiB + 36) and never accepts more than 1 MiB, whatever it is configured with.

The AEAD, key check and AAD come from :mod:`appliance.tunnel.payload`. No I/O, no clock, no
randomness: the caller supplies every 12-byte nonce (fresh from the OS CSPRNG each time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final
from uuid import UUID

from cryptography.exceptions import InvalidTag

from appliance.tunnel.payload import (
    NONCE_SIZE,
    SEQ_MAX,
    SEQ_SIZE,
    STREAM_NONCE_SIZE,
    TAG_SIZE,
    PayloadError,
    SequenceExhausted,
    Side,
    _cipher,
    build_aad,
)

LEN_SIZE: Final = 4
"""The big-endian u32 length prefix of a chunk."""
CHUNK_OVERHEAD: Final = SEQ_SIZE + NONCE_SIZE + TAG_SIZE
"""Bytes counted by ``len`` beyond the plaintext (36); a chunk on the wire is 40 bytes longer than its plaintext."""
MAX_PLAINTEXT: Final = 64 * 1024
"""Largest plaintext of one chunk (interop.md 10: "at most 64 KiB")."""
MAX_WIRE_LEN: Final = 1024 * 1024
"""Largest ``len`` the framing allows (interop.md 10: "≤ 1 MiB")."""

NonceSource = Callable[[], bytes]
"""Returns 12 fresh CSPRNG bytes per call (e.g. ``lambda: os.urandom(12)`` in the driver)."""


class StreamBroken(PayloadError):
    """The stream cannot continue: reset both TCP connections (interop.md 10).

    ``reason`` is a short tag: ``"length"``, ``"sequence"``, ``"auth"``, ``"truncated"`` or
    ``"broken"`` (fed again after an earlier failure). ``opened`` holds the plaintexts
    authenticated earlier in the same :meth:`StreamOpener.feed` call, before the failure.
    """

    def __init__(self, reason: str, detail: str, opened: list[bytes] | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.opened: list[bytes] = opened if opened is not None else []


def _check_stream_nonce(stream_nonce: bytes) -> None:
    if len(stream_nonce) != STREAM_NONCE_SIZE:
        raise ValueError(f"stream_nonce must be {STREAM_NONCE_SIZE} bytes")


class StreamSealer:
    """Numbers and seals what one edge sends on one tunnelled TCP stream (interop.md 10).

    ``side`` is the sending edge's side; ``stream_nonce`` the 16 bytes of the stream header.
    """

    def __init__(
        self, key: bytes, tunnel_id: UUID, side: Side, stream_nonce: bytes, max_plaintext: int = MAX_PLAINTEXT
    ) -> None:
        _check_stream_nonce(stream_nonce)
        if not 1 <= max_plaintext <= MAX_PLAINTEXT:
            raise ValueError(f"max_plaintext must be in 1..{MAX_PLAINTEXT}")
        self._aead = _cipher(key)
        self.tunnel_id = tunnel_id
        self.side = side
        self.stream_nonce = stream_nonce
        self.max_plaintext = max_plaintext
        self.next_seq = 0
        self.chunks = 0
        self.plaintext_bytes = 0
        self.wire_bytes = 0

    def chunk_count(self, size: int) -> int:
        """How many chunks (and so nonces) :meth:`seal` needs for ``size`` plaintext bytes."""
        return -(-size // self.max_plaintext)

    def seal_chunk(self, plaintext: bytes, nonce: bytes) -> bytes:
        """One framed chunk of at most ``max_plaintext`` bytes, with the next ``seq``."""
        if len(plaintext) > self.max_plaintext:
            raise ValueError(f"chunk plaintext is {len(plaintext)} bytes, limit {self.max_plaintext}")
        if len(nonce) != NONCE_SIZE:
            raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
        if self.next_seq > SEQ_MAX:
            raise SequenceExhausted("stream sequence number exhausted; reset the stream")
        seq = self.next_seq
        sealed = self._aead.encrypt(nonce, plaintext, build_aad(self.tunnel_id, self.side, seq, self.stream_nonce))
        body = seq.to_bytes(SEQ_SIZE, "big") + nonce + sealed
        chunk = len(body).to_bytes(LEN_SIZE, "big") + body
        self.next_seq += 1
        self.chunks += 1
        self.plaintext_bytes += len(plaintext)
        self.wire_bytes += len(chunk)
        return chunk

    def seal(self, plaintext: bytes, nonce: bytes | NonceSource) -> bytes:
        """``plaintext`` as consecutive framed chunks, split at ``max_plaintext``.

        ``nonce`` is 12 fresh bytes when the plaintext fits one chunk, or a nonce source
        called once per chunk. Empty plaintext gives no chunk (and no bytes).
        """
        count = self.chunk_count(len(plaintext))
        if isinstance(nonce, bytes | bytearray):
            if count > 1:
                raise ValueError(f"{count} chunks need {count} nonces: pass a nonce source")
            return self.seal_chunk(plaintext, bytes(nonce)) if count else b""
        used: set[bytes] = set()
        out = bytearray()
        view = memoryview(plaintext)
        for start in range(0, len(plaintext), self.max_plaintext):
            fresh = nonce()
            if fresh in used:
                raise ValueError("the nonce source repeated a nonce")
            used.add(fresh)
            out += self.seal_chunk(bytes(view[start : start + self.max_plaintext]), fresh)
        return bytes(out)


class StreamOpener:
    """Reassembles and opens the chunks one edge receives on one tunnelled TCP stream.

    ``peer_side`` is the sending edge's side (``Side.of_direction(own_direction).peer``).
    Feed it the stream's bytes as they arrive, split anywhere; :meth:`feed` returns the
    plaintexts of the chunks completed so far. Any violation raises :class:`StreamBroken`,
    and so does every later call: the caller resets both TCP connections.

    ``max_plaintext`` defaults to the 64 KiB limit of interop.md 10; ``len`` is checked as soon
    as its 4 bytes arrive, so an oversize chunk is never buffered.
    """

    def __init__(
        self, key: bytes, tunnel_id: UUID, peer_side: Side, stream_nonce: bytes, max_plaintext: int = MAX_PLAINTEXT
    ) -> None:
        _check_stream_nonce(stream_nonce)
        if not 0 <= max_plaintext <= MAX_WIRE_LEN - CHUNK_OVERHEAD:
            raise ValueError(f"max_plaintext must be in 0..{MAX_WIRE_LEN - CHUNK_OVERHEAD}")
        self._aead = _cipher(key)
        self.tunnel_id = tunnel_id
        self.peer_side = peer_side
        self.stream_nonce = stream_nonce
        self.max_len = max_plaintext + CHUNK_OVERHEAD
        self._buffer = bytearray()
        self.next_seq = 0
        self.chunks = 0
        self.plaintext_bytes = 0
        self.wire_bytes = 0
        self.broken: str | None = None
        """The reason of the failure that broke the stream, or None while it is healthy."""

    @property
    def pending(self) -> int:
        """Bytes of an incomplete chunk held in the buffer."""
        return len(self._buffer)

    def _fail(self, reason: str, detail: str, opened: list[bytes]) -> StreamBroken:
        self.broken = reason
        self._buffer.clear()
        return StreamBroken(reason, detail, opened)

    def feed(self, data: bytes) -> list[bytes]:
        """Plaintexts of every chunk completed by ``data``; :class:`StreamBroken` on any violation."""
        if self.broken is not None:
            raise StreamBroken("broken", f"stream already failed ({self.broken})")
        buf = self._buffer
        buf += data
        opened: list[bytes] = []
        while len(buf) >= LEN_SIZE:
            length = int.from_bytes(buf[:LEN_SIZE], "big")
            if not CHUNK_OVERHEAD <= length <= self.max_len:
                raise self._fail("length", f"chunk length {length} outside {CHUNK_OVERHEAD}..{self.max_len}", opened)
            if len(buf) < LEN_SIZE + length:
                break
            seq = int.from_bytes(buf[LEN_SIZE : LEN_SIZE + SEQ_SIZE], "big")
            if seq != self.next_seq:
                raise self._fail("sequence", f"expected seq {self.next_seq}, got {seq}", opened)
            nonce = bytes(buf[LEN_SIZE + SEQ_SIZE : LEN_SIZE + SEQ_SIZE + NONCE_SIZE])
            sealed = bytes(buf[LEN_SIZE + SEQ_SIZE + NONCE_SIZE : LEN_SIZE + length])
            aad = build_aad(self.tunnel_id, self.peer_side, seq, self.stream_nonce)
            try:
                plaintext = self._aead.decrypt(nonce, sealed, aad)
            except InvalidTag:
                raise self._fail("auth", f"authentication failed at seq {seq}", opened) from None
            del buf[: LEN_SIZE + length]
            self.next_seq += 1
            self.chunks += 1
            self.plaintext_bytes += len(plaintext)
            self.wire_bytes += LEN_SIZE + length
            opened.append(plaintext)
        return opened

    def eof(self) -> None:
        """The peer closed its side: :class:`StreamBroken` if it stopped in the middle of a chunk."""
        if self.broken is not None:
            raise StreamBroken("broken", f"stream already failed ({self.broken})")
        if self._buffer:
            raise self._fail("truncated", f"stream ended inside a chunk ({len(self._buffer)} bytes pending)", [])
