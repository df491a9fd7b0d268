"""The live HLS media playlist (RFC 8216 §4.3, §6.2.1, §6.2.2). Sans-IO.

``MediaPlaylist`` keeps a sliding window of the last ``max_segments`` uploaded segments and
renders ``index.m3u8``:

* ``#EXTM3U`` first (§4.3.1.1), ``#EXT-X-VERSION:3`` (§4.3.1.2: decimal EXTINF durations need 3,
  §7).
* ``#EXT-X-TARGETDURATION`` (§4.3.3.1): an integer at least every listed segment's EXTINF
  rounded to the nearest integer. §6.2.1 says it MUST NOT change, but a live source can deliver
  a GOP longer than planned; so it starts at ceil(``segment_duration_secs``) and grows to the
  rounded length of the longest segment ever listed, never shrinking: a player that read a
  smaller value sees a later playlist whose segments still obey the larger one (the alternative,
  dropping the long segment, would lose media).
* ``#EXT-X-MEDIA-SEQUENCE`` (§4.3.3.2): the Media Sequence Number of the first listed segment; it
  grows by one for every segment that slides out of the window (§6.2.2), so a segment keeps
  its number across playlists.
* ``#EXT-X-DISCONTINUITY`` (§4.3.2.3) before a segment that follows a skipped one (an upload
  that failed, a segment the segmenter dropped, a timestamp jump), and
  ``#EXT-X-DISCONTINUITY-SEQUENCE`` (§4.3.3.3) once a discontinuity has slid out of the window.
* ``#EXTINF:<duration>,`` (§4.3.2.1) with three decimals, then the segment's relative URI.

A segment enters only once its upload succeeded (the driver's rule); ``render`` is then
uploaded as the new playlist.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

VERSION = 3


@dataclass(frozen=True, slots=True)
class PlaylistEntry:
    """One listed segment."""

    uri: str
    duration: float
    discontinuity: bool


def segment_name(sequence: int) -> str:
    """The file name (and relative URI) of the segment numbered ``sequence``."""
    return f"seg_{sequence}.ts"


def _rounded(duration: float) -> int:
    """§4.3.3.1: "rounded to the nearest integer" (halves up, not Python's banker's rounding)."""
    return math.floor(duration + 0.5)


class MediaPlaylist:
    """A live media playlist over a sliding window of ``max_segments``."""

    def __init__(self, target_duration_secs: float, max_segments: int) -> None:
        if max_segments < 1:
            raise ValueError("max_segments must be at least 1")
        self.max_segments = max_segments
        self.target_duration = max(1, math.ceil(target_duration_secs))
        self.media_sequence = 0  # §4.3.3.2 of the first listed segment
        self.discontinuity_sequence = 0  # §4.3.3.3
        self._entries: deque[PlaylistEntry] = deque()
        self._pending_discontinuity = False

    @property
    def entries(self) -> tuple[PlaylistEntry, ...]:
        """The listed segments, oldest first."""
        return tuple(self._entries)

    def skipped(self) -> None:
        """A segment was lost (not uploaded, or dropped): the next one added starts a discontinuity."""
        if self._entries:
            self._pending_discontinuity = True

    def add(self, uri: str, duration: float, *, discontinuity: bool = False) -> None:
        """List a segment whose upload succeeded; slides the oldest out past ``max_segments``."""
        flag = bool(self._entries) and (discontinuity or self._pending_discontinuity)
        self._pending_discontinuity = False
        self._entries.append(PlaylistEntry(uri, duration, flag))
        self.target_duration = max(self.target_duration, _rounded(duration))
        while len(self._entries) > self.max_segments:
            self._entries.popleft()  # never tagged: see below
            self.media_sequence += 1
        # §4.3.3.3 counts the discontinuities *before* the first listed segment: a tag on the
        # first segment itself has no effect for a client that starts there, so it is dropped
        # from the first entry and counted once it slides out.
        first = self._entries[0]
        if first.discontinuity:
            self._entries[0] = PlaylistEntry(first.uri, first.duration, False)
            self.discontinuity_sequence += 1

    def render(self) -> str:
        """The playlist text (UTF-8, lines ending in LF, §4.1)."""
        lines = [
            "#EXTM3U",
            f"#EXT-X-VERSION:{VERSION}",
            f"#EXT-X-TARGETDURATION:{self.target_duration}",
            f"#EXT-X-MEDIA-SEQUENCE:{self.media_sequence}",
        ]
        if self.discontinuity_sequence:
            lines.append(f"#EXT-X-DISCONTINUITY-SEQUENCE:{self.discontinuity_sequence}")
        for entry in self._entries:
            if entry.discontinuity:
                lines.append("#EXT-X-DISCONTINUITY")
            lines.append(f"#EXTINF:{entry.duration:.3f},")
            lines.append(entry.uri)
        return "\n".join(lines) + "\n"


__all__ = ["VERSION", "MediaPlaylist", "PlaylistEntry", "segment_name"]
