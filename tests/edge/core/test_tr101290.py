"""TR 101 290 indicators on canned packets, through both the Python and the numpy path."""

from __future__ import annotations

from services.edge.core.analysis import FlowAnalysis
from services.edge.core.mux.ts_mux import NULL_PACKET

from .conftest import Feeder
from .tsbuild import Mux, chunk, es_packet, pat_section, pmt_section, psi_packet, section, ts_packet

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


# ---------------------------------------------------------------- timed indicators
# A table-driven mux clock: one 7-packet datagram every 10 ms, PAT/PMT every 100 ms.


def timed_stream(
    seconds: float,
    *,
    pat: bool | None = True,
    pat_gap: tuple[float, float] | None = None,
    pcr_every: float = 0.04,
    pcr_gap: tuple[float, float] | None = None,
    pts_gap: tuple[float, float] | None = None,
    audio_gap: tuple[float, float] | None = None,
    pcr_jitter_ticks: dict[int, int] | None = None,
    null_stuffing: bool = True,
) -> tuple[list[bytes], list[float]]:
    """Datagrams of 7 packets every 10 ms, filled up with null packets; PCR ticks follow the packet
    index exactly (CBR)."""
    mux = Mux()
    datagrams: list[bytes] = []
    times: list[float] = []
    ticks_per_packet = 27_000_000 * 0.010 / 7
    n_pcr = 0
    next_pcr = next_psi = next_pts = 0.0
    index = 0

    def inside(gap: tuple[float, float] | None, t: float) -> bool:
        return gap is not None and gap[0] <= t < gap[1]

    for k in range(int(seconds / 0.010)):
        t = k * 0.010
        pkts: list[bytes] = []
        if t >= next_psi:
            next_psi += 0.1
            if pat and not inside(pat_gap, t):
                pkts.append(mux.pat())
            pkts.append(mux.pmt())
        if t >= next_pcr:
            next_pcr += pcr_every
            if not inside(pcr_gap, t):
                pcr = round((index + len(pkts)) * ticks_per_packet)
                pcr += (pcr_jitter_ticks or {}).get(n_pcr, 0)
                pkts.append(mux.video(pcr=pcr))
                n_pcr += 1
        if t >= next_pts:
            next_pts += 0.04
            if not inside(pts_gap, t):
                pkts.append(mux.video(pts=round(t * 90_000)))
        if not inside(audio_gap, t):
            pkts.append(mux.audio())
        while len(pkts) < 7:
            pkts.append(NULL_PACKET if null_stuffing else mux.video())  # a constant-rate mux stuffs
        index += 7
        datagrams.append(b"".join(pkts))
        times.append(t)
    return datagrams, times


def run_timed(analysis_feed: Feeder, datagrams: list[bytes], times: list[float], **kw: object) -> dict[str, object]:
    fa = FlowAnalysis(media_analysis=False, **kw)  # type: ignore[arg-type]
    analysis_feed(fa, datagrams, times)
    tr = fa.snapshot(times[-1])["tr101290"]
    assert isinstance(tr, dict)
    return tr


def test_clean_timed_stream_has_no_errors(analysis_feed: Feeder) -> None:
    tr = run_timed(analysis_feed, *timed_stream(3.0))
    assert errors(tr) == {}


def test_pat_missing_from_the_start_and_withheld(analysis_feed: Feeder) -> None:
    tr = run_timed(analysis_feed, *timed_stream(2.0, pat=False))
    assert tr["pat_errors"] == 1  # one gap, however long (docs/analysis.md)
    tr = run_timed(analysis_feed, *timed_stream(3.0, pat_gap=(1.0, 1.3)))
    assert tr["pat_errors"] == 0  # 0.4 s between the PATs at 0.9 and 1.3
    tr = run_timed(analysis_feed, *timed_stream(3.0, pat_gap=(1.0, 1.65)))
    assert tr["pat_errors"] == 1


def test_pcr_repetition_and_accuracy(analysis_feed: Feeder) -> None:
    tr = run_timed(analysis_feed, *timed_stream(2.0, pcr_every=0.11))
    assert tr["pcr_repetition_errors"] > 0
    tr = run_timed(analysis_feed, *timed_stream(3.0, pcr_gap=(1.0, 1.2)))
    assert tr["pcr_repetition_errors"] == 1
    assert tr["pcr_discontinuity_errors"] == 1  # the PCR value also moved 200 ms
    # 500 ns is 13.5 ticks: 13 ticks off is within, 15 is not.
    tr = run_timed(analysis_feed, *timed_stream(3.0, pcr_jitter_ticks={30: 13, 50: 15, 60: -15}))
    assert tr["pcr_accuracy_errors"] == 2
    assert errors(tr) == {"pcr_accuracy_errors": 2}


def test_pcr_accuracy_is_judged_only_on_a_constant_rate_mux(analysis_feed: Feeder) -> None:
    """Without null packets the TS is VBR (FFmpeg's default, RTMP/RTSP ingest): each PCR pair
    sets the rate between them, so there is no byte clock to be 500 ns off (a VBR camera flow
    was 'Warning' for ever: ~18 PCR accuracy errors a second)."""
    jitter = {30: 40, 50: -40, 60: 40}
    assert run_timed(analysis_feed, *timed_stream(3.0, pcr_jitter_ticks=jitter))["pcr_accuracy_errors"] == 3
    vbr = run_timed(analysis_feed, *timed_stream(3.0, pcr_jitter_ticks=jitter, null_stuffing=False))
    assert errors(vbr) == {}


def test_pts_error_after_700ms(analysis_feed: Feeder) -> None:
    assert run_timed(analysis_feed, *timed_stream(3.0, pts_gap=(1.0, 1.6)))["pts_errors"] == 0
    assert run_timed(analysis_feed, *timed_stream(3.0, pts_gap=(1.0, 1.8)))["pts_errors"] == 1


def test_pid_error_with_a_configurable_timeout(analysis_feed: Feeder) -> None:
    datagrams, times = timed_stream(4.0, audio_gap=(1.0, 2.6))
    assert run_timed(analysis_feed, datagrams, times)["pid_errors"] == 0  # default 5 s
    tr = run_timed(analysis_feed, datagrams, times, pid_timeout_s=1.0)
    assert tr["pid_errors"] == 1
    assert tr["priority1_ok"] is False


def test_pmt_interval_and_scrambled_pmt(analysis_feed: Feeder) -> None:
    mux = Mux()
    pkts = [mux.pat(), mux.pmt()]
    scrambled = mux.pmt()
    pkts.append(scrambled[:3] + bytes([scrambled[3] | 0x40]) + scrambled[4:])
    tr = run(analysis_feed, pkts + [mux.video() for _ in range(5)])
    assert tr["pmt_errors"] == 1
    assert tr["cat_errors"] == 1  # a scrambled packet and no CAT yet (§5.2.2 2.6)


def test_cat_errors(analysis_feed: Feeder) -> None:
    mux = Mux()
    cat = psi_packet(1, section(0x01, 0xFFFF, b""))
    not_cat = psi_packet(1, section(0x02, 1, b"\xe1\x00\xf0\x00"), cc=1)
    scrambled = es_packet(0x101, 0, scrambled=2)
    tr = run(analysis_feed, [mux.pat(), mux.pmt(), scrambled, cat, es_packet(0x101, 1, scrambled=2), not_cat])
    assert tr["cat_errors"] == 2  # the scrambled packet before the CAT, and the PMT on PID 1
    assert tr["priority2_ok"] is False


def test_pcr_jump_with_and_without_the_discontinuity_indicator(analysis_feed: Feeder) -> None:
    mux = Mux()
    pkts = [mux.pat(), mux.pmt()]
    pcr = 0
    for k in range(30):
        pcr += 1_080_000  # 40 ms
        if k == 10:
            pkts.append(es_packet(mux.video_pid, mux.next_cc(mux.video_pid), pcr=pcr + 27_000_000, disc=True))
            pcr += 27_000_000
        elif k == 20:
            pcr += 27_000_000
            pkts.append(mux.video(pcr=pcr))
        else:
            pkts.append(mux.video(pcr=pcr))
    tr = run(analysis_feed, pkts, per=1)
    assert tr["pcr_discontinuity_errors"] == 1
    assert tr["cc_errors"] == 0


def test_continuity_error_on_a_psi_pid_drops_the_half_section(analysis_feed: Feeder) -> None:
    mux = Mux()
    pkts = [mux.pat(), mux.pmt()]
    long_pmt = pmt_section(
        1, 0x101, [(0x1B, 0x101, b"\x00" * 0)] + [(0x06, 0x200 + i, b"\x05\x04ABCD") for i in range(30)]
    )
    first = ts_packet(0x100, mux.next_cc(0x100), (b"\x00" + long_pmt)[:184], pusi=True)
    mux.next_cc(0x100)  # the continuation packet is lost
    nxt = mux.pmt()  # the next PMT starts cleanly
    tr = run(analysis_feed, [*pkts, first, nxt], per=1)
    assert tr["cc_errors"] == 1
    assert tr["crc_errors"] == 0  # no splice across the gap
    assert tr["pmt_count"] == 2


def test_tr07_jpeg_xs(analysis_feed: Feeder) -> None:
    mux = Mux()
    jxs_desc = bytes([0x3F, 2, 0x14, 0x00])  # extension descriptor: JPEG XS video descriptor
    sec = pmt_section(1, 0x101, [(0x32, 0x101, jxs_desc)])
    pkts = [mux.pat(), psi_packet(0x100, sec), mux.video(pcr=0), mux.video(pcr=1_080_000)]
    fa = FlowAnalysis(media_analysis=True, tr07_mode=True)
    analysis_feed(fa, chunk(pkts, 4), [0.0])
    snap = fa.snapshot(0.0)
    tr = snap["tr101290"]
    assert isinstance(tr, dict)
    assert tr["jpeg_xs_pid"] == 0x101
    assert tr["tr07_compliant"] is True
    media = snap["media"]
    assert isinstance(media, dict)
    assert media["video_streams"][0]["codec"] == "jpegxs"  # type: ignore[index]
    # Without the descriptor: a JPEG XS PID, but not TR-07.
    fa = FlowAnalysis(media_analysis=False, tr07_mode=True)
    analysis_feed(fa, chunk([mux.pat(), psi_packet(0x100, pmt_section(1, 0x101, [(0x32, 0x101, b"")]))], 2), [0.0])
    tr = fa.snapshot(0.0)["tr101290"]
    assert tr["jpeg_xs_pid"] == 0x101 and tr["tr07_compliant"] is False  # type: ignore[index]


def test_program_changes_are_events_and_roles_follow_the_pmt() -> None:
    from services.edge.core.ts.tr101290 import Tr101290Analyzer

    mux = Mux()
    tr = Tr101290Analyzer()
    pmt_a = pmt_section(1, 0x101, [(0x1B, 0x101, b"")], version=1)
    pmt_b = pmt_section(1, 0x101, [(0x1B, 0x101, b""), (0x0F, 0x103, b"")], version=2)
    pkts = [mux.pat()]
    for i in range(40):  # a PMT that flips every packet: each flip is a change, none a stall
        pkts.append(psi_packet(0x100, pmt_a if i % 2 else pmt_b, mux.next_cc(0x100)))
    buf = b"".join(pkts)
    tr.feed_packets(buf, len(pkts), 0.0, 0)
    events = tr.pop_events()
    assert len(events) == 16  # bounded: the last 16 of 41 changes
    assert tr.pop_events() == []
    assert [e.pid for e in tr.pmts[1].streams] == [0x101]  # the last PMT (version 1) holds
    assert tr.pmt_count == 40
    assert tr.pid_errors == 0 and tr.cc_errors == 0
