"""An HLS checker written from RFC 8216's rules, independent of the code under test.

It imports nothing from ``services``: the playlist parser, the TS walk and the NAL scan are
its own, so a shared misunderstanding cannot pass silently. Each failure raises
``HlsViolation`` naming the clause.

* ``parse_playlist`` / ``check_playlist``: one media playlist (§4.1, §4.3.1.1, §4.3.1.2,
  §4.3.2.1, §4.3.3.1, §4.3.3.2, §4.3.3.3, §7).
* ``check_playlist_sequence``: successive versions of a live playlist (§6.2.1, §6.2.2): the media
  sequence grows by exactly the number of segments that slid out, a segment keeps its media
  sequence number and discontinuity sequence number, the target duration never shrinks.
* ``check_segment``: one MPEG-TS media segment (§3.2: whole 188-byte packets, a PAT and a PMT
  at its start; and it begins with a video IDR/IRAP access unit, so it decodes alone, which is
  what §3.2's "decodable without information from other segments" asks of a segment a
  client may join on).
* ``check_upload_order``: every segment a playlist names was stored before that playlist.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

TS = 188
PTS_WRAP = 1 << 33


class HlsViolation(AssertionError):
    """A rule of RFC 8216 (or of ISO/IEC 13818-1 for the segments) is broken."""


def _fail(clause: str, text: str) -> None:
    raise HlsViolation(f"RFC 8216 {clause}: {text}")


@dataclass
class Entry:
    uri: str
    duration: float
    discontinuity: bool
    media_sequence: int
    discontinuity_sequence: int


@dataclass
class Playlist:
    version: int | None = None
    target_duration: int | None = None
    media_sequence: int = 0
    discontinuity_sequence: int = 0
    endlist: bool = False
    entries: list[Entry] = field(default_factory=list)


_ONCE = ("#EXT-X-VERSION", "#EXT-X-TARGETDURATION", "#EXT-X-MEDIA-SEQUENCE", "#EXT-X-DISCONTINUITY-SEQUENCE")
_KNOWN = (
    *_ONCE,
    "#EXTINF",
    "#EXT-X-DISCONTINUITY",
    "#EXT-X-ENDLIST",
    "#EXT-X-PLAYLIST-TYPE",
    "#EXT-X-INDEPENDENT-SEGMENTS",
)


def _decimal_integer(value: str, clause: str) -> int:
    # §4.2: decimal-integer: unquoted digits 0-9, 0 to 2^64-1.
    if not value.isdigit() or int(value) >= 1 << 64:
        _fail(clause, f"{value!r} is not a decimal-integer")
    return int(value)


def parse_playlist(text: str) -> Playlist:
    """Parse and check one media playlist."""
    if "\r" in text.replace("\r\n", ""):
        _fail("§4.1", "a line ends in a bare CR")
    lines = text.replace("\r\n", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[0] != "#EXTM3U":
        _fail("§4.3.1.1", "the first line is not #EXTM3U")
    pl = Playlist()
    seen: set[str] = set()
    pending_duration: float | None = None
    pending_disc = False
    uses_float = False
    segments_started = False
    for raw in lines[1:]:
        line = raw.strip()
        if not line:
            continue  # §4.1: blank lines are ignored
        if line.startswith("#"):
            if not line.startswith("#EXT"):
                continue  # a comment
            name, _, value = line.partition(":")
            if name not in _KNOWN:
                _fail("§4.3", f"unexpected tag {name}")
            if name in _ONCE:
                if name in seen:
                    _fail("§4.3", f"{name} appears twice")
                seen.add(name)
                if segments_started and name in ("#EXT-X-MEDIA-SEQUENCE", "#EXT-X-DISCONTINUITY-SEQUENCE"):
                    _fail("§4.3.3.2/§4.3.3.3", f"{name} after the first media segment")
            if name == "#EXT-X-VERSION":
                pl.version = _decimal_integer(value, "§4.3.1.2")
            elif name == "#EXT-X-TARGETDURATION":
                pl.target_duration = _decimal_integer(value, "§4.3.3.1")
            elif name == "#EXT-X-MEDIA-SEQUENCE":
                pl.media_sequence = _decimal_integer(value, "§4.3.3.2")
            elif name == "#EXT-X-DISCONTINUITY-SEQUENCE":
                if "#EXT-X-DISCONTINUITY" in seen:
                    _fail("§4.3.3.3", "EXT-X-DISCONTINUITY-SEQUENCE after an EXT-X-DISCONTINUITY")
                pl.discontinuity_sequence = _decimal_integer(value, "§4.3.3.3")
            elif name == "#EXTINF":
                segments_started = True
                duration_text = value.split(",", 1)[0]
                if "," not in value:
                    _fail("§4.3.2.1", f"EXTINF without its comma: {line!r}")
                try:
                    duration = float(duration_text)
                except ValueError:
                    _fail("§4.3.2.1", f"EXTINF duration {duration_text!r}")
                if not math.isfinite(duration) or duration <= 0:
                    _fail("§4.3.2.1", f"EXTINF duration {duration_text!r}")
                uses_float = uses_float or not duration_text.isdigit()
                if pending_duration is not None:
                    _fail("§4.3.2.1", "two EXTINF tags without a URI between them")
                pending_duration = duration
            elif name == "#EXT-X-DISCONTINUITY":
                segments_started = True
                seen.add(name)
                pending_disc = True
            elif name == "#EXT-X-ENDLIST":
                pl.endlist = True
            continue
        # A URI line.
        if pending_duration is None:
            _fail("§4.3.2.1", f"URI {line!r} without an EXTINF")
            return pl
        disc_seq = pl.discontinuity_sequence + sum(e.discontinuity for e in pl.entries) + pending_disc
        pl.entries.append(Entry(line, pending_duration, pending_disc, pl.media_sequence + len(pl.entries), disc_seq))
        pending_duration, pending_disc = None, False
    if pending_duration is not None:
        _fail("§4.3.2.1", "EXTINF at the end without a URI")
    if pl.target_duration is None:
        _fail("§4.3.3.1", "EXT-X-TARGETDURATION is missing (REQUIRED)")
    if uses_float and (pl.version is None or pl.version < 3):
        _fail("§7", "floating-point EXTINF durations need EXT-X-VERSION 3 or more")
    assert pl.target_duration is not None
    for entry in pl.entries:
        # §4.3.3.1: EXTINF rounded to the nearest integer MUST be <= the target duration.
        if math.floor(entry.duration + 0.5) > pl.target_duration:
            _fail("§4.3.3.1", f"{entry.uri} lasts {entry.duration} s > target {pl.target_duration}")
    return pl


check_playlist = parse_playlist


def check_playlist_sequence(playlists: list[Playlist]) -> None:
    """§6.2.1/§6.2.2 across successive versions of one live playlist."""
    for before, after in itertools.pairwise(playlists):
        assert before.target_duration is not None and after.target_duration is not None
        if after.target_duration < before.target_duration:
            _fail("§6.2.1", f"target duration shrank {before.target_duration} -> {after.target_duration}")
        if after.media_sequence < before.media_sequence:
            _fail("§6.2.2", f"media sequence went back {before.media_sequence} -> {after.media_sequence}")
        still = {e.uri for e in after.entries}
        gone = [e for e in before.entries if e.uri not in still]
        # Segments leave from the front only, and each that left adds one to the media sequence.
        if [e.uri for e in before.entries[: len(gone)]] != [e.uri for e in gone]:
            _fail("§6.2.2", "a segment was removed from the middle of the playlist")
        if after.media_sequence - before.media_sequence != len(gone):
            _fail(
                "§6.2.2",
                f"media sequence {before.media_sequence} -> {after.media_sequence} but {len(gone)} segment(s) slid out",
            )
        by_uri = {e.uri: e for e in after.entries}
        for entry in before.entries:
            later = by_uri.get(entry.uri)
            if later is None:
                continue
            if later.media_sequence != entry.media_sequence:
                _fail("§6.2.1", f"{entry.uri} changed media sequence number")
            if later.discontinuity_sequence != entry.discontinuity_sequence:
                _fail("§6.2.2", f"{entry.uri} changed discontinuity sequence number")
            if later.duration != entry.duration:
                _fail("§6.2.1", f"{entry.uri} changed duration")
        # New segments are appended at the end, after the ones that stayed.
        kept = [e.uri for e in after.entries if e.uri in {b.uri for b in before.entries}]
        if kept != [e.uri for e in after.entries[: len(kept)]]:
            _fail("§6.2.1", "segments were inserted before existing ones")


# ---------------------------------------------------------------------- MPEG-TS segments


@dataclass
class SegmentInfo:
    packets: int
    video_pid: int | None
    first_pts: int | None  # of the first video PES (or the first audio PES when audio-only)
    keyframe: bool
    starts: dict[int, float]  # PID -> its first PES PTS minus ``first_pts``, seconds (other streams)


def _payload(pkt: bytes) -> bytes:
    afc = (pkt[3] >> 4) & 3
    if afc == 1:
        return pkt[4:]
    if afc == 3:
        return pkt[5 + pkt[4] :]
    return b""


def _section(pkt: bytes) -> bytes:
    payload = _payload(pkt)
    if not pkt[1] & 0x40 or not payload:
        raise HlsViolation("ISO/IEC 13818-1 §2.4.4.2: a table packet without a section start")
    body = payload[1 + payload[0] :]
    length = ((body[1] & 0x0F) << 8) | body[2]
    return body[: 3 + length]


def pid(pkt: bytes) -> int:
    return ((pkt[1] & 0x1F) << 8) | pkt[2]


def _crc_ok(section: bytes) -> bool:
    crc = 0xFFFFFFFF
    for byte in section:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc == 0


def _pts(pes: bytes) -> int | None:
    if len(pes) < 14 or pes[:3] != b"\x00\x00\x01" or not pes[7] & 0x80:
        return None
    p = 9
    return ((pes[p] >> 1) & 7) << 30 | pes[p + 1] << 22 | (pes[p + 2] >> 1) << 15 | pes[p + 3] << 7 | pes[p + 4] >> 1


def _first_slice_is_random_access(es: bytes, hevc: bool) -> bool | None:
    pos = es.find(b"\x00\x00\x01")
    while 0 <= pos < len(es) - 3:
        header = es[pos + 3]
        if hevc:
            kind = (header >> 1) & 0x3F
            if kind <= 31:
                return 16 <= kind <= 23  # H.265 §7.4.2.2: IRAP
        else:
            kind = header & 0x1F
            if 1 <= kind <= 5:
                return kind == 5  # H.264 Table 7-1: IDR
        pos = es.find(b"\x00\x00\x01", pos + 3)
    return None


def check_segment(data: bytes, *, audio_only: bool = False) -> SegmentInfo:
    """A segment starts with PAT, PMT, then the PES start of a video keyframe (or of audio)."""
    if not data or len(data) % TS:
        _fail("§3.2", f"a TS segment of {len(data)} bytes is not whole 188-byte packets")
    packets = [data[i : i + TS] for i in range(0, len(data), TS)]
    if any(p[0] != 0x47 for p in packets):
        _fail("§3.2", "a packet without the 0x47 sync byte")
    if pid(packets[0]) != 0:
        _fail("§3.2", "the segment does not start with the PAT")
    pat = _section(packets[0])
    if pat[0] != 0 or not _crc_ok(pat):
        _fail("§3.2", "the first packet is not a valid PAT section")
    programs = [
        ((pat[i] << 8) | pat[i + 1], ((pat[i + 2] & 0x1F) << 8) | pat[i + 3]) for i in range(8, len(pat) - 4, 4)
    ]
    pmt_pids = [p for n, p in programs if n != 0]
    if not pmt_pids:
        _fail("§3.2", "the PAT names no program")
    if len(packets) < 2 or pid(packets[1]) != pmt_pids[0]:
        _fail("§3.2", "the PAT is not followed by the PMT")
    pmt = _section(packets[1])
    if pmt[0] != 2 or not _crc_ok(pmt):
        _fail("§3.2", "the second packet is not a valid PMT section")
    info_len = ((pmt[10] & 0x0F) << 8) | pmt[11]
    p = 12 + info_len
    streams: list[tuple[int, int]] = []
    while p < len(pmt) - 4:
        streams.append((pmt[p], ((pmt[p + 1] & 0x1F) << 8) | pmt[p + 2]))
        p += 5 + (((pmt[p + 3] & 0x0F) << 8) | pmt[p + 4])
    video = [(t, s) for t, s in streams if t in (0x1B, 0x24)]
    if audio_only:
        anchor_pid, hevc = streams[0][1], False
    elif not video:
        _fail("§3.2", "the PMT has no H.264/HEVC stream")
        raise AssertionError
    else:
        anchor_pid, hevc = video[0][1], video[0][0] == 0x24
    first = packets[2] if len(packets) > 2 else None
    if first is None or pid(first) != anchor_pid or not first[1] & 0x40:
        _fail("§3.2", "the tables are not followed by the start of a video PES")
        raise AssertionError
    pes = bytearray(_payload(first))
    for pkt in packets[3:]:
        if len(pes) > 4096:
            break
        if pid(pkt) == anchor_pid:
            if pkt[1] & 0x40:
                break
            pes += _payload(pkt)
    keyframe = True
    if not audio_only:
        es = bytes(pes[9 + pes[8] :]) if len(pes) > 9 else b""
        keyframe = _first_slice_is_random_access(es, hevc) is True
        if not keyframe:
            _fail("§3.2", "the segment's first video access unit is not an IDR/IRAP picture")
    first_pts = _pts(bytes(pes))
    starts: dict[int, float] = {}
    others = {s for _, s in streams if s != anchor_pid}
    for pkt in packets[3:]:
        other = pid(pkt)
        if other in others and other not in starts and pkt[1] & 0x40 and first_pts is not None:
            pts = _pts(_payload(pkt))
            if pts is not None:
                delta = (pts - first_pts) % PTS_WRAP
                starts[other] = (delta - PTS_WRAP if delta >= PTS_WRAP // 2 else delta) / 90_000
    return SegmentInfo(len(packets), None if audio_only else anchor_pid, first_pts, keyframe, starts)


def pts_seconds(later: int, earlier: int) -> float:
    """``later - earlier`` across the 33-bit wrap, in seconds."""
    return ((later - earlier) % PTS_WRAP) / 90_000


def check_durations(playlist: Playlist, infos: dict[str, SegmentInfo], target: float, tolerance: float) -> None:
    """EXTINF agrees with the PTS of consecutive segments; each is within ``tolerance`` of ``target``."""
    entries = playlist.entries
    for entry, nxt in itertools.pairwise(entries):
        a, b = infos[entry.uri].first_pts, infos[nxt.uri].first_pts
        if a is not None and b is not None and not nxt.discontinuity:
            measured = pts_seconds(b, a)
            if abs(measured - entry.duration) > 0.002:
                _fail("§4.3.2.1", f"{entry.uri}: EXTINF {entry.duration} but the PTS span is {measured:.3f} s")
    for entry in entries:
        if abs(entry.duration - target) > tolerance:
            _fail("§4.3.2.1", f"{entry.uri} lasts {entry.duration} s, target {target} s +- {tolerance}")


def check_upload_order(order: list[tuple[str, bytes]], playlist_name: str = "index.m3u8") -> list[Playlist]:
    """``order``: the ``(path, body)`` of every stored upload, oldest first. Each playlist version
    may name only segments stored before it (a player fetches what it names at once).
    Answers the parsed playlist versions, oldest first."""
    stored: set[str] = set()
    versions: list[Playlist] = []
    for path, body in order:
        name = path.rsplit("/", 1)[-1]
        if name == playlist_name:
            playlist = parse_playlist(body.decode())
            for entry in playlist.entries:
                if entry.uri not in stored:
                    _fail("§6.2.1", f"playlist names {entry.uri} before it was uploaded")
            versions.append(playlist)
        else:
            stored.add(name)
    return versions


__all__ = [
    "Entry",
    "HlsViolation",
    "Playlist",
    "SegmentInfo",
    "check_durations",
    "check_playlist",
    "check_playlist_sequence",
    "check_segment",
    "check_upload_order",
    "parse_playlist",
    "pts_seconds",
]
