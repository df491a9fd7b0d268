"""Damage an MPEG transport stream in known ways, and say what a TR 101 290 analyser must count.

Every operation takes a list of 188-byte packets and answers the damaged list with the exact
counter values a correct analyser reports for the damage (``Expected``), given the rules of
docs/analysis.md. The operations keep the multiplex's timing: a packet taken out is replaced
by a null packet, a packet put in takes the place of a later null packet, so the PCRs stay
exact against the byte clock and only the intended indicator moves. They need a constant-rate
stream with null packets (ffmpeg's ``-muxrate``), and raise ``NotEnoughRoom`` otherwise.

Command line::

    python -m tools.tsdamage IN.ts OUT.ts drop --pid 0x100 --count 5
    python -m tools.tsdamage IN.ts OUT.ts sync --count 3 [--burst 2]

prints the expected counters as JSON. Operations: drop, duplicate, triplicate, reorder, sync,
tei, withhold-pat, withhold-pmt, pcr-jump, bad-crc.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TS = 188
NULL_PID = 0x1FFF
NULL_PACKET = bytes([0x47, 0x1F, 0xFF, 0x10]) + b"\xff" * 184
PCR_WRAP = (1 << 33) * 300


class NotEnoughRoom(Exception):
    """The stream has too few candidate packets (or null packets) for the requested damage."""


@dataclass
class Expected:
    """Counter values (Tr101290Stats field names) the damage must produce; absent means 0."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


def split(data: bytes) -> list[bytes]:
    """The whole 188-byte packets of ``data`` (a trailing partial packet is dropped)."""
    return [data[i : i + TS] for i in range(0, len(data) - TS + 1, TS)]


def pid_of(pkt: bytes) -> int:
    return ((pkt[1] & 0x1F) << 8) | pkt[2]


def has_payload(pkt: bytes) -> bool:
    return bool(pkt[3] & 0x10)


def has_pcr(pkt: bytes) -> bool:
    return bool(pkt[3] & 0x20 and pkt[4] >= 7 and pkt[5] & 0x10)


def _positions(pkts: list[bytes], pid: int) -> list[int]:
    return [i for i, p in enumerate(pkts) if pid_of(p) == pid]


def _spread(candidates: list[int], count: int, margin: int = 2) -> list[int]:
    """``count`` candidates evenly spread, each at least ``margin`` candidates from the next."""
    usable = candidates[margin:-margin] if len(candidates) > 2 * margin else []
    if count <= 0:
        return []
    step = len(usable) // count
    if step < margin + 1:
        raise NotEnoughRoom(f"need {count} well-spaced packets, have {len(candidates)}")
    return [usable[k * step + step // 2] for k in range(count)]


def _take_null_after(pkts: list[bytes], index: int) -> None:
    """Remove the first null packet after ``index`` (to keep the byte clock)."""
    for j in range(index + 1, len(pkts)):
        if pid_of(pkts[j]) == NULL_PID:
            del pkts[j]
            return
        if has_pcr(pkts[j]):
            break
    raise NotEnoughRoom("no null packet to trade before the next PCR")


def _nulls_soon(pkts: list[bytes], index: int, needed: int, within: int = 16) -> bool:
    """True when ``needed`` null packets follow ``index`` closely, with no PCR before them."""
    found = 0
    for j in range(index + 1, min(len(pkts), index + 1 + within)):
        if has_pcr(pkts[j]):
            return False
        if pid_of(pkts[j]) == NULL_PID:
            found += 1
            if found == needed:
                return True
    return False


def _plain_es(pkts: list[bytes], pid: int) -> list[int]:
    """Positions of ``pid``'s packets that carry payload but no PCR and no discontinuity flag."""
    return [i for i in _positions(pkts, pid) if has_payload(pkts[i]) and not pkts[i][3] & 0x20]


def drop(pkts: list[bytes], pid: int, count: int) -> tuple[list[bytes], Expected]:
    """Lose ``count`` isolated packets of ``pid``: one Continuity_count_error each."""
    out = list(pkts)
    exp = Expected()
    for i in _spread(_plain_es(out, pid), count):
        out[i] = NULL_PACKET
        exp.add("cc_errors")
    return out, exp


def duplicate(pkts: list[bytes], pid: int, count: int, copies: int = 1) -> tuple[list[bytes], Expected]:
    """Send ``copies`` extra copies of ``count`` packets of ``pid``.

    ISO/IEC 13818-1 §2.4.3.3 allows one duplicate: ``copies=1`` is no error, each further copy
    is one Continuity_count_error.
    """
    out = list(pkts)
    exp = Expected()
    candidates = [i for i in _plain_es(out, pid) if _nulls_soon(out, i, copies)]
    for i in sorted(_spread(candidates, count), reverse=True):
        for _ in range(copies):
            out.insert(i + 1, out[i])
        for _ in range(copies):
            _take_null_after(out, i + copies)
        exp.add("cc_errors", max(0, copies - 1))
    return out, exp


def reorder(pkts: list[bytes], pid: int, count: int) -> tuple[list[bytes], Expected]:
    """Swap ``count`` isolated pairs of consecutive packets of ``pid``.

    A <- B swap of counters c, c+1 between c-1 and c+2 breaks three comparisons (c-1 -> c+1,
    c+1 -> c, c -> c+2): three Continuity_count_errors per swap.
    """
    out = list(pkts)
    exp = Expected()
    positions = _plain_es(out, pid)
    for k in _spread(list(range(len(positions) - 1)), count, margin=3):
        a, b = positions[k], positions[k + 1]
        out[a], out[b] = out[b], out[a]
        exp.add("cc_errors", 3)
    return out, exp


def corrupt_sync(pkts: list[bytes], count: int, burst: int = 1) -> tuple[list[bytes], Expected]:
    """Corrupt the sync byte of ``count`` runs of ``burst`` consecutive null packets.

    Every corrupted byte is a Sync_byte_error; a run of two or more is one TS_sync_loss
    (TR 101 290 §5.2.1 1.1), the runs being far enough apart for sync to be re-acquired.
    Null packets are chosen so that no other indicator moves.
    """
    out = list(pkts)
    exp = Expected()
    runs = [
        i
        for i in range(len(out) - burst)
        if all(pid_of(out[i + k]) == NULL_PID for k in range(burst)) and (i == 0 or pid_of(out[i - 1]) != NULL_PID)
    ]
    for i in _spread(runs, count):
        for k in range(burst):
            out[i + k] = b"\x46" + out[i + k][1:]
        exp.add("sync_byte_errors", burst)
        if burst >= 2:
            exp.add("sync_loss_count")
    return out, exp


def set_tei(pkts: list[bytes], pid: int, count: int) -> tuple[list[bytes], Expected]:
    """Set transport_error_indicator on ``count`` packets of ``pid``: one Transport_error each."""
    out = list(pkts)
    exp = Expected()
    for i in _spread(_plain_es(out, pid), count):
        p = out[i]
        out[i] = p[:1] + bytes([p[1] | 0x80]) + p[2:]
        exp.add("tei_errors")
    return out, exp


def _renumber(pkts: list[bytes], pid: int) -> None:
    cc = None
    for i, p in enumerate(pkts):
        if pid_of(p) != pid:
            continue
        cc = (p[3] & 0x0F) if cc is None else (cc + 1) & 0x0F
        pkts[i] = p[:3] + bytes([(p[3] & 0xF0) | cc]) + p[4:]


def withhold(
    pkts: list[bytes], pid: int, start_s: float, duration_s: float, rate_bps: float
) -> tuple[list[bytes], Expected]:
    """Replace ``pid``'s packets between ``start_s`` and ``start_s + duration_s`` with null packets.

    The PID's counters are renumbered so only the interval indicator moves: one PAT_error (PID 0)
    or PMT_error per gap longer than 0.5 s (TR 101 290 §5.2.1 1.3, 1.5).
    """
    out = list(pkts)
    per_packet_s = TS * 8 / rate_bps
    first = int(start_s / per_packet_s)
    last = int((start_s + duration_s) / per_packet_s)
    removed = [i for i in _positions(out, pid) if first <= i < last]
    if not removed:
        raise NotEnoughRoom("no packet of the PID in that interval")
    for i in removed:
        out[i] = NULL_PACKET
    _renumber(out, pid)
    kept = _positions(out, pid)
    before = max((i for i in kept if i < first), default=None)
    after = min((i for i in kept if i >= last), default=None)
    exp = Expected()
    if before is not None and after is not None and (after - before) * per_packet_s > 0.5:
        exp.add("pat_errors" if pid == 0 else "pmt_errors")
    return out, exp


def _with_pcr(pkt: bytes, pcr: int, disc: bool) -> bytes:
    base, ext = divmod(pcr % PCR_WRAP, 300)
    raw = (base << 15) | (0x3F << 9) | ext
    flags = pkt[5] | (0x80 if disc else 0)
    return pkt[:5] + bytes([flags]) + raw.to_bytes(6, "big") + pkt[12:]


def _read_pcr(pkt: bytes) -> int:
    raw = int.from_bytes(pkt[6:12], "big")
    return (raw >> 15) * 300 + (raw & 0x1FF)


def pcr_jump(
    pkts: list[bytes], pcr_pid: int, count: int, jump_s: float = 1.0, flagged: bool = False
) -> tuple[list[bytes], Expected]:
    """Shift every PCR from ``count`` points on by ``jump_s`` (cumulatively).

    Unflagged, each jump is one PCR_discontinuity_indicator_error (TR 101 290 §5.2.2 2.3b);
    flagged with the discontinuity_indicator it is none.
    """
    out = list(pkts)
    exp = Expected()
    pcr_positions = [i for i in _positions(out, pcr_pid) if has_pcr(out[i])]
    points = set(_spread(pcr_positions, count, margin=3))
    offset = 0
    for i in pcr_positions:
        if i in points:
            offset += round(jump_s * 27_000_000)
            if not flagged:
                exp.add("pcr_discontinuity_errors")
        if offset:
            out[i] = _with_pcr(out[i], _read_pcr(out[i]) + offset, flagged and i in points)
    return out, exp


_CRC_TABLE_REV = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def bad_crc(pkts: list[bytes], pid: int, count: int) -> tuple[list[bytes], Expected]:
    """Flip a bit of CRC_32 in ``count`` single-packet sections on ``pid`` (a PAT or PMT PID).

    Each is one CRC_error (TR 101 290 §5.2.2 2.2); the table repeats often enough (ffmpeg: every
    100 ms) that the lost section raises no interval error.
    """
    out = list(pkts)
    exp = Expected()
    candidates = []
    for i in _positions(out, pid):
        p = out[i]
        if not p[1] & 0x40 or p[3] & 0x20:
            continue
        start = 5 + p[4]
        length = ((p[start + 1] & 0x0F) << 8) | p[start + 2]
        if start + 3 + length <= TS:
            candidates.append(i)
    for i in _spread(candidates, count):
        buf = bytearray(out[i])
        start = 5 + buf[4]  # after the pointer_field (no adaptation field here)
        end = start + 3 + (((buf[start + 1] & 0x0F) << 8) | buf[start + 2])
        buf[end - 1] ^= 0x01
        assert zlib.crc32(bytes(buf[start:end]).translate(_CRC_TABLE_REV)) != 0xFFFFFFFF
        out[i] = bytes(buf)
        exp.add("crc_errors")
    return out, exp


def iter_datagrams(pkts: list[bytes], rate_bps: float, per: int = 7) -> Iterator[tuple[bytes, float]]:
    """(datagram, arrival) pairs: ``per`` packets each, arriving at the stream's constant rate."""
    per_packet_s = TS * 8 / rate_bps
    for i in range(0, len(pkts), per):
        yield b"".join(pkts[i : i + per]), (i + per - 1) * per_packet_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.tsdamage", description=__doc__.split("\n\n")[0])
    ap.add_argument("input", type=Path)
    ap.add_argument("output", type=Path)
    ap.add_argument(
        "op",
        choices=[
            "drop",
            "duplicate",
            "triplicate",
            "reorder",
            "sync",
            "tei",
            "withhold-pat",
            "withhold-pmt",
            "pcr-jump",
            "bad-crc",
        ],
    )
    ap.add_argument("--pid", type=lambda s: int(s, 0), default=0x100, help="PID to damage (default 0x100)")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--burst", type=int, default=1, help="sync: consecutive corrupted packets per run")
    ap.add_argument("--rate", type=float, default=None, help="mux rate in bit/s (withhold-*)")
    ap.add_argument("--start", type=float, default=0.5, help="withhold-*: start, seconds")
    ap.add_argument("--duration", type=float, default=1.0, help="withhold-*: length, seconds")
    ap.add_argument("--flagged", action="store_true", help="pcr-jump: set the discontinuity_indicator")
    ap.add_argument("--pmt-pid", type=lambda s: int(s, 0), default=0x1000)
    args = ap.parse_args(argv)
    pkts = split(args.input.read_bytes())
    try:
        if args.op == "drop":
            out, exp = drop(pkts, args.pid, args.count)
        elif args.op == "duplicate":
            out, exp = duplicate(pkts, args.pid, args.count, 1)
        elif args.op == "triplicate":
            out, exp = duplicate(pkts, args.pid, args.count, 2)
        elif args.op == "reorder":
            out, exp = reorder(pkts, args.pid, args.count)
        elif args.op == "sync":
            out, exp = corrupt_sync(pkts, args.count, args.burst)
        elif args.op == "tei":
            out, exp = set_tei(pkts, args.pid, args.count)
        elif args.op in ("withhold-pat", "withhold-pmt"):
            if args.rate is None:
                ap.error("--rate is needed to place the gap in time")
            pid = 0 if args.op == "withhold-pat" else args.pmt_pid
            out, exp = withhold(pkts, pid, args.start, args.duration, args.rate)
        elif args.op == "pcr-jump":
            out, exp = pcr_jump(pkts, args.pid, args.count, flagged=args.flagged)
        else:
            out, exp = bad_crc(pkts, args.pmt_pid, args.count)
    except NotEnoughRoom as exc:
        print(f"tsdamage: {exc}", file=sys.stderr)
        return 1
    args.output.write_bytes(b"".join(out))
    print(json.dumps(exp.counts, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
