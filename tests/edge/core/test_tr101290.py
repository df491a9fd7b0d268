"""TR 101 290 indicators on canned packets, through both the Python and the numpy path."""

from __future__ import annotations

from services.edge.core.analysis import FlowAnalysis

from .conftest import Feeder
from .tsbuild import Mux, chunk, es_packet, pat_section, psi_packet, section, ts_packet

PKT_S = 0.001  # one datagram per millisecond in these tests


def clean_stream(n_groups: int = 20) -> tuple[Mux, list[bytes]]:
    mux = Mux()
    pkts: list[bytes] = []
    for _ in range(n_groups):
        pkts += [mux.pat(), mux.pmt(), mux.video(), mux.video(), mux.audio(), mux.video(), ts_packet(0x1FFF)]
    return mux, pkts


def run(analysis_feed: Feeder, pkts: list[bytes], *, per: int = 7, media: bool = False) -> dict[str, object]:
    fa = FlowAnalysis(media_analysis=media)
    datagrams = chunk(pkts, per)
    times = [i * PKT_S for i in range(len(datagrams))]
    analysis_feed(fa, datagrams, times)
    snap = fa.snapshot(times[-1])
    tr = snap["tr101290"]
    assert isinstance(tr, dict)
    return tr


def errors(tr: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in tr.items() if (k.endswith("_errors") or k == "sync_loss_count") and v}


def test_clean_stream_counts_tables_and_no_errors(analysis_feed: Feeder) -> None:
    _, pkts = clean_stream()
    tr = run(analysis_feed, pkts)
    assert tr["ts_packets_analyzed"] == len(pkts)
    assert tr["pat_count"] == 20
    assert tr["pmt_count"] == 20
    assert errors(tr) == {}
    assert tr["priority1_ok"] is True and tr["priority2_ok"] is True


def test_isolated_bad_sync_bytes_are_not_sync_loss(analysis_feed: Feeder) -> None:
    _, pkts = clean_stream()
    idx = [6, 20, 34]  # the null packets of groups 0, 2, 4: no continuity side effect
    for i in idx:
        pkts[i] = b"\x48" + pkts[i][1:]
    tr = run(analysis_feed, pkts)
    assert tr["sync_byte_errors"] == 3
    assert tr["sync_loss_count"] == 0
    assert tr["cc_errors"] == 0
    assert tr["priority1_ok"] is False


def test_two_consecutive_bad_sync_bytes_are_one_sync_loss(analysis_feed: Feeder) -> None:
    _, pkts = clean_stream()
    pkts.insert(50, b"\x00" * 188)
    pkts.insert(50, b"\x00" * 188)
    pkts.insert(51, b"\x00" * 188)  # three in a row: still one loss
    pkts.insert(100, b"\x00" * 188)
    pkts.insert(100, b"\x00" * 188)  # re-acquired (5 good) in between: a second loss
    tr = run(analysis_feed, pkts)
    assert tr["sync_byte_errors"] == 5
    assert tr["sync_loss_count"] == 2
    assert tr["ts_packets_analyzed"] == len(pkts)


def test_continuity_drop_duplicate_and_discontinuity(analysis_feed: Feeder) -> None:
    mux = Mux()
    v = mux.video_pid
    pkts = [mux.pat(), mux.pmt()]
    pkts += [es_packet(v, 0), es_packet(v, 1), es_packet(v, 3)]  # drop: 1 error
    pkts += [es_packet(v, 4), es_packet(v, 4)]  # one duplicate: legal
    pkts += [es_packet(v, 5), es_packet(v, 5), es_packet(v, 5)]  # third copy: 1 error
    pkts += [es_packet(v, 9, disc=True)]  # jump flagged by the discontinuity indicator: no error
    pkts += [es_packet(v, 10), ts_packet(v, 10, has_payload=False)]  # no payload: CC holds
    pkts += [ts_packet(0x1FFF, 7), ts_packet(0x1FFF, 3)]  # null packets are never checked
    pkts += [es_packet(0x200, 9)]  # first packet of a PID is not checked
    pkts += [es_packet(v, 12)]  # 10 -> 12 after an AF-only packet: 1 error
    tr = run(analysis_feed, pkts, per=3)
    assert tr["cc_errors"] == 3


def test_cc_state_carries_across_datagrams_and_batches(analysis_feed: Feeder) -> None:
    pkts = [es_packet(0x300, i & 15) for i in range(200)]
    del pkts[150]
    tr = run(analysis_feed, pkts, per=7)
    assert tr["cc_errors"] == 1


def test_tei_is_counted_and_priority2(analysis_feed: Feeder) -> None:
    _, pkts = clean_stream()
    for i in (2, 9, 16):
        pkts[i] = pkts[i][:1] + bytes([pkts[i][1] | 0x80]) + pkts[i][2:]
    tr = run(analysis_feed, pkts)
    assert tr["tei_errors"] == 3
    assert tr["priority2_ok"] is False
    assert tr["priority1_ok"] is True


def test_wrong_table_on_pid0_and_scrambled_pat_are_pat_errors(analysis_feed: Feeder) -> None:
    _, pkts = clean_stream()
    pkts[7] = psi_packet(0, section(0x02, 1, b"\xe1\x01\xf0\x00"), cc=1)  # a PMT on PID 0
    pkts[14] = pkts[14][:3] + bytes([pkts[14][3] | 0x80]) + pkts[14][4:]
    tr = run(analysis_feed, pkts)
    assert tr["pat_errors"] == 2
    # The bad sections were not PATs: 18 good ones remain.
    assert tr["pat_count"] == 18


def test_bad_crc_is_counted_and_the_section_ignored(analysis_feed: Feeder) -> None:
    _, pkts = clean_stream()
    pkts[7] = psi_packet(0, pat_section({1: 0x100}, bad_crc=True), cc=1)
    tr = run(analysis_feed, pkts)
    assert tr["crc_errors"] == 1
    assert tr["pat_count"] == 19
    assert tr["pat_errors"] == 0


def test_truncated_datagram_is_counted(analysis_feed: Feeder) -> None:
    _, pkts = clean_stream(3)
    datagrams = chunk(pkts, 7)
    datagrams[1] = datagrams[1][:-10]
    fa = FlowAnalysis(media_analysis=False)
    analysis_feed(fa, datagrams, [0.001 * i for i in range(len(datagrams))])
    tr = fa.snapshot(1.0)["tr101290"]
    assert tr["truncated_packets"] == 1  # type: ignore[index]
    assert tr["ts_packets_analyzed"] == len(pkts) - 1  # type: ignore[index]
