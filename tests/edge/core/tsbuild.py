"""Builders for canned TS bytes in the core tests (style §4: build inputs with helpers)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from hypothesis import strategies as st

from services.edge.core.ts.psi import crc32_mpeg2


def ts_packet(
    pid: int,
    cc: int = 0,
    payload: bytes = b"",
    *,
    pusi: bool = False,
    tei: bool = False,
    scrambled: int = 0,
    pcr: int | None = None,
    disc: bool = False,
    has_payload: bool = True,
    sync: int = 0x47,
) -> bytes:
    """One 188-byte packet; the payload is padded with 0xFF (adaptation stuffing when needed)."""
    b1 = (0x80 if tei else 0) | (0x40 if pusi else 0) | ((pid >> 8) & 0x1F)
    af = b""
    if pcr is not None or disc or not has_payload or len(payload) < 184:
        flags = (0x80 if disc else 0) | (0x10 if pcr is not None else 0)
        body = bytes([flags])
        if pcr is not None:
            base, ext = divmod(pcr, 300)
            body += struct.pack(">IH", (base >> 1) & 0xFFFFFFFF, ((base & 1) << 15) | 0x7E00 | ext)
        payload = payload[: 184 - 1 - len(body)]
        room = 184 - 1 - len(body) - (len(payload) if has_payload else 0)
        if not has_payload:
            room = 184 - 1 - len(body)
        body += b"\xff" * room
        af = bytes([len(body)]) + body
    afc = (2 if af else 0) | (1 if has_payload else 0)
    head = bytes([sync, b1, pid & 0xFF, (scrambled << 6) | (afc << 4) | (cc & 0x0F)])
    pkt = head + af + (payload if has_payload else b"")
    assert len(pkt) == 188, len(pkt)
    return pkt


def section(table_id: int, ext: int, body: bytes, *, version: int = 0, bad_crc: bool = False) -> bytes:
    """A long-form PSI section with its CRC_32."""
    length = 5 + len(body) + 4
    head = bytes([table_id, 0xB0 | (length >> 8), length & 0xFF, ext >> 8, ext & 0xFF, 0xC1 | (version << 1), 0, 0])
    crc = crc32_mpeg2(head + body)
    if bad_crc:
        crc ^= 0x1
    return head + body + crc.to_bytes(4, "big")


def pat_section(programs: dict[int, int], **kw: object) -> bytes:
    body = b"".join(struct.pack(">HH", prog, 0xE000 | pid) for prog, pid in programs.items())
    return section(0x00, 1, body, **kw)  # type: ignore[arg-type]


def pmt_section(program: int, pcr_pid: int, streams: list[tuple[int, int, bytes]], **kw: object) -> bytes:
    """streams: (stream_type, pid, descriptors)."""
    body = struct.pack(">HH", 0xE000 | pcr_pid, 0xF000)
    for stream_type, pid, descs in streams:
        body += struct.pack(">BHH", stream_type, 0xE000 | pid, 0xF000 | len(descs)) + descs
    return section(0x02, program, body, **kw)  # type: ignore[arg-type]


def lang_descriptor(code: str) -> bytes:
    return bytes([0x0A, 4]) + code.encode() + b"\x00"


def psi_packet(pid: int, sec: bytes, cc: int = 0, **kw: object) -> bytes:
    """A section that fits one packet, with pointer_field 0 and 0xFF stuffing."""
    payload = b"\x00" + sec
    payload += b"\xff" * (184 - len(payload))
    return ts_packet(pid, cc, payload, pusi=True, **kw)  # type: ignore[arg-type]


def pes_packet(pid: int, cc: int, es: bytes = b"", *, pts: int | None = 0, stream_id: int = 0xE0) -> bytes:
    """A PUSI packet starting a PES with an optional PTS, then ES bytes, filling the packet."""
    if pts is not None:
        p = pts
        pts_bytes = bytes(
            [
                0x21 | ((p >> 29) & 0x0E),
                (p >> 22) & 0xFF,
                0x01 | ((p >> 14) & 0xFE),
                (p >> 7) & 0xFF,
                0x01 | ((p << 1) & 0xFE),
            ]
        )
        header = bytes([0, 0, 1, stream_id, 0, 0, 0x80, 0x80, 5]) + pts_bytes
    else:
        header = bytes([0, 0, 1, stream_id, 0, 0, 0x80, 0x00, 0])
    data = (header + es)[:184]
    data += b"\x00" * (184 - len(data))
    return ts_packet(pid, cc, data, pusi=True)


def es_packet(pid: int, cc: int, fill: int = 0x00, **kw: object) -> bytes:
    return ts_packet(pid, cc, bytes([fill]) * 184, **kw)  # type: ignore[arg-type]


class Mux:
    """A tiny deterministic multiplexer: PAT/PMT and ES packets with correct continuity."""

    def __init__(self, *, pmt_pid: int = 0x100, video_pid: int = 0x101, audio_pid: int = 0x102) -> None:
        self.pmt_pid = pmt_pid
        self.video_pid = video_pid
        self.audio_pid = audio_pid
        self.cc: dict[int, int] = {}

    def next_cc(self, pid: int) -> int:
        cc = self.cc.get(pid, -1)
        cc = (cc + 1) & 0x0F
        self.cc[pid] = cc
        return cc

    def pat(self) -> bytes:
        return psi_packet(0, pat_section({1: self.pmt_pid}), self.next_cc(0))

    def pmt(self, lang: str = "eng") -> bytes:
        sec = pmt_section(
            1, self.video_pid, [(0x1B, self.video_pid, b""), (0x0F, self.audio_pid, lang_descriptor(lang))]
        )
        return psi_packet(self.pmt_pid, sec, self.next_cc(self.pmt_pid))

    def video(self, *, pcr: int | None = None, pts: int | None = None) -> bytes:
        cc = self.next_cc(self.video_pid)
        if pts is not None:
            return pes_packet(self.video_pid, cc, pts=pts)
        return es_packet(self.video_pid, cc, pcr=pcr)

    def audio(self) -> bytes:
        return es_packet(self.audio_pid, self.next_cc(self.audio_pid))


def chunk(packets: list[bytes], per: int = 7) -> list[bytes]:
    """Group packets into datagrams of ``per`` packets."""
    return [b"".join(packets[i : i + per]) for i in range(0, len(packets), per)]


# Kinds of packet ``draw_packets`` can add after a program's tables; "skip" loses a video packet.
BASE_KINDS = ("video", "audio", "pcr", "pes", "null", "garbage", "tei", "dup", "skip")


def draw_packets(
    draw: st.DrawFn,
    *,
    rounds: tuple[int, int] = (1, 40),
    per_round: tuple[int, int] = (0, 6),
    kinds: Sequence[str] = BASE_KINDS,
    tables_every_round: bool = True,
    mux: Mux | None = None,
) -> list[bytes]:
    """A hypothesis-drawn stream of one program: PAT/PMT, then packets of the drawn kinds.

    Besides ``BASE_KINDS``: "sync" (a bad sync byte) and "scrambled" (scrambled audio).
    With ``tables_every_round`` False the tables come at random, with a drawn PMT language.
    ``mux`` (fresh by default) keeps its counters, so a caller can continue the stream.
    """
    mux = mux if mux is not None else Mux()
    pkts: list[bytes] = []
    pcr = 0
    for _ in range(draw(st.integers(*rounds))):
        if tables_every_round:
            pkts += [mux.pat(), mux.pmt()]
        elif draw(st.booleans()):
            pkts += [mux.pat(), mux.pmt(lang=draw(st.sampled_from(["eng", "eng", "fra"])))]
        for _ in range(draw(st.integers(*per_round))):
            kind = draw(st.sampled_from(list(kinds)))
            if kind == "video":
                pkts.append(mux.video())
            elif kind == "audio":
                pkts.append(mux.audio())
            elif kind == "pcr":
                pcr += draw(st.sampled_from([1_080_000, 1_080_000, 4_000_000, -500]))
                pkts.append(mux.video(pcr=max(pcr, 0)))
            elif kind == "pes":
                pkts.append(mux.video(pts=draw(st.integers(0, (1 << 33) - 1))))
            elif kind == "null":
                pkts.append(ts_packet(0x1FFF))
            elif kind == "garbage":
                pkts.append(draw(st.binary(min_size=188, max_size=188)))
            elif kind == "tei":
                pkts.append(es_packet(mux.video_pid, mux.next_cc(mux.video_pid), tei=True))
            elif kind == "dup" and pkts:
                pkts.append(pkts[-1])
            elif kind == "sync":
                pkts.append(b"\x46" + mux.video()[1:])
            elif kind == "scrambled":
                pkts.append(es_packet(mux.audio_pid, mux.next_cc(mux.audio_pid), scrambled=2))
            else:
                mux.next_cc(mux.video_pid)  # a lost video packet
    return pkts
