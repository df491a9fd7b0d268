"""Raw TS the flow offers to an output that makes its own packets (``rtmp``, ``hls``).

``offer`` runs on the input's path and must never wait (interop.md 11: a full queue drops and
counts); the output's own task takes the chunks. ``OfferedTs`` is that hand-over: a byte-bounded
queue where a ``None`` marks the place datagrams were dropped, so the consumer knows its stream
has a hole there (the RTMP converter resumes at a keyframe, the HLS segmenter drops the segment).
"""

from __future__ import annotations

from collections import deque

import trio

from appliance.models.stats import OutputCounters
from services.edge.core.ts.packet import TS_PACKET_SIZE


class OfferedTs:
    """A bounded queue of offered TS chunks (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.chunks: deque[bytes | None] = deque()
        self.queued_bytes = 0
        self.dropped_datagrams = 0  # offered chunks refused by a full queue
        self.dropped_packets = 0  # the TS packets in them
        self._gap_marked = False
        self._ready = trio.Event()

    def put(self, payload: memoryview) -> bool:
        """Queue a copy of ``payload``; False (counted, the hole marked once) when it does not fit."""
        size = len(payload)
        if self.queued_bytes + size > self.max_bytes:
            self.dropped_datagrams += 1
            self.dropped_packets += max(1, size // TS_PACKET_SIZE)
            if not self._gap_marked:
                self.chunks.append(None)
                self._gap_marked = True
            return False
        self._gap_marked = False
        self.chunks.append(bytes(payload))
        self.queued_bytes += size
        return True

    def wake(self) -> None:
        """Wake the consumer (once per input batch) when there is something to take."""
        if self.chunks:
            self._ready.set()

    async def wait(self) -> None:
        """Until ``wake`` was called since the last wait."""
        await self._ready.wait()
        self._ready = trio.Event()

    def pop(self) -> bytes | None:
        """The oldest chunk, or None where datagrams were dropped (IndexError when empty)."""
        chunk = self.chunks.popleft()
        if chunk is not None:
            self.queued_bytes -= len(chunk)
        return chunk

    def clear(self) -> None:
        """Forget what is queued (the counters stay)."""
        self.chunks.clear()
        self.queued_bytes = 0
        self._gap_marked = False


class OfferedTsOutput:
    """The flow's side of an output that makes its own packets from offered TS: ``flush`` wakes
    its task, it takes no receive slots, and its counters add what the queue dropped.

    A subclass sets ``output_id``, ``state``, ``packets_sent``, ``bytes_sent`` and ``offered``,
    and says in ``dropped()`` what ``packets_dropped`` counts.
    """

    output_id: str
    state: str
    packets_sent: int
    bytes_sent: int
    offered: OfferedTs

    def flush(self) -> None:
        """Wake the output's task once per input batch."""
        self.offered.wake()

    def slot_layout(self, header_len: int, size: int) -> tuple[int, int] | None:
        return None  # the packets are made here from the offered TS

    def send_slots(self, buffer: bytearray, offset: int, stride: int, length: int, count: int) -> None:
        raise AssertionError("slot_layout is None: the flow offers instead")

    def dropped(self) -> int:
        """``packets_dropped``: by default the TS packets a full queue refused."""
        return self.offered.dropped_packets

    def counters(self) -> OutputCounters:
        return OutputCounters(
            output_id=self.output_id,
            state=self.state,
            packets_sent=self.packets_sent,
            bytes_sent=self.bytes_sent,
            packets_dropped=self.dropped(),
        )


__all__ = ["OfferedTs", "OfferedTsOutput"]
