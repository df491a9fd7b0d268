"""RFC 3550 receiver side: statistics (A.1, A.3, A.8), SR/RR/SDES parsing, compound RRs."""

from __future__ import annotations

import struct

from services.edge.core.depay.rtcp import (
    Goodbye,
    OtherRtcp,
    ReceiverReport,
    ReceptionStats,
    SenderReport,
    SourceDescription,
    build_receiver_report,
    parse_rtcp,
)


def sr_bytes(ssrc: int, ntp: int, rtp_ts: int, blocks: int = 0) -> bytes:
    body = struct.pack("!IQIII", ssrc, ntp, rtp_ts, 10, 1000) + bytes(24 * blocks)
    return struct.pack("!BBH", 0x80 | blocks, 200, len(body) // 4) + body


def test_receiver_report_round_trip_with_loss_wrap_and_lsr() -> None:
    stats = ReceptionStats(90000)
    seqs = [(65530 + i) & 0xFFFF for i in range(100) if i % 10 != 5]  # 10 lost, across the wrap
    for k, seq in enumerate(seqs):
        stats.on_rtp(seq, k * 3000, k / 30, ssrc=0xABCDEF01)
    ntp = (3_900_000_000 << 32) | 0x80000000
    stats.on_sr(SenderReport(0xABCDEF01, ntp, 0, 0, 0), 10.0)
    data = build_receiver_report(0x1234, "probe@mediaplane", [stats], 10.5)
    assert len(data) % 4 == 0
    rr, sdes = parse_rtcp(data)
    assert isinstance(rr, ReceiverReport) and rr.ssrc == 0x1234
    (block,) = rr.reports
    assert block.ssrc == 0xABCDEF01
    assert block.highest_seq == (1 << 16) + (65530 + 99 - 65536)  # one wrap
    assert block.cumulative_lost == 10 and block.fraction_lost == 10 * 256 // 100
    assert block.lsr == (ntp >> 16) & 0xFFFFFFFF and block.dlsr == 32768  # 0.5 s in 1/65536 s
    assert isinstance(sdes, SourceDescription) and sdes.chunks == ((0x1234, {1: b"probe@mediaplane"}),)
    # the next interval has no loss: fraction 0, cumulative unchanged
    again = parse_rtcp(build_receiver_report(0x1234, "x", [stats], 11.0))[0]
    assert isinstance(again, ReceiverReport) and again.reports[0].fraction_lost == 0
    assert again.reports[0].cumulative_lost == 10


def test_jitter_follows_rfc3550_a8() -> None:
    # 8 kHz audio, 20 ms packets; every other packet arrives 5 ms late: |D| = 40 units each time
    stats = ReceptionStats(8000)
    expected = 0.0
    for i in range(50):
        stats.on_rtp(i, i * 160, i * 0.020 + (0.005 if i % 2 else 0.0), ssrc=1)
        if i:
            expected += (40 - expected) / 16
    assert abs(stats.jitter - expected) < 1e-6
    assert abs(expected - 40 * (1 - (15 / 16) ** 49)) < 1e-6
    block = stats.report_block(1.0)
    assert block.jitter == int(expected)
    # constant transit: no jitter
    flat = ReceptionStats(90000)
    for i in range(20):
        flat.on_rtp(i, 1000 + i * 3600, 5 + i * 0.04, ssrc=2)
    assert flat.jitter < 1e-6


def test_parse_compound_and_tolerance() -> None:
    sr = sr_bytes(7, 123 << 32, 99, blocks=1)
    bye = struct.pack("!BBHI", 0x81, 203, 2, 7) + b"\x03bye"
    app = struct.pack("!BBHI", 0x80, 204, 2, 7) + b"name"
    packets = parse_rtcp(sr + bye + app)
    assert isinstance(packets[0], SenderReport) and packets[0].ntp_seconds == 123 and packets[0].rtp_timestamp == 99
    assert len(packets[0].reports) == 1
    assert isinstance(packets[1], Goodbye) and packets[1].ssrcs == (7,) and packets[1].reason == b"bye"
    assert isinstance(packets[2], OtherRtcp) and packets[2].packet_type == 204
    assert parse_rtcp(b"") == []
    assert parse_rtcp(b"\x00" * 30) == []  # version 0
    assert len(parse_rtcp(sr + bye[:-3])) == 1  # a truncated second packet ends the parse
    assert parse_rtcp(struct.pack("!BBH", 0x81, 200, 1) + b"\x00" * 4) == []  # SR too short


def test_sequence_restart_after_a_big_jump_needs_two_packets() -> None:
    stats = ReceptionStats(90000)
    for i in range(10):
        stats.on_rtp(100 + i, i, i * 0.01, ssrc=5)
    stats.on_rtp(40000, 0, 1.0, ssrc=5)  # a jump: not counted yet (A.1 bad_seq)
    assert stats.received == 10
    stats.on_rtp(40001, 0, 1.01, ssrc=5)  # sequential: the source restarted
    assert stats.received == 1 and stats.base_seq == 40001
