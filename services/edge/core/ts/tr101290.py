"""TR 101 290 priority 1 and 2 analyser (ETSI TR 101 290 V1.4.1 §5.2.1, §5.2.2), sans-IO.

Theory of operation
-------------------
The analyser is fed whole 188-byte TS packets with their arrival time (monotonic seconds, the
caller's clock, style H2) and a running packet index. Three paths give the same counters:

* ``feed_packets`` walks the packets of one datagram in Python. Each packet costs a header read,
  a continuity check and a few list look-ups; a datagram of one PID in counter order (most of a
  video flow) is checked as four byte strides instead.
* ``feed_strided`` takes a batch in the engine's receive layout (datagram k at a fixed stride in
  one buffer). It gathers the batch's 4-byte headers in one strided copy, finds runs of
  datagrams whose packets are payload-only packets of one PID continuing its counter by
  comparing with a precomputed header pattern (a few C-level prefix compares per run), and
  accounts a run with a few additions. A datagram that breaks the run takes a plan cached by
  its header signature (several PIDs, null packets, repeated PSI: per-PID counts and counters)
  or the per-packet loop of ``feed_packets``. The engine's path (bench/analysis.py).
* ``feed_array`` takes a batch as a numpy ``(n, 188)`` array and does the per-packet work
  (sync byte, TEI, per-PID counts, continuity) as array operations: the continuity check sorts
  the batch by PID (stable, so stream order holds within a PID) and compares each packet with
  its predecessor on the same PID. Used for very large batches (capture replay).

All hand the rare packets (PSI sections, PCRs, PES starts, packets the media analyser asked
for, scrambled packets before a CAT) to the same Python code in stream order, so everything
that depends on section contents or PCR values is shared. Repeated tables are cheap: a
section-starting PSI payload equal to the last one skips reassembly, and a section equal to
the last one skips its CRC and parse (pure functions of the bytes). Interval checks (PAT, PMT,
PID, PCR and PTS repetition) use ``_Watch``: one error per gap, counted when the late item
arrives or when ``check_timers`` finds the gap already longer than the limit, whichever comes
first, so a PAT withheld for 3 s is one PAT_error, not six.

Never raises on stream bytes (style H5): every malformation is a counter.
"""

from __future__ import annotations

import array
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from .packet import (
    CAT_PID,
    NIT_PID,
    NULL_PID,
    PAT_PID,
    PCR_HZ,
    PCR_WRAP,
    PID_COUNT,
    SDT_PID,
    SYNC_BYTE,
    TS_PACKET_SIZE,
    Buffer,
    packet_pcr,
    payload_offset,
    pes_pts,
)
from .psi import TABLE_CAT, TABLE_PAT, TABLE_PMT, Pmt, SectionAssembler, parse_pat, parse_pmt, section_crc_ok

# TR 101 290 §5.2.1 / §5.2.2 limits.
PAT_INTERVAL_S: Final = 0.5  # 1.3 PAT_error
PMT_INTERVAL_S: Final = 0.5  # 1.5 PMT_error
PCR_REPETITION_S: Final = 0.1  # 2.3a PCR_repetition_error
PCR_DISCONTINUITY_TICKS: Final = PCR_HZ // 10  # 2.3b: consecutive PCRs more than 100 ms apart
PCR_ACCURACY_TICKS: Final = 13.5  # 2.4 PCR_accuracy_error: +-500 ns at 27 MHz
PTS_INTERVAL_S: Final = 0.7  # 2.5 PTS_error
SYNC_LOST_AFTER: Final = 2  # 1.1 TS_sync_loss: lost after 2 corrupted sync bytes in a row,
SYNC_ACQUIRED_AFTER: Final = 5  # and acquired again after 5 correct ones (TR 101 290 §5.2.1 note)
DEFAULT_WINDOW_S: Final = 10.0  # interop.md §11: errors count over the last 10 s
# Accuracy is judged once the byte-rate estimate spans this many packets (a rate from a few
# packets is too coarse to resolve 500 ns).
_PCR_ACCURACY_MIN_SPAN: Final = 50
_MAX_EVENTS: Final = 16
_PCR_REBASE_AFTER: Final = 5  # consecutive inaccurate PCRs: the mux rate changed, re-learn it

STREAM_TYPE_JPEG_XS: Final = 0x32

# Fast-path patterns for whole datagrams (feed_packets): up to _RUN_MAX packets.
_RUN_MAX: Final = 16
_SYNC_RUN: Final = bytes([SYNC_BYTE]) * _RUN_MAX
_UNIFORM: Final = [bytes([b]) * _RUN_MAX for b in range(256)]
# Fourth header byte of consecutive payload-only, unscrambled packets: 0x1c, 0x1d, ...
_CC_RUN: Final = bytes(0x10 | (k & 0x0F) for k in range(16 + _RUN_MAX))

# Batch fast path (feed_strided): the 4-byte headers of a batch, datagram after datagram, are
# compared with the headers a run of one PID in counter order would have. A pattern covers
# _RUN_CHUNK datagrams; a multiple of 16, so that every chunk of a run starts at the same counter
# phase (16 x n packets = 0 mod 16) and one pattern per phase serves runs of any length.
_RUN_CHUNK: Final = 64
_SHORT_RUN: Final = 4  # runs shorter than this on average (datagrams): a mixed stream,
_PLAN_SPELL: Final = 16  # so take this many datagrams by plan before searching for a run again
_RUN_PATTERNS: dict[int, list[bytes]] = {}  # (b1 << 16 | b2 << 8 | n) -> 16 patterns, by phase
_BYTES: Final = [bytes((b,)) for b in range(256)]
_HEADER_WORD: Final = np.dtype("V4")  # a header as raw bytes (no byte order, no alignment needed)
_STRUCT_GATHER_MAX: Final = 2  # up to this many datagrams, gather headers with struct instead
_HEADER_STRUCTS: dict[int, struct.Struct] = {}  # n -> the n headers of one datagram
# Per-datagram fast path: header signatures -> plans, per analyser, for the current PID roles.
# A plan: ((pid, counter before, last counter, packets) per PID, (pid, position) per PSI packet,
# null packets); _NO_PLAN for a datagram that needs the per-packet path.
_Plan = tuple[tuple[tuple[int, int, int, int], ...], tuple[tuple[int, int], ...], int]
_MAX_PLANS: Final = 4096
_NO_PLAN: Final[_Plan] = ((), (), -1)
# Memoised section handling (see _on_psi); tests switch it off to compare with the plain path.
MEMO_PSI = True
_UNPARSED: Final = object()

# Per-PID roles, a bit set in an 8192-entry table (style §7: lists, not dicts, per PID).
K_PSI: Final = 1  # PAT, CAT, NIT, SDT and PMT PIDs: reassemble sections
K_PES: Final = 2  # elementary streams of a PMT: PES starts carry the PTS
K_COLLECT: Final = 4  # the media analyser wants every packet of the PID

_CRC_CHECKED_PIDS: Final = frozenset({PAT_PID, CAT_PID, NIT_PID, SDT_PID})


class PesSink(Protocol):
    """What the media analyser offers the TR 101 290 analyser (it lives in ``core/media``)."""

    def on_programs(self, pmts: dict[int, Pmt]) -> None: ...

    def on_pes(self, pid: int, pusi: bool, data: bytes, pts: int | None, arrival: float) -> bool:
        """One packet's payload of an ES PID; answers whether it wants the PID's next packets."""
        ...


class _Watch:
    """One periodic item (a table, a PID, a clock): one error per gap longer than ``limit``."""

    __slots__ = ("flagged", "last", "limit")

    def __init__(self, last: float, limit: float) -> None:
        self.last = last
        self.limit = limit
        self.flagged = False

    def seen(self, now: float) -> bool:
        late = not self.flagged and now - self.last > self.limit
        self.last = now
        self.flagged = False
        return late

    def expired(self, now: float) -> bool:
        if self.flagged or now - self.last <= self.limit:
            return False
        self.flagged = True
        return True


class _PcrState:
    """One PCR PID's clock. The byte-rate estimate runs from ``ref`` to ``fit``, the latest PCR
    that was accurate, so one bad PCR does not bend the line the next ones are judged by."""

    __slots__ = ("bad_run", "fit_index", "fit_pcr", "last_index", "last_pcr", "ref_index", "ref_pcr", "watch")

    def __init__(self, pcr: int, index: int, arrival: float) -> None:
        self.last_pcr = pcr
        self.last_index = index
        self.watch = _Watch(arrival, PCR_REPETITION_S)
        self.rebase(pcr, index)

    def rebase(self, pcr: int, index: int) -> None:
        self.ref_pcr = self.fit_pcr = pcr
        self.ref_index = self.fit_index = index
        self.bad_run = 0


def _run_patterns(b1: int, b2: int, n: int) -> list[bytes]:
    """The header bytes of ``_RUN_CHUNK`` datagrams of ``n`` payload-only packets of one PID.

    Pattern ``c`` is the run whose first packet has continuity_counter ``c``: header k of the
    run is 0x47, b1, b2, 0x10 | (c + k) mod 16 (ISO/IEC 13818-1 §2.4.3.2: sync byte; no TEI,
    PUSI or priority; unscrambled, payload only; the counter steps by one per packet).
    """
    key = (b1 << 16) | (b2 << 8) | n
    pats = _RUN_PATTERNS.get(key)
    if pats is None:
        pats = []
        for c in range(16):
            head = bytearray()
            for k in range(_RUN_CHUNK * n):
                head += bytes((SYNC_BYTE, b1, b2, 0x10 | ((c + k) & 0x0F)))
            pats.append(bytes(head))
        if len(_RUN_PATTERNS) >= 64:  # a few PIDs per flow; bound the memo all the same
            _RUN_PATTERNS.clear()
        _RUN_PATTERNS[key] = pats
    return pats


def _header_struct(n: int) -> struct.Struct:
    st = _HEADER_STRUCTS[n] = struct.Struct("4s" + f"{TS_PACKET_SIZE - 4}x4s" * (n - 1))
    return st


class _PsiRepeat:
    """The last section-starting payload of a PSI PID that an idle assembler took whole.

    ``sections`` is what ``SectionAssembler.feed`` answered for ``payload`` (a pure function of
    the payload when nothing is pending); ``stable`` whether handling those sections last time
    left the tables as they were (``epoch`` is the tables' epoch after it).
    """

    __slots__ = ("asm", "epoch", "payload", "sections", "stable")

    def __init__(self, asm: SectionAssembler, payload: bytes, sections: list[bytes]) -> None:
        self.asm = asm
        self.payload = payload
        self.sections = sections
        self.stable = False
        self.epoch = -1


@dataclass(frozen=True, slots=True)
class ProgramsChanged:
    """A PAT or PMT brought a new program map (H3: an event for a rare thing)."""

    pmts: dict[int, Pmt]


class Tr101290Analyzer:
    """TR 101 290 priority 1 and 2 indicators for one flow's transport stream.

    Feed packets with ``feed_packets`` (one datagram), ``feed_strided`` (a batch in receive
    slots) or ``feed_array`` (numpy path), call ``check_timers`` after each feed, read
    ``counters(now)``. Counters are cumulative from the
    first packet; ``priority1_ok``/``priority2_ok`` are false while an error of that priority
    happened in the last ``window_s`` seconds.
    """

    def __init__(
        self,
        *,
        pid_timeout_s: float = 5.0,
        window_s: float = DEFAULT_WINDOW_S,
        tr07_mode: bool = False,
        sink: PesSink | None = None,
    ) -> None:
        self.pid_timeout_s = pid_timeout_s
        self.window_s = window_s
        self.tr07_mode = tr07_mode
        self._sink = sink
        # Counters: the interface's fields (Tr101290Stats), then our extra ones.
        self.ts_packets_analyzed = 0
        self.pat_count = 0
        self.pmt_count = 0
        self.sync_loss_count = 0
        self.sync_byte_errors = 0
        self.cc_errors = 0
        self.pat_errors = 0
        self.pmt_errors = 0
        self.pid_errors = 0
        self.tei_errors = 0
        self.crc_errors = 0
        self.pcr_repetition_errors = 0
        self.pcr_discontinuity_errors = 0
        self.pcr_accuracy_errors = 0
        self.pts_errors = 0
        self.cat_errors = 0
        self.truncated_packets = 0
        self.null_packets = 0
        self.last_p1_error = -1e18
        self.last_p2_error = -1e18
        # Sync state (1.1): presumed in sync, since datagram framing aligns the packets.
        self._in_sync = True
        self._bad_run = 0
        self._good_run = 0
        # Per-PID state. Continuity: cc | 0x10 when the last packet was a duplicate; -1 unseen.
        # The numpy arrays are authoritative; the Python path works in the dict overlay, which
        # is folded back before the next numpy batch (few PIDs, so a cheap switch).
        self._cc_state = np.full(PID_COUNT, -1, dtype=np.int16)
        self._cc_overlay: dict[int, int] = {}
        # An int64 array, not a list: the per-packet path counts in it at list speed, and
        # pid_packet_counts (5 times a second per flow) reads it with np.frombuffer, no copy (a
        # list of 8,192 ints took ~0.2 ms to convert: 5 % of a worker at 50 flows, issue 23).
        self._counts_py = array.array("q", bytes(8 * PID_COUNT))
        self._counts_np = np.zeros(PID_COUNT, dtype=np.int64)
        self._seen_at = [-1.0] * PID_COUNT  # last arrival per PID (PID_error), Python path
        self._seen_at_np = np.full(PID_COUNT, -1.0)
        self._plans: dict[bytes, _Plan] = {}  # per-datagram plans of feed_strided (see _apply_plan)
        self._kinds = [0] * PID_COUNT
        self._kinds_np = np.zeros(PID_COUNT, dtype=np.uint8)
        self._generation = 0  # bumped whenever _kinds changes (the numpy path re-masks)
        for pid in (PAT_PID, CAT_PID, NIT_PID, SDT_PID):
            self._set_kind(pid, K_PSI)
        self._assemblers: dict[int, SectionAssembler] = {}
        # Memos of the PSI handling (_on_psi, _on_section): a repeated table costs a compare.
        self._tables_epoch = 0  # bumped whenever the PAT/PMT/CAT state changes
        self._psi_repeat: dict[int, _PsiRepeat] = {}
        self._section_memo: dict[int, list[object]] = {}  # pid -> [section, crc ok, parsed]
        self._pat_applied: object = None  # the parsed PAT that made _pat_map, at _pat_epoch
        self._pat_epoch = -1
        # Tables and their watches.
        self._pat_watch: _Watch | None = None
        self._pat_map: dict[int, int] = {}  # program_number -> PMT PID
        self._pmt_watch: dict[int, _Watch] = {}  # PMT PID -> watch
        self._pmts: dict[int, Pmt] = {}  # program_number -> PMT
        self._pid_watch: dict[int, _Watch] = {}  # referenced ES/PCR PID -> watch (1.6)
        self._pts_watch: dict[int, _Watch] = {}
        self._pcr: dict[int, _PcrState] = {}
        self._pcr_pending_disc: set[int] = set()
        self._cat_seen = False
        self._events: deque[ProgramsChanged] = deque(maxlen=_MAX_EVENTS)
        self._es_pids: set[int] = set()
        self.first_pcr_pid: int | None = None
        self.pcr_samples: list[tuple[float, int]] = []  # (arrival, PCR) of first_pcr_pid, drained by the owner
        self.pcr_resets = 0  # bumped at a PCR discontinuity of first_pcr_pid
        # Datagrams feed_strided accounted by runs, by plans, and per packet (tests, bench).
        self.strided_paths = [0, 0, 0]
        self._run_mean = float(_RUN_CHUNK)  # running mean of the runs' lengths (datagrams)

    # ------------------------------------------------------------------ per-PID roles
    def _set_kind(self, pid: int, kinds: int) -> None:
        if self._kinds[pid] != kinds:
            self._kinds[pid] = kinds
            self._kinds_np[pid] = kinds
            self._generation += 1
            self._plans.clear()  # plans are made for the PID roles of their time

    def set_collect(self, pid: int, on: bool) -> None:
        k = self._kinds[pid]
        self._set_kind(pid, (k | K_COLLECT) if on else (k & ~K_COLLECT))

    @property
    def pmts(self) -> dict[int, Pmt]:
        return self._pmts

    # ------------------------------------------------------------------ Python path
    def feed_packets(self, buf: Buffer, count: int, arrival: float, index: int) -> None:
        """Analyse ``count`` whole packets at the start of ``buf``, all arrived at ``arrival``.

        ``index`` is the flow-wide number of the first packet (for the byte-rate clock).
        """
        kinds = self._kinds
        counts = self._counts_py
        seen_at = self._seen_at
        overlay = self._cc_overlay
        cc_state = self._cc_state
        if 1 < count <= _RUN_MAX and self._in_sync and not self._bad_run:
            # Fast path: a datagram of one PID whose packets carry payload only, in counter
            # order, continuing the PID's last counter. Most datagrams of a video flow are this;
            # four C-level byte slices then stand for the per-packet loop (same counters).
            raw = bytes(buf[: count * TS_PACKET_SIZE])
            h1 = raw[1]
            h2 = raw[2]
            c0 = raw[3] & 0x0F
            pid = ((h1 & 0x1F) << 8) | h2
            if (
                not h1 & 0xC0  # no TEI, no PUSI
                and raw[0::TS_PACKET_SIZE] == _SYNC_RUN[:count]
                and raw[1::TS_PACKET_SIZE] == _UNIFORM[h1][:count]
                and raw[2::TS_PACKET_SIZE] == _UNIFORM[h2][:count]
                and not kinds[pid] & (K_PSI | K_COLLECT)
            ):
                if pid == NULL_PID:
                    counts[pid] += count
                    self.ts_packets_analyzed += count
                    return
                prev = overlay.get(pid)
                if prev is None:
                    prev = int(cc_state[pid])
                if (prev < 0 or c0 == ((prev & 0x0F) + 1) & 0x0F) and raw[3::TS_PACKET_SIZE] == _CC_RUN[
                    c0 : c0 + count
                ]:
                    counts[pid] += count
                    seen_at[pid] = arrival
                    overlay[pid] = (c0 + count - 1) & 0x0F
                    self.ts_packets_analyzed += count
                    return
        self._feed_loop(buf, 0, count, arrival, index)

    def _feed_loop(self, buf: Buffer, base: int, count: int, arrival: float, index: int) -> None:
        """The per-packet path: ``count`` packets from ``buf[base]``, all arrived at ``arrival``."""
        kinds = self._kinds
        counts = self._counts_py
        seen_at = self._seen_at
        overlay = self._cc_overlay
        cc_state = self._cc_state
        self.ts_packets_analyzed += count
        off = base
        for i in range(count):
            if buf[off] != SYNC_BYTE:
                self._bad_sync(arrival)
                off += TS_PACKET_SIZE
                continue
            if self._bad_run or not self._in_sync:
                self._good_sync()
            b1 = buf[off + 1]
            pid = ((b1 & 0x1F) << 8) | buf[off + 2]
            b3 = buf[off + 3]
            counts[pid] += 1
            if b1 & 0x80:  # §5.2.2 2.1 Transport_error: TEI set
                self.tei_errors += 1
                self.last_p2_error = arrival
            if pid == NULL_PID:  # null packets carry no continuity (ISO/IEC 13818-1 §2.4.3.3)
                off += TS_PACKET_SIZE
                continue
            seen_at[pid] = arrival
            disc = bool(b3 & 0x20 and buf[off + 4] and buf[off + 5] & 0x80)
            prev = overlay.get(pid)
            if prev is None:
                prev = int(cc_state[pid])
            cc = b3 & 0x0F
            cc_err = False
            dup = False
            if prev >= 0:
                # §5.2.1 1.4 Continuity_count_error: the counter steps by one per packet with
                # payload; one repeat is a legal duplicate (ISO/IEC 13818-1 §2.4.3.3), a third
                # copy is an error; a set discontinuity_indicator excuses any jump.
                pay = (b3 >> 4) & 1
                prev_cc = prev & 0x0F
                dup = bool(pay) and cc == prev_cc
                if dup:
                    cc_err = not disc and bool(prev & 0x10)
                else:
                    cc_err = not disc and cc != (prev_cc + pay) & 0x0F
                if cc_err:
                    self.cc_errors += 1
                    self.last_p1_error = arrival
            overlay[pid] = cc | 0x10 if dup else cc
            k = kinds[pid]
            if not dup and (
                (k and (k & (K_PSI | K_COLLECT) or b1 & 0x40))
                or (b3 & 0x20 and buf[off + 4] and buf[off + 5] & 0x90)
                or (b3 & 0xC0 and not self._cat_seen)
            ):
                self._special(buf, off, pid, arrival, index + i, cc_err, disc)
                kinds = self._kinds
            off += TS_PACKET_SIZE

    # ------------------------------------------------------------------ batch path
    @staticmethod
    def strided_headers(buf: Buffer, offset: int, stride: int, count: int, n: int) -> bytes:
        """The 4-byte headers of ``n`` packets in each of ``count`` datagrams laid out at
        ``buf[offset + k * stride]``, datagram after datagram, in one copy (no view kept)."""
        if count <= _STRUCT_GATHER_MAX:
            # A few datagrams: one struct unpack per datagram is cheaper than numpy's set-up.
            st = _HEADER_STRUCTS.get(n) or _header_struct(n)
            return b"".join([h for k in range(count) for h in st.unpack_from(buf, offset + k * stride)])
        hdr = np.ndarray((count, n), dtype=_HEADER_WORD, buffer=buf, offset=offset, strides=(stride, TS_PACKET_SIZE))
        heads = hdr.tobytes()
        del hdr  # numpy's view of the caller's buffer goes at once
        return heads

    def feed_strided(
        self,
        buf: Buffer,
        offset: int,
        stride: int,
        n: int,
        arrivals: Sequence[float],
        start: int,
        stop: int,
        index: int,
        heads: bytes | None = None,
    ) -> int:
        """Analyse datagrams ``start``..``stop - 1`` of a batch laid out at a fixed stride.

        Datagram k holds ``n`` whole packets at ``buf[offset + k * stride]`` and arrived at
        ``arrivals[k]``; ``index`` is the flow-wide number of the first packet of datagram
        ``start``; ``heads``, when given, is ``strided_headers`` of the batch from datagram 0.
        The counters are those of ``feed_packets`` on each datagram in turn. Answers the
        number of the datagram after the last one analysed: ``stop``, or less right after a
        datagram that left PCR samples (the owner drains them per datagram). Keeps no view.

        How: with the batch's headers gathered in one strided copy, datagram after datagram,
        a run of datagrams whose packets are all payload-only packets of one PID continuing
        its counter is found by a few compares with ``_run_patterns`` and accounted with a
        few additions; a datagram that breaks the run takes a cached per-datagram plan
        (``_apply_plan``: several PIDs, null packets, repeated PSI) or the per-packet path.
        Stream order is kept: runs and datagrams are handled in turn, and every datagram that
        can move state beyond counts and counters (PSI, PCR, PES starts, errors) takes the same
        code as ``feed_packets``.
        """
        if stop <= start or n <= 0:
            return stop
        if heads is None:
            heads = self.strided_headers(buf, offset + start * stride, stride, stop - start, n)
            first = start  # heads starts at datagram ``first``
        else:
            first = 0
        w = 4 * n
        kinds = self._kinds
        counts = self._counts_py
        seen_at = self._seen_at
        overlay = self._cc_overlay
        cc_state = self._cc_state
        k = start
        plans_first = 0  # datagrams to take by plan without trying a run (a mixed stream)
        while k < stop:
            p = w * (k - first)
            if plans_first:
                plans_first -= 1
            elif self._in_sync and not self._bad_run:
                b1 = heads[p + 1]
                b3 = heads[p + 3]
                # A run candidate: sync byte, no TEI/PUSI, unscrambled payload only (§2.4.3.2).
                if heads[p] == SYNC_BYTE and not b1 & 0xC0 and b3 & 0xF0 == 0x10:
                    b2 = heads[p + 2]
                    pid = ((b1 & 0x1F) << 8) | b2
                    if pid != NULL_PID and not kinds[pid] & (K_PSI | K_COLLECT):
                        prev = overlay.get(pid)
                        if prev is None:
                            prev = int(cc_state[pid])
                        # §5.2.1 1.4: the run must continue the PID's counter (a PID's first
                        # packet is not checked, so then the run starts at its own counter).
                        c = (b3 if prev < 0 else prev + 1) & 0x0F
                        pats = _RUN_PATTERNS.get((b1 << 16) | (b2 << 8) | n)
                        pat = (pats or _run_patterns(b1, b2, n))[c]
                        # The rest of the batch, in chunks of _RUN_CHUNK datagrams, against the
                        # pattern: a C-level compare each. Where a chunk breaks, the run lasts at
                        # most while every header has the PID's two bytes (two strided slices
                        # and lstrip bound it); the pattern confirms that, or a bisection finds
                        # where the sync byte, flags or counters break it first.
                        j = k
                        q = p  # heads position of datagram j
                        while j < stop:
                            e = min(stop, j + _RUN_CHUNK)
                            if heads.startswith(pat[: w * (e - j)], q):
                                q += w * (e - j)
                                j = e
                                continue
                            end = w * (e - first)
                            x1 = heads[q + 1 : end : 4]
                            x2 = heads[q + 2 : end : 4]
                            same = min(len(x1) - len(x1.lstrip(_BYTES[b1])), len(x2) - len(x2.lstrip(_BYTES[b2])))
                            hi = same // n
                            if hi and heads.startswith(pat[: w * hi], q):
                                j += hi
                                break
                            lo = 0
                            while hi - lo > 1:
                                mid = (lo + hi) >> 1
                                if heads.startswith(pat[: w * mid], q):
                                    lo = mid
                                else:
                                    hi = mid
                            j += lo
                            break
                        if j < stop:
                            # Runs that end short: video interleaved with audio or null packets.
                            # A plan per datagram is cheaper there than run searches; try again
                            # after a while (the mean follows the stream).
                            self._run_mean += (j - k - self._run_mean) * 0.25
                            if self._run_mean < _SHORT_RUN:
                                plans_first = _PLAN_SPELL
                        if j > k:
                            run = n * (j - k)
                            counts[pid] += run
                            # The per-packet path leaves the arrival of the PID's last packet,
                            # in the run's last datagram: the same value, so PID_error (1.6)
                            # timing is unchanged (the owner runs check_timers between calls).
                            seen_at[pid] = arrivals[j - 1]
                            overlay[pid] = (c + run - 1) & 0x0F
                            self.ts_packets_analyzed += run
                            self.strided_paths[0] += j - k
                            k = j
                            continue
            # Datagram k breaks the run: its plan, or the per-packet path.
            off = offset + k * stride
            arrival = arrivals[k]
            if self._in_sync and not self._bad_run and self._apply_plan(heads[p : p + w], buf, off, n, arrival):
                self.strided_paths[1] += 1
            else:
                self.strided_paths[2] += 1
                self._feed_loop(buf, off, n, arrival, index + (k - start) * n)
                kinds = self._kinds
                if self.pcr_samples:
                    return k + 1
            k += 1
        return stop

    def _apply_plan(self, sig: bytes, buf: Buffer, off: int, n: int, arrival: float) -> bool:
        """Account one datagram by the plan of its header signature; False when it has none.

        The caller checks that the analyser is in sync (§5.2.1 1.1: no sync state to move).
        A plan exists for a datagram whose packets all have a good sync byte and no TEI, and
        are null packets, payload-only packets of PIDs in counter order within the datagram,
        or section-starting packets of PSI PIDs. It applies when each PID continues its
        counter (§5.2.1 1.4) and each PSI packet repeats a payload that left the tables as
        they are (``_PsiRepeat``): then the PID roles cannot change within the datagram, and
        per-PID counts, counters and last-seen times may be updated in any order.
        """
        plan = self._plans.get(sig)
        if plan is None:
            plan = self._build_plan(sig, n)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[sig] = plan
        groups, psi, nulls = plan
        if nulls < 0:  # _NO_PLAN
            return False
        overlay = self._cc_overlay
        for pid, want, _last, _m in groups:
            prev = overlay.get(pid)
            if prev is None:
                prev = int(self._cc_state[pid])
            if prev >= 0 and prev & 0x0F != want:
                return False
        if psi:
            repeats: list[_PsiRepeat] = []
            for pid, pos in psi:
                rep = self._psi_repeat.get(pid)
                if rep is None or not rep.stable or rep.epoch != self._tables_epoch or rep.asm.busy:
                    return False
                start = off + pos * TS_PACKET_SIZE + 4
                if isinstance(buf, memoryview):
                    if rep.payload != buf[start : start + TS_PACKET_SIZE - 4]:
                        return False
                elif not buf.startswith(rep.payload, start):  # 184 bytes compared in place
                    return False
                repeats.append(rep)
        counts = self._counts_py
        seen_at = self._seen_at
        for pid, _want, last, m in groups:
            counts[pid] += m
            seen_at[pid] = arrival
            overlay[pid] = last
        if nulls:
            counts[NULL_PID] += nulls
        self.ts_packets_analyzed += n
        if psi:
            for (pid, _pos), rep in zip(psi, repeats, strict=True):
                for section in rep.sections:
                    self._on_section(pid, section, arrival)
        return True

    def _build_plan(self, sig: bytes, n: int) -> _Plan:
        """The plan of a header signature (n headers of 4 bytes) for the current PID roles:
        ``(groups, psi, nulls)`` with groups ``(pid, counter before, last counter, packets)``
        in order of appearance and psi ``(pid, position)``; ``_NO_PLAN`` when the datagram needs
        the per-packet path (mirrors the conditions of ``_feed_loop``)."""
        kinds = self._kinds
        groups: dict[int, list[int]] = {}
        psi: list[tuple[int, int]] = []
        nulls = 0
        for i in range(n):
            b0, b1, b2, b3 = sig[4 * i : 4 * i + 4]
            if b0 != SYNC_BYTE or b1 & 0x80:
                return _NO_PLAN  # sync byte or transport error: the per-packet path counts it
            pid = ((b1 & 0x1F) << 8) | b2
            if pid == NULL_PID:
                nulls += 1  # counted only (ISO/IEC 13818-1 §2.4.3.3)
                continue
            if b3 & 0xF0 != 0x10:
                return _NO_PLAN  # adaptation field, no payload or scrambled
            k = kinds[pid]
            if k & K_COLLECT:
                return _NO_PLAN
            if k & K_PSI:
                if not b1 & 0x40:
                    return _NO_PLAN  # a section continued from an earlier packet
                psi.append((pid, i))
            elif k and b1 & 0x40:
                return _NO_PLAN  # a PES start: PTS and the media analyser
            cc = b3 & 0x0F
            g = groups.get(pid)
            if g is None:
                groups[pid] = [(cc - 1) & 0x0F, cc, 1]
            elif cc == (g[1] + 1) & 0x0F:
                g[1] = cc
                g[2] += 1
            else:
                return _NO_PLAN  # a counter error or duplicate within the datagram
        return (
            tuple((pid, want, last, m) for pid, (want, last, m) in groups.items()),
            tuple(psi),
            nulls,
        )

    def _bad_sync(self, arrival: float) -> None:
        # §5.2.1 1.2 Sync_byte_error: counted per packet; the packet is not analysed further,
        # since its header cannot be trusted (the datagram is kept).
        self.sync_byte_errors += 1
        self.last_p1_error = arrival
        self._good_run = 0
        self._bad_run += 1
        if self._in_sync and self._bad_run >= SYNC_LOST_AFTER:
            # §5.2.1 1.1 TS_sync_loss: an isolated bad byte is not a loss of sync.
            self._in_sync = False
            self.sync_loss_count += 1

    def _good_sync(self) -> None:
        self._bad_run = 0
        if not self._in_sync:
            self._good_run += 1
            if self._good_run >= SYNC_ACQUIRED_AFTER:
                self._in_sync = True
                self._good_run = 0

    # ------------------------------------------------------------------ numpy path
    def feed_array(self, packets: npt.NDArray[np.uint8], arrivals: npt.NDArray[np.float64], index: int) -> None:
        """Analyse a batch: ``packets`` is a C-contiguous ``(n, 188)`` uint8 array, ``arrivals``
        the n arrival times.

        ``index`` is the flow-wide number of the first packet. Same counters as
        ``feed_packets`` over the same packets.
        """
        n = packets.shape[0]
        if n == 0:
            return
        self._fold_overlay()
        self.ts_packets_analyzed += n
        # 188 = 47 x 4: the packets are rows of 47 big-endian words; word 0 is the header,
        # word 1 starts the adaptation field (length, flags).
        words = packets.view(">u4")
        head = words[:, 0].astype(np.uint32)
        sync_ok = (head >> 24) == SYNC_BYTE
        rows_idx: npt.NDArray[np.intp] | None = None
        if int(np.count_nonzero(sync_ok)) != n:
            for i, ok in enumerate(sync_ok.tolist()):
                if ok:
                    if self._bad_run or not self._in_sync:
                        self._good_sync()
                else:
                    self._bad_sync(float(arrivals[i]))
            rows_idx = np.flatnonzero(sync_ok)
            if rows_idx.size == 0:
                return
            rows = packets[rows_idx]
            head = head[rows_idx]
            af_word = words[rows_idx, 1].astype(np.uint32)
            times = arrivals[rows_idx]
        else:
            if self._bad_run or not self._in_sync:
                if not self._in_sync:
                    self._good_run += n
                    if self._good_run >= SYNC_ACQUIRED_AFTER:
                        self._in_sync = True
                        self._good_run = 0
                self._bad_run = 0
            rows = packets
            af_word = words[:, 1].astype(np.uint32)
            times = arrivals
        m = head.size
        pid = np.bitwise_and(np.right_shift(head, np.uint32(8)), np.uint32(0x1FFF))
        n_tei = int(np.count_nonzero(head & 0x800000))
        if n_tei:  # §5.2.2 2.1 Transport_error
            self.tei_errors += n_tei
            self.last_p2_error = max(self.last_p2_error, float(times[np.flatnonzero(head & 0x800000)[-1]]))
        # The adaptation field's flags byte, 0 when there is no (or an empty) field.
        af_flags = np.where((head & 0x20 != 0) & (af_word >= 0x01000000), (af_word >> 16) & 0xFF, 0)
        any_af = bool(af_flags.any())
        # Continuity (§5.2.1 1.4), grouped by PID in stream order: a stable sort keeps each
        # PID's packets in arrival order, and each packet is compared with its predecessor.
        order = np.argsort(pid, kind="stable")
        sp = pid[order]
        first = np.empty(m, dtype=bool)
        first[0] = True
        np.not_equal(sp[1:], sp[:-1], out=first[1:])
        first_idx = np.flatnonzero(first)
        group_pids = sp[first_idx]
        sizes = np.diff(np.append(first_idx, m))
        self._counts_np[group_pids] += sizes
        last_idx = np.append(first_idx[1:], m) - 1
        shead = head[order]
        scc = (shead & 0x0F).astype(np.int16)
        spay = ((shead >> 4) & 1).astype(np.int16)
        prev_state = np.empty(m, dtype=np.int16)
        prev_state[1:] = scc[:-1]
        prev_state[first_idx] = self._cc_state[group_pids]
        prev_cc = prev_state & 0x0F
        # Null packets are never checked (ISO/IEC 13818-1 §2.4.3.3), nor a PID's first packet.
        checked = (prev_state >= 0) & (sp != NULL_PID)
        same = scc == prev_cc
        is_dup = checked & (spay == 1) & same
        jump = scc != ((prev_cc + spay) & 0x0F)
        suspect = checked & (jump | is_dup)
        dup_rows: npt.NDArray[np.bool_] | None = None
        cc_err_rows: npt.NDArray[np.bool_] | None = None
        state_dup = np.zeros(first_idx.size, dtype=np.int16)
        if suspect.any():
            prev_dup = np.empty(m, dtype=bool)
            prev_dup[1:] = is_dup[:-1]
            prev_dup[first_idx] = (prev_state[first_idx] & 0x10) != 0
            if any_af:
                sdisc = (af_flags[order] & 0x80) != 0
                suspect &= ~sdisc
            err = suspect & np.where(is_dup, prev_dup, jump)
            n_err = int(np.count_nonzero(err))
            if n_err:
                self.cc_errors += n_err
                err_rows = order[err]
                self.last_p1_error = max(self.last_p1_error, float(times[err_rows].max()))
                cc_err_rows = np.zeros(m, dtype=bool)
                cc_err_rows[err_rows] = True
            if is_dup.any():
                dup_rows = np.zeros(m, dtype=bool)
                dup_rows[order[is_dup]] = True
                state_dup = np.where(is_dup[last_idx], 0x10, 0).astype(np.int16)
        self._cc_state[group_pids] = np.where(group_pids == NULL_PID, -1, scc[last_idx] | state_dup)
        self._seen_at_np[group_pids] = times[order[last_idx]]
        # Rare packets, handled in Python in stream order.
        gen = self._generation
        special = self._special_mask(pid, head, af_flags, dup_rows, any_af)
        cand = np.flatnonzero(special)
        pos = 0
        while pos < cand.size:
            r = int(cand[pos])
            pos += 1
            idx = index + (int(rows_idx[r]) if rows_idx is not None else r)
            self._special(
                rows[r].tobytes(),
                0,
                int(pid[r]),
                float(times[r]),
                idx,
                cc_err_rows is not None and bool(cc_err_rows[r]),
                bool(af_flags[r] & 0x80),
            )
            if self._generation != gen:
                # A PMT or the media analyser changed the roles of PIDs mid-batch: re-mask the
                # rest of the batch so that both paths see the same packets.
                gen = self._generation
                rest = self._special_mask(
                    pid[r + 1 :],
                    head[r + 1 :],
                    af_flags[r + 1 :],
                    None if dup_rows is None else dup_rows[r + 1 :],
                    any_af,
                )
                cand = np.flatnonzero(rest) + (r + 1)
                pos = 0

    def _special_mask(
        self,
        pid: npt.NDArray[np.uint32],
        head: npt.NDArray[np.uint32],
        af_flags: npt.NDArray[np.uint32],
        dup_rows: npt.NDArray[np.bool_] | None,
        any_af: bool,
    ) -> npt.NDArray[np.bool_]:
        k = self._kinds_np[pid]
        mask: npt.NDArray[np.bool_] = (k & (K_PSI | K_COLLECT) != 0) | ((k & K_PES != 0) & (head & 0x400000 != 0))
        if any_af:
            mask |= af_flags & 0x90 != 0
        if not self._cat_seen:
            mask |= (head & 0xC0 != 0) & (pid != NULL_PID)
        if dup_rows is not None:
            mask &= ~dup_rows
        return mask

    def _fold_overlay(self) -> None:
        overlay = self._cc_overlay
        if overlay:
            for pid, state in overlay.items():
                self._cc_state[pid] = state
            overlay.clear()
        # Fold the Python path's last-seen times too (max: both are monotonic per flow).
        # Only the watched PIDs matter, so do just those.
        for pid in self._pid_watch:
            t = self._seen_at[pid]
            if t > self._seen_at_np[pid]:
                self._seen_at_np[pid] = t

    # ------------------------------------------------------------------ rare packets
    def _special(self, buf: Buffer, off: int, pid: int, arrival: float, index: int, cc_err: bool, disc: bool) -> None:
        b1 = buf[off + 1]
        b3 = buf[off + 3]
        scrambled = b3 & 0xC0
        if scrambled and not self._cat_seen and pid != NULL_PID:
            # §5.2.2 2.6 CAT_error: scrambled packets while no CAT has been received.
            self.cat_errors += 1
            self.last_p2_error = arrival
        if b3 & 0x20 and buf[off + 4] and buf[off + 5] & 0x90:
            self._on_adaptation(buf, off, pid, arrival, index, disc)
        k = self._kinds[pid]
        if k & K_PSI:
            self._on_psi(buf, off, pid, b1, scrambled, arrival, cc_err)
        elif k & (K_PES | K_COLLECT) and not scrambled:
            start = payload_offset(buf, off)
            if start is None:
                return
            end = off + TS_PACKET_SIZE
            pusi = bool(b1 & 0x40)
            pts = None
            if pusi:
                pts = pes_pts(buf, start, end)
                if pts is not None:
                    watch = self._pts_watch.get(pid)
                    if watch is None:
                        self._pts_watch[pid] = _Watch(arrival, PTS_INTERVAL_S)
                    elif watch.seen(arrival):
                        self._pts_error(arrival)
            if self._sink is not None and (pusi or k & K_COLLECT):
                want = self._sink.on_pes(pid, pusi, bytes(buf[start:end]), pts, arrival)
                if bool(k & K_COLLECT) != want:
                    self.set_collect(pid, want)

    def _pts_error(self, arrival: float) -> None:
        # §5.2.2 2.5 PTS_error: PTS repetition period more than 700 ms.
        self.pts_errors += 1
        self.last_p2_error = arrival

    def _on_adaptation(self, buf: Buffer, off: int, pid: int, arrival: float, index: int, disc: bool) -> None:
        pcr = packet_pcr(buf, off)
        if pcr is None:
            if disc:
                self._pcr_pending_disc.add(pid)
            return
        if pid in self._pcr_pending_disc:
            self._pcr_pending_disc.discard(pid)
            disc = True
        st = self._pcr.get(pid)
        if st is None:
            self._pcr[pid] = _PcrState(pcr, index, arrival)
            if self.first_pcr_pid is None:
                self.first_pcr_pid = pid
            if pid == self.first_pcr_pid:
                self.pcr_samples.append((arrival, pcr))
            return
        # §5.2.2 2.3a PCR_repetition_error: PCRs more than 100 ms apart (arrival time).
        if st.watch.seen(arrival):
            self.pcr_repetition_errors += 1
            self.last_p2_error = arrival
        delta = (pcr - st.last_pcr) % PCR_WRAP
        if disc:
            # ISO/IEC 13818-1 §2.4.3.5: a new time base; no error, start the rate over.
            st.rebase(pcr, index)
            if pid == self.first_pcr_pid:
                self.pcr_resets += 1
        elif delta > PCR_DISCONTINUITY_TICKS:  # also catches a step backwards (mod 2**33 x 300)
            # §5.2.2 2.3b PCR_discontinuity_indicator_error.
            self.pcr_discontinuity_errors += 1
            self.last_p2_error = arrival
            st.rebase(pcr, index)
            if pid == self.first_pcr_pid:
                self.pcr_resets += 1
        else:
            span = st.fit_index - st.ref_index
            if span < _PCR_ACCURACY_MIN_SPAN:
                st.fit_pcr = pcr
                st.fit_index = index
            elif index > st.fit_index and (self._counts_py[NULL_PID] or self._counts_np[NULL_PID]):
                # Only a constant-rate multiplex (one that stuffs with null packets, ISO/IEC
                # 13818-1 §2.4.2.2) has a byte clock to judge against: in a VBR TS (FFmpeg's
                # default, RTMP/RTSP ingest) each PCR pair defines the rate between them.
                # §5.2.2 2.4 PCR_accuracy_error: the PCR against the stream's own clock, i.e.
                # the byte rate measured between earlier PCRs of this PID (ISO/IEC 13818-1
                # §2.4.2.2: the transport rate between PCRs), extrapolated to this packet.
                ticks_per_packet = ((st.fit_pcr - st.ref_pcr) % PCR_WRAP) / span
                expected = st.ref_pcr + (index - st.ref_index) * ticks_per_packet
                error = ((pcr - expected + PCR_WRAP / 2) % PCR_WRAP) - PCR_WRAP / 2
                if abs(error) > PCR_ACCURACY_TICKS:
                    self.pcr_accuracy_errors += 1
                    self.last_p2_error = arrival
                    st.bad_run += 1
                    if st.bad_run >= _PCR_REBASE_AFTER:
                        st.rebase(pcr, index)  # the rate itself changed: learn it again
                else:
                    st.bad_run = 0
                    st.fit_pcr = pcr
                    st.fit_index = index
        st.last_pcr = pcr
        st.last_index = index
        if pid == self.first_pcr_pid:
            self.pcr_samples.append((arrival, pcr))

    def _on_psi(self, buf: Buffer, off: int, pid: int, b1: int, scrambled: int, arrival: float, cc_err: bool) -> None:
        if scrambled:
            # §5.2.1 1.3 / 1.5: PAT and PMT packets must not be scrambled.
            if pid == PAT_PID:
                self._pat_error(arrival)
            elif pid in self._pmt_watch:
                self._pmt_error(arrival)
            return
        start = payload_offset(buf, off)
        if start is None:
            return
        asm = self._assemblers.get(pid)
        if asm is None:
            asm = self._assemblers[pid] = SectionAssembler()
        if cc_err:
            asm.reset()
        if not (b1 & 0x40 and not asm.busy and MEMO_PSI):
            for section in asm.feed(buf[start : off + TS_PACKET_SIZE], bool(b1 & 0x40)):
                self._on_section(pid, section, arrival)
            return
        # A section starts here and nothing is pending: what the assembler answers is a pure
        # function of the payload, so a payload repeated from the last time (tables repeat
        # every 100 ms or so, ISO/IEC 13818-1 §2.4.4; TR 101 290 1.3/1.5) skips reassembly.
        payload = bytes(buf[start : off + TS_PACKET_SIZE])
        rep = self._psi_repeat.get(pid)
        if rep is None or rep.payload != payload:
            malformed = asm.malformed
            sections = asm.feed(payload, True)
            if asm.busy or asm.malformed != malformed:
                self._psi_repeat.pop(pid, None)
                for section in sections:
                    self._on_section(pid, section, arrival)
                return
            rep = self._psi_repeat[pid] = _PsiRepeat(asm, payload, sections)
        epoch = self._tables_epoch
        for section in rep.sections:
            self._on_section(pid, section, arrival)
        rep.stable = self._tables_epoch == epoch
        rep.epoch = self._tables_epoch

    def _on_section(self, pid: int, section: bytes, arrival: float) -> None:
        table_id = section[0]
        if table_id == 0xFF:
            return
        memo = self._section_memo.get(pid)  # [section, CRC ok or None, parsed or _UNPARSED]
        if memo is None or (memo[0] is not section and memo[0] != section) or not MEMO_PSI:
            # CRC and parse are pure functions of the bytes: a repeated section reuses them.
            memo = self._section_memo[pid] = [section, None, _UNPARSED]
        # §5.2.2 2.2 CRC_error: long-form sections of the PAT, CAT, PMT, NIT and SDT/BAT.
        if len(section) >= 3 and section[1] & 0x80 and (pid in _CRC_CHECKED_PIDS or pid in self._pmt_watch):
            crc_ok = memo[1]
            if crc_ok is None:
                crc_ok = memo[1] = len(section) >= 8 and section_crc_ok(section)
            if not crc_ok:
                self.crc_errors += 1
                self.last_p2_error = arrival
                return
        if pid == PAT_PID:
            if table_id != TABLE_PAT:
                # §5.2.1 1.3: a section other than table_id 0x00 on PID 0.
                self._pat_error(arrival)
                return
            pat = memo[2]
            if pat is _UNPARSED:
                pat = memo[2] = parse_pat(section)
            if not isinstance(pat, list):
                self._pat_error(arrival)
                return
            self.pat_count += 1
            if self._pat_watch is None:
                self._pat_watch = _Watch(arrival, PAT_INTERVAL_S)
            elif self._pat_watch.seen(arrival):
                self._pat_error(arrival)
            if pat is not self._pat_applied or self._pat_epoch != self._tables_epoch:
                # (The same parsed PAT at the same epoch made the current map: nothing to do.)
                self._apply_pat(pat, arrival)
                self._pat_applied = pat
                self._pat_epoch = self._tables_epoch
        elif pid == CAT_PID:
            if table_id == TABLE_CAT:
                if not self._cat_seen:
                    self._cat_seen = True
                    self._generation += 1
                    self._tables_epoch += 1
            else:
                # §5.2.2 2.6 CAT_error: a section other than table_id 0x01 on PID 1.
                self.cat_errors += 1
                self.last_p2_error = arrival
        elif pid in self._pmt_watch and table_id == TABLE_PMT:
            pmt = memo[2]
            if pmt is _UNPARSED:
                pmt = memo[2] = parse_pmt(section)
            if not isinstance(pmt, Pmt):
                self._pmt_error(arrival)
                return
            self.pmt_count += 1
            if self._pmt_watch[pid].seen(arrival):
                self._pmt_error(arrival)
            old = self._pmts.get(pmt.program_number)
            if old is not pmt and old != pmt and self._pat_map.get(pmt.program_number) == pid:
                self._pmts[pmt.program_number] = pmt
                self._apply_pmts(arrival)

    def _pat_error(self, arrival: float) -> None:
        self.pat_errors += 1
        self.last_p1_error = arrival

    def _pmt_error(self, arrival: float) -> None:
        self.pmt_errors += 1
        self.last_p1_error = arrival

    def _apply_pat(self, pat: list[tuple[int, int]], arrival: float) -> None:
        new_map = {prog: pid for prog, pid in pat if prog != 0 and pid != NULL_PID}
        if new_map == self._pat_map:
            return
        self._tables_epoch += 1
        self._pat_map = new_map
        pmt_pids = set(new_map.values())
        for pid in list(self._pmt_watch):
            if pid not in pmt_pids:
                del self._pmt_watch[pid]
                if pid not in (PAT_PID, CAT_PID, NIT_PID, SDT_PID):
                    self._set_kind(pid, self._kinds[pid] & ~K_PSI)
        for pid in pmt_pids:
            if pid not in self._pmt_watch:
                self._pmt_watch[pid] = _Watch(arrival, PMT_INTERVAL_S)
                self._set_kind(pid, K_PSI)
        for prog in list(self._pmts):
            if prog not in new_map:
                del self._pmts[prog]
        self._apply_pmts(arrival)

    def _apply_pmts(self, arrival: float) -> None:
        self._tables_epoch += 1
        es_pids: set[int] = set()
        referenced: set[int] = set()
        for pmt in self._pmts.values():
            for es in pmt.streams:
                es_pids.add(es.pid)
                referenced.add(es.pid)
            if pmt.pcr_pid != NULL_PID:
                referenced.add(pmt.pcr_pid)
        for pid in list(self._pid_watch):
            if pid not in referenced:
                del self._pid_watch[pid]
        for pid in referenced:
            if pid not in self._pid_watch:
                # §5.2.1 1.6 PID_error: the clock for a referenced PID starts when the PMT
                # first names it.
                self._pid_watch[pid] = _Watch(arrival, self.pid_timeout_s)
        for pid in self._es_pids - es_pids:
            self._set_kind(pid, self._kinds[pid] & ~(K_PES | K_COLLECT))
        for pid in es_pids:
            if not self._kinds[pid] & K_PSI:
                self._set_kind(pid, self._kinds[pid] | K_PES)
        self._es_pids = es_pids
        self._events.append(ProgramsChanged(dict(self._pmts)))
        if self._sink is not None:
            self._sink.on_programs(dict(self._pmts))

    def pop_events(self) -> list[ProgramsChanged]:
        """The events since the last call (at most the last 16 are kept)."""
        out = list(self._events)
        self._events.clear()
        return out

    # ------------------------------------------------------------------ timers and reading
    def check_timers(self, now: float) -> None:
        """Count the interval errors whose gap is already longer than its limit at ``now``."""
        if self._pat_watch is None:
            self._pat_watch = _Watch(now, PAT_INTERVAL_S)  # the flow's first packet starts the clock
        elif self._pat_watch.expired(now):
            self._pat_error(now)
        for watch in self._pmt_watch.values():
            if watch.expired(now):
                self._pmt_error(now)
        if self._pid_watch:
            seen_py = self._seen_at
            seen_np = self._seen_at_np
            for pid, watch in self._pid_watch.items():
                t = max(seen_py[pid], float(seen_np[pid]))
                if t > watch.last:
                    if watch.seen(t):
                        self.pid_errors += 1
                        self.last_p1_error = t
                elif watch.expired(now):
                    self.pid_errors += 1
                    self.last_p1_error = now
        for pcr_pid in {pmt.pcr_pid for pmt in self._pmts.values()}:
            st = self._pcr.get(pcr_pid)
            if st is not None and st.watch.expired(now):
                self.pcr_repetition_errors += 1
                self.last_p2_error = now
        for watch in self._pts_watch.values():
            if watch.expired(now):
                self._pts_error(now)

    def pid_packet_counts(self) -> npt.NDArray[np.int64]:
        """Packets seen per PID (cumulative), as a fresh array."""
        return self._counts_np + np.frombuffer(self._counts_py, dtype=np.int64)

    def jpeg_xs_pid(self) -> int | None:
        for prog in sorted(self._pmts):
            for es in self._pmts[prog].streams:
                if es.stream_type == STREAM_TYPE_JPEG_XS:
                    return es.pid
        return None

    def counters(self, now: float) -> dict[str, object]:
        """The Tr101290Stats fields (and our extra counters) as plain values."""
        section_errors = sum(a.malformed for a in self._assemblers.values())
        p1_ok = now - self.last_p1_error > self.window_s
        p2_ok = now - self.last_p2_error > self.window_s
        jxs = self.jpeg_xs_pid()
        # VSF TR-07 §6 (JPEG XS in MPEG-2 TS): one program carrying a JPEG XS elementary stream
        # (stream_type 0x32) described by its JPEG XS video descriptor, with a PCR, and a
        # transport free of priority-1 errors.
        tr07 = False
        if jxs is not None and len(self._pmts) == 1:
            pmt = next(iter(self._pmts.values()))
            es = next(e for e in pmt.streams if e.pid == jxs)
            tr07 = es.jpeg_xs_descriptor and pmt.pcr_pid in self._pcr and p1_ok
        return {
            "ts_packets_analyzed": self.ts_packets_analyzed,
            "pat_count": self.pat_count,
            "pmt_count": self.pmt_count,
            "sync_loss_count": self.sync_loss_count,
            "sync_byte_errors": self.sync_byte_errors,
            "cc_errors": self.cc_errors,
            "pat_errors": self.pat_errors,
            "pmt_errors": self.pmt_errors,
            "tei_errors": self.tei_errors,
            "pcr_discontinuity_errors": self.pcr_discontinuity_errors,
            "pcr_accuracy_errors": self.pcr_accuracy_errors,
            "priority1_ok": p1_ok,
            "priority2_ok": p2_ok,
            "tr07_compliant": tr07,
            "jpeg_xs_pid": jxs,
            "pid_errors": self.pid_errors,
            "crc_errors": self.crc_errors,
            "pcr_repetition_errors": self.pcr_repetition_errors,
            "pts_errors": self.pts_errors,
            "cat_errors": self.cat_errors,
            "section_errors": section_errors,
            "truncated_packets": self.truncated_packets,
        }
