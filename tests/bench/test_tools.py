"""bench.tools: the RTP/TS generator against the sink on loopback, and their counting cores."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio

from bench.tools.rtpgen import RtpGenerator, parse_endpoint
from bench.tools.rtpsink import ContinuityCounter, RtpSink, SequenceCounter
from bench.tools.tsgen import (
    PAT_PID,
    PMT_PID,
    TS_PACKET_SIZE,
    TS_PAYLOAD_SIZE,
    VIDEO_PID,
    TsPayloadWriter,
    crc32_mpeg2,
    pat_packet,
    pmt_packet,
    read_probe,
)
from services.edge.core.rtp import PT_MP2T, parse_rtp

REPO = Path(__file__).resolve().parents[2]


def _ts_fields(packet: bytes | bytearray) -> tuple[int, int, int]:
    """(pid, adaptation_field_control, cc) of one TS packet."""
    return ((packet[1] & 0x1F) << 8) | packet[2], packet[3] >> 4, packet[3] & 0x0F


def test_crc32_mpeg2_check_value() -> None:
    assert crc32_mpeg2(b"123456789") == 0x0376E6E7  # the catalogued CRC-32/MPEG-2 check value


@pytest.mark.parametrize("packet", [pat_packet(), pmt_packet()], ids=["pat", "pmt"])
def test_psi_sections_carry_a_valid_crc(packet: bytearray) -> None:
    section_length = ((packet[6] & 0x0F) << 8) | packet[7]
    section = bytes(packet[5 : 8 + section_length])
    assert packet[0] == 0x47 and packet[1] & 0x40  # sync byte, PUSI
    assert crc32_mpeg2(section) == 0  # the CRC over a section including its CRC is zero


def test_ts_payloads_have_sync_bytes_psi_pcr_and_continuous_counters() -> None:
    writer = TsPayloadWriter(psi_interval=5)
    buf = bytearray(TS_PAYLOAD_SIZE)
    last_cc: dict[int, int] = {}
    pids: list[int] = []
    pcr_packets = 0
    for index in range(40):
        writer.write(buf, 0, media_time_s=index * 0.005, index=index, send_ns=123 + index)
        assert read_probe(buf) == (index, 123 + index)
        for offset in range(0, TS_PAYLOAD_SIZE, TS_PACKET_SIZE):
            packet = buf[offset : offset + TS_PACKET_SIZE]
            assert packet[0] == 0x47
            pid, afc, cc = _ts_fields(packet)
            pids.append(pid)
            if afc == 3:
                pcr_packets += 1
                assert packet[5] & 0x10  # PCR_flag
            if pid in last_cc:
                assert cc == (last_cc[pid] + 1) & 0x0F, (index, pid)
            last_cc[pid] = cc
    assert pids.count(PAT_PID) == pids.count(PMT_PID) == 8
    assert pids.count(VIDEO_PID) == 40 * 7 - 16
    assert pcr_packets == 10  # media time 0..0.195 s, one PCR per 20 ms


def test_sequence_counter_counts_loss_reordering_duplicates_across_the_wrap() -> None:
    counter = SequenceCounter()
    for sequence in [65530, 65531, 65533, 65532, 65532, 65534, 65535, 0, 3, 1, 4]:
        counter.feed(sequence)
    # 65530..4 is 11 numbers; 2 never came; 65532 and 1 came late; 65532 twice
    assert (counter.received, counter.expected, counter.lost) == (11, 11, 1)
    assert (counter.reordered, counter.duplicated) == (2, 1)


def test_continuity_counter_counts_gaps_and_allows_one_repeat() -> None:
    def packet(pid: int, cc: int) -> bytes:
        return bytes([0x47, pid >> 8, pid & 0xFF, 0x10 | cc]) + bytes(184)

    counter = ContinuityCounter()
    counter.feed(b"".join(packet(0x100, cc) for cc in (14, 15, 0, 0, 3)) + packet(0x101, 7))
    assert (counter.ts_packets, counter.cc_errors, counter.ts_lost, counter.ts_duplicates) == (6, 1, 2, 1)


def _run_pair_in_threads(sink: RtpSink, gen: RtpGenerator) -> tuple:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("sink", sink.run()))
    thread.start()
    try:
        generated = gen.run()
    finally:
        thread.join(timeout=10)
    assert not thread.is_alive()
    return generated, result["sink"]


@pytest.mark.parametrize("raw_ts", [False, True], ids=["rtp", "raw-ts"])
def test_generator_against_sink_one_second(raw_ts: bool) -> None:
    with (
        RtpSink(("127.0.0.1", 0), seconds=5, idle=0.5, mode="ts" if raw_ts else "rtp", check_cc=True) as sink,
        RtpGenerator(sink.address, pps=5000, seconds=1.0, raw_ts=raw_ts) as gen,
    ):
        generated, report = _run_pair_in_threads(sink, gen)
    # No rate is asserted (a loaded machine sends fewer): what arrives must match what was sent.
    assert generated.sent > 100
    assert report.received == report.expected == generated.sent
    assert (report.lost, report.reordered, report.duplicated, report.not_rtp) == (0, 0, 0, 0)
    assert (report.cc_errors, report.ts_lost) == (0, 0)
    assert report.bytes == generated.sent * (TS_PAYLOAD_SIZE + (0 if raw_ts else 12))
    assert 0 <= report.latency_ms["p50"] < 1000


async def test_generator_and_sink_under_trio_over_ipv6() -> None:
    with RtpSink(("::1", 0), seconds=5, count=300) as sink, RtpGenerator(sink.address, pps=3000, count=300) as gen:
        reports: dict = {}

        async def run_sink() -> None:
            reports["sink"] = await sink.arun()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_sink)
                reports["gen"] = await gen.arun()
    assert reports["gen"].sent == 300
    assert (reports["sink"].received, reports["sink"].lost) == (300, 0)


def test_sink_detects_the_loss_it_is_shown() -> None:
    with RtpGenerator(("127.0.0.1", 9), pps=10000, count=93) as gen:  # used to build datagrams only
        datagrams = [bytes(gen._build(1)[0]) for _ in range(93)]
    header = parse_rtp(datagrams[0])
    assert header is not None and header.payload_type == PT_MP2T
    with (
        RtpSink(("127.0.0.1", 0), seconds=5, count=90, check_cc=True) as sink,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender,
    ):
        for index, datagram in enumerate(datagrams):
            if index not in (10, 11, 50):
                sender.sendto(datagram, sink.address)
        report = sink.run()
    assert (report.received, report.expected, report.lost, report.duplicated) == (90, 93, 3, 0)
    # Datagrams 10-11 and 50 carry only video (PSI goes in 0, 40, 80): 14 and 7 TS packets missing.
    assert (report.cc_errors, report.ts_lost) == (2, 21)


def test_cli_pair() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.tools.rtpsink", "--bind", "127.0.0.1:0", "--seconds", "5", "--count", "500"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout is not None
        host, port = parse_endpoint(json.loads(sink.stdout.readline())["listening"])
        gen = subprocess.run(
            [sys.executable, "-m", "bench.tools.rtpgen", "--dest", f"{host}:{port}", "--pps", "5000", "--count", "500"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert gen.returncode == 0, gen.stderr
        assert json.loads(gen.stdout)["sent"] == 500
        out, _ = sink.communicate(timeout=10)
    finally:
        sink.kill()
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["received"], report["lost"], report["duplicated"]) == (500, 0, 0)


def test_probe_is_optional() -> None:
    writer = TsPayloadWriter(probe=False)
    buf = bytearray(TS_PAYLOAD_SIZE)
    for index in range(3):
        writer.write(buf, 0, media_time_s=index * 0.05, index=index, send_ns=1)
        assert read_probe(buf) is None
        assert buf[0::TS_PACKET_SIZE] == b"\x47" * 7


def test_edge_forward_helpers_read_stats_and_counters() -> None:
    from bench.edge_forward import _edge_dropped, tree_cpu_seconds, udp_counters

    stats = {"data": {"flows": [{"outputs": [{"packets_dropped": 3}, {"packets_dropped": 4, "x": [1]}]}]}}
    assert _edge_dropped(stats) == 7
    counters = udp_counters()
    assert {"InDatagrams", "RcvbufErrors"} <= counters.keys()
    assert tree_cpu_seconds(os.getpid()) > 0
