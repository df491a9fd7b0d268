"""The ``hls`` output kind: cut the flow's MPEG-TS into HLS segments and upload them with the
live playlist over HTTP(S) (interop.md 2.5; RFC 8216; docs/hls.md).

Three stages, none of which waits on the next:

* ``offer`` appends the flow's raw TS to a bounded byte queue and never waits (a full queue drops
  the datagram and counts its packets, interop.md 11; the segmenter is told of the gap, so the
  segment with the hole is dropped and the next one starts a discontinuity).
* the segment task feeds the queue to the sans-IO ``HlsSegmenter`` and hands each finished
  segment to the uploader through a small bounded queue (``pending_limit`` segments); when it is
  full the oldest pending segment is skipped (a warning; the next one carries
  ``#EXT-X-DISCONTINUITY``).
* the uploader PUTs ``seg_<n>.ts`` (``video/mp2t``), then, once that succeeded, ``index.m3u8``
  (``application/vnd.apple.mpegurl``) listing it. Each file gets ``UPLOAD_ATTEMPTS`` attempts
  within one budget (``upload_budget``: 1.5 x the segment duration, at least 2 s), so a slow
  server never makes a segment wait much longer than one segment duration. A segment that
  could not be uploaded is skipped with an ``hls`` warning naming the file and the HTTP status
  or error class (never the server's body, never the token).

State: ``waiting`` until the first keyframe, ``active`` while uploads succeed, ``failing`` once
nothing has been uploaded for ``FAILING_AFTER_S`` while uploads were tried (one critical event;
the per-file warnings are then logged at debug level only); the next success is an info and
``active`` again. The ``auth_token`` goes out only as ``Authorization: Bearer``; every text passes
through ``redact`` (token and the URL's query, which carries YouTube's stream key).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import httpx
import trio

from appliance.models.config import HlsOutput
from appliance.models.events import Event, EventCategory, critical, info, warning
from services.edge.core.hls import HlsSegmenter, MediaPlaylist, Segment, display_url, file_url, segment_name
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.kinds.offered import OfferedTs, OfferedTsOutput

_log = logging.getLogger("mediaplane.engine")

UPLOAD_METHOD: Final = "PUT"
PLAYLIST_NAME: Final = "index.m3u8"
SEGMENT_TYPE: Final = "video/mp2t"  # RFC 8216 §3.2 / IANA
PLAYLIST_TYPE: Final = "application/vnd.apple.mpegurl"  # RFC 8216 §4
QUEUE_MAX_BYTES: Final = 8 * 1024 * 1024  # offered TS not yet segmented (~8 s at 8 Mbit/s)
UPLOAD_ATTEMPTS: Final = 3
RETRY_BACKOFF_S: Final = (0.2, 0.5)  # before the 2nd and 3rd attempt
FAILING_AFTER_S: Final = 30.0  # nothing uploaded for this long while trying: ``failing``
CONNECT_TIMEOUT_S: Final = 5.0
SEGMENT_BATCH: Final = 256  # offered chunks segmented between two checkpoints


def upload_budget(segment_duration_secs: float) -> float:
    """Seconds one file may take, all attempts together."""
    return max(2.0, 1.5 * segment_duration_secs)


def pending_limit(segment_duration_secs: float) -> int:
    """Finished segments that may wait for the uploader (about 6 s of media, at least 2)."""
    return max(2, round(6.0 / segment_duration_secs))


@dataclass(slots=True)
class _Pending:
    segment: Segment
    discontinuity: bool


class UploadFailed(Exception):
    """One file could not be uploaded; the text is safe to show (no token, no query, no body)."""


class HlsOutputDriver(OfferedTsOutput):
    """An ``hls`` output: segments the flow's TS and uploads segments and playlist."""

    def __init__(self, config: HlsOutput, flow: FlowPort) -> None:
        self.config = config
        self.flow = flow
        self.output_id = config.id
        self._token = config.auth_token or None
        self._query = config.ingest_url.partition("?")[2].partition("#")[0]
        self.target = display_url(config.ingest_url)
        self.state = "waiting"
        self.packets_sent = 0  # 188-byte packets in uploaded segments
        self.bytes_sent = 0  # octets of uploaded segments and playlists
        self.packets_dropped = 0  # in segments the segmenter dropped or the uploader skipped
        self.segments_uploaded = 0
        self.segments_skipped = 0
        self.segmenter = HlsSegmenter(config.segment_duration_secs)
        self.playlist = MediaPlaylist(config.segment_duration_secs, config.max_segments)
        self._budget = upload_budget(config.segment_duration_secs)
        self.offered = OfferedTs(QUEUE_MAX_BYTES)
        self._pending: deque[_Pending] = deque()
        self._pending_limit = pending_limit(config.segment_duration_secs)
        self._next_discontinuity = False
        self._segment_ready = trio.Event()
        self._last_success: float | None = None  # trio time of the last upload, or of the first try
        self._dropped_by_segmenter = 0
        self._scope = trio.CancelScope()
        self._closed = False

    # ------------------------------------------------------------------ the flow's side

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ready at once; then segment and upload until closed."""
        with self._scope:
            task_status.started()
            timeout = httpx.Timeout(self._budget, connect=min(CONNECT_TIMEOUT_S, self._budget))
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._segment_loop)
                    nursery.start_soon(self._upload_loop, client)

    def offer(self, datagram: bytes | None, payload: memoryview, arrival: float) -> None:
        """Queue the TS for the segment task; never waits (a full queue drops, counted)."""
        if self._closed:
            return
        self.offered.put(payload)

    def close(self) -> None:
        self._closed = True
        self.offered.clear()
        self._scope.cancel()

    def dropped(self) -> int:
        return self.offered.dropped_packets + self.packets_dropped

    # ------------------------------------------------------------------ texts

    def redact(self, text: str) -> str:
        """``text`` without the token or the ingest URL's query (both secrets)."""
        for secret in (self._token, self._query):
            if secret:
                text = text.replace(secret, "***")
        return text

    def _event(self, make: Callable[..., Event], message: str, **details: object) -> None:
        self.flow.publish(
            make(
                EventCategory.HLS,
                self.redact(f"HLS output {self.output_id}: {message}"),
                flow_id=self.flow.flow_id,
                output_id=self.output_id,
                **details,
            )
        )

    # ------------------------------------------------------------------ segmenting

    async def _segment_loop(self) -> None:
        offered = self.offered
        while True:
            await offered.wait()
            while offered.chunks:
                for _ in range(min(len(offered.chunks), SEGMENT_BATCH)):
                    chunk = offered.pop()
                    if chunk is None:
                        self.segmenter.gap()
                        continue
                    for segment in self.segmenter.feed(chunk):
                        self._hand_over(segment)
                self._count_segmenter_drops()
                if self.state == "waiting" and self.segmenter.started:
                    self.state = "active"
                await trio.lowlevel.checkpoint()

    def _count_segmenter_drops(self) -> None:
        dropped = self.segmenter.stats.packets_dropped
        if dropped != self._dropped_by_segmenter:
            self.packets_dropped += dropped - self._dropped_by_segmenter
            self._dropped_by_segmenter = dropped

    def _hand_over(self, segment: Segment) -> None:
        """Queue ``segment`` for upload; a full queue skips the oldest pending one."""
        if len(self._pending) >= self._pending_limit:
            old = self._pending.popleft()
            self._skipped(old.segment, "the uploader is behind (the server is too slow)")
            if self._pending:
                self._pending[0].discontinuity = True
            else:
                self._next_discontinuity = True
        self._pending.append(_Pending(segment, segment.discontinuity or self._next_discontinuity))
        self._next_discontinuity = False
        self._segment_ready.set()

    def _skipped(self, segment: Segment, reason: str, **details: object) -> None:
        self.segments_skipped += 1
        self.packets_dropped += segment.packets
        name = segment_name(segment.sequence)
        if self.state == "failing":
            _log.debug("flow %s hls output %s: %s skipped: %s", self.flow.flow_id, self.output_id, name, reason)
            return
        self._event(warning, f"segment {name} skipped: {reason}", file=name, **details)

    # ------------------------------------------------------------------ uploading

    async def _upload_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            while not self._pending:
                await self._segment_ready.wait()
                self._segment_ready = trio.Event()
            item = self._pending.popleft()
            segment = item.segment
            name = segment_name(segment.sequence)
            if self._last_success is None:
                self._last_success = trio.current_time()
            try:
                await self._upload(client, name, segment.data, SEGMENT_TYPE)
            except UploadFailed as exc:
                self._skipped(segment, f"upload to {self.target} failed ({exc})", error=str(exc))
                if self._pending:
                    self._pending[0].discontinuity = True
                else:
                    self._next_discontinuity = True
                self._check_failing()
                continue
            self.packets_sent += segment.packets
            self.segments_uploaded += 1
            self.playlist.add(name, segment.duration, discontinuity=item.discontinuity)
            try:
                await self._upload(client, PLAYLIST_NAME, self.playlist.render().encode(), PLAYLIST_TYPE)
            except UploadFailed as exc:
                # The segment is there; the next playlist will list it.
                if self.state != "failing":
                    self._event(
                        warning,
                        f"playlist {PLAYLIST_NAME} upload to {self.target} failed ({exc})",
                        file=PLAYLIST_NAME,
                        error=str(exc),
                    )
                self._check_failing()
                continue
            self._succeeded()

    def _succeeded(self) -> None:
        self._last_success = trio.current_time()
        if self.state == "failing":
            self._event(info, f"uploads to {self.target} succeed again")
        self.state = "active"

    def _check_failing(self) -> None:
        now = trio.current_time()
        if self.state == "failing" or self._last_success is None:
            return
        if now - self._last_success >= FAILING_AFTER_S:
            self.state = "failing"
            self._event(critical, f"nothing uploaded to {self.target} for {now - self._last_success:.0f} s")

    async def _upload(self, client: httpx.AsyncClient, name: str, body: bytes, content_type: str) -> None:
        """One file, ``UPLOAD_ATTEMPTS`` attempts within the budget; UploadFailed when none succeeded."""
        url = file_url(self.config.ingest_url, name)
        headers = {"Content-Type": content_type}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        reason = "no attempt"
        with trio.move_on_after(self._budget) as budget:
            for attempt in range(UPLOAD_ATTEMPTS):
                if attempt:
                    await trio.sleep(RETRY_BACKOFF_S[min(attempt - 1, len(RETRY_BACKOFF_S) - 1)])
                try:
                    response = await client.request(UPLOAD_METHOD, url, content=body, headers=headers)
                except httpx.TimeoutException:
                    reason = "timed out"
                    continue
                except httpx.HTTPError as exc:
                    reason = _error_text(exc)
                    continue
                if 200 <= response.status_code < 300:
                    self.bytes_sent += len(body)
                    return
                reason = f"HTTP {response.status_code}"  # the body is not echoed (it may be anything)
        if budget.cancelled_caught:
            reason = f"{reason}; gave up after {self._budget:g} s" if reason != "no attempt" else "timed out"
        raise UploadFailed(self.redact(reason))


def _error_text(exc: httpx.HTTPError) -> str:
    """A short cause without the request URL (httpx puts it in some messages): the error class
    and, when an OS error lies under it, its text (``ConnectError: Connection refused``)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        cause = todo.pop()
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.strerror:
            return f"{type(exc).__name__}: {cause.strerror}"
        if isinstance(cause, BaseExceptionGroup):
            todo.extend(cause.exceptions)
        todo.extend(c for c in (cause.__cause__, cause.__context__) if c is not None)
    return type(exc).__name__


__all__ = [
    "PLAYLIST_NAME",
    "UPLOAD_METHOD",
    "HlsOutputDriver",
    "UploadFailed",
    "pending_limit",
    "upload_budget",
]
