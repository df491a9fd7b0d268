"""SMPTE 2022-1 interop: GStreamer's and ffmpeg's FEC into our decoder, ours into GStreamer's.

Every stream goes through ``LossyUdpProxy`` (media port lossy, FEC ports clean), so the loss is
known exactly. The expected recovery is computed independently from the loss and the FEC packets
that actually arrived (iterative peeling), and the output is compared byte for byte with what the
sender sent (as the proxy saw it).
"""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
import trio

from services.edge.core.fec import FecDecoder, FecEncoder
from tests.interop.harness import (
    bound_udp_socket,
    fec_groups,
    finish,
    free_port_block,
    make_ts_file,
    port_of,
    proxy_block,
    receive_fec,
    recoverable,
    require_tool,
    rtp_packets_from_ts,
    send_with_fec,
    seq_of,
    udp_port_bound,
    wait_udp_bound,
)
from tests.tools.lossy_proxy import LossyUdpProxy

pytestmark = pytest.mark.interop

GST = "gst-launch-1.0"


@pytest.fixture(scope="module")
def ts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_tool("ffmpeg", "-version")
    path = make_ts_file(tmp_path_factory.mktemp("fec") / "src.ts")
    assert path.stat().st_size > 600 * 1316
    return path


def n_packets(ts_file: Path) -> int:
    return ts_file.stat().st_size // 1316


def pattern(columns: int, rows: int) -> list[int]:
    """Arrival indices to drop: recoverable singles and a row burst, then an unrecoverable square."""
    m = columns * rows
    one_per_row = [m + r * columns + (r % columns) for r in range(rows)]
    row_burst = [2 * m + columns + c for c in range(columns)]
    square = [3 * m + columns + 1, 3 * m + columns + 2, 3 * m + 2 * columns + 1, 3 * m + 2 * columns + 2]
    return one_per_row + row_burst + square


def random_loss(columns: int, rows: int, total: int, rate: float, seed: int) -> list[int]:
    """Seeded independent loss, kept off the first and the last two matrices (start-up, tail)."""
    rng = random.Random(seed)
    m = columns * rows
    return [i for i in range(m, total - 2 * m) if rng.random() < rate]


def check_decoded(
    result_output: list[bytes], decoder: FecDecoder, sent: list[bytes], dropped: list[int], fec: list[bytes]
) -> tuple[int, int]:
    """Assert the recovered count equals the model's and the output is bit-identical."""
    lost = {seq_of(sent[i]) for i in dropped}
    rebuilt = recoverable(lost, fec_groups(fec))
    gone = lost - rebuilt
    first = seq_of(sent[0])
    diag = (
        f"model rebuilt {sorted((s - first) & 0xFFFF for s in rebuilt)} of lost "
        f"{sorted((s - first) & 0xFFFF for s in lost)}; {decoder.counters}"
    )
    assert decoder.counters.recovered == len(rebuilt), diag
    assert decoder.counters.unrecoverable == len(gone)
    expected = [p for p in sent if seq_of(p) not in gone]
    assert len(result_output) == len(expected)
    assert result_output == expected  # bit-identical, in order
    return len(rebuilt), len(gone)


async def run_external_sender(
    argv: list[str],
    columns: int,
    rows: int,
    drops: list[int],
    *,
    fec_drops: dict[int, dict[str, object]] | None = None,
    window_s: float | None = 1.0,
) -> tuple[int, int]:
    media, column, row = await bound_udp_socket(), await bound_udp_socket(), await bound_udp_socket()
    targets = [("127.0.0.1", port_of(s)) for s in (media, column, row)]
    lossy: dict[int, dict[str, object]] = {0: {"drop_indices": drops}}
    lossy.update(fec_drops or {})
    proxies = proxy_block(targets, lossy)
    base = proxies[0].port
    decoder = FecDecoder(columns, rows, reorder_window_s=window_s)
    try:
        for p in proxies:
            p.start()
        proc = subprocess.Popen(
            [a.replace("{P}", str(base)).replace("{P2}", str(base + 2)).replace("{P4}", str(base + 4)) for a in argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            result = await receive_fec(decoder, media, column, row, idle_s=1.5, max_s=40.0)
        finally:
            finish(proc)
    finally:
        for p in proxies:
            p.stop()
        for sock in (media, column, row):
            sock.close()
    media_proxy = proxies[0]
    assert result.received[0] == media_proxy.stats.forwarded, "kernel loss on loopback"
    assert result.received[1:] == [proxies[1].stats.forwarded, proxies[2].stats.forwarded]
    assert sorted(media_proxy.stats.dropped_indices) == sorted(drops)
    return check_decoded(result.output, decoder, media_proxy.stats.seen, drops, result.fec)


def gst_sender(ts_file: Path, columns: int, rows: int) -> list[str]:
    return [
        GST, "-q", "filesrc", f"location={ts_file}", "blocksize=1316", "!",
        "video/mpegts,systemstream=(boolean)true,packetsize=(int)188", "!",
        "rtpmp2tpay", "ssrc=0", "!", "identity", "sleep-time=1000", "!",
        "rtpst2022-1-fecenc", f"columns={columns}", f"rows={rows}", "name=enc",
        "enc.src", "!", "udpsink", "host=127.0.0.1", "port={P}", "sync=false",
        "enc.fec_0", "!", "udpsink", "host=127.0.0.1", "port={P2}", "sync=false", "async=false",
        "enc.fec_1", "!", "udpsink", "host=127.0.0.1", "port={P4}", "sync=false", "async=false",
    ]  # fmt: skip


def ffmpeg_sender(ts_file: Path, columns: int, rows: int) -> list[str]:
    return [
        "ffmpeg", "-hide_banner", "-loglevel", "error", "-re", "-i", str(ts_file), "-c", "copy",
        "-f", "rtp_mpegts",
        "-mpegts_muxer_options", "muxrate=3000000", "-fec", f"prompeg=l={columns}:d={rows}", "rtp://127.0.0.1:{P}?pkt_size=1328",
    ]  # fmt: skip


@pytest.mark.parametrize(("columns", "rows"), [(5, 4), (10, 10), (20, 4), (4, 20)])
async def test_gstreamer_fecenc_pattern_into_our_decoder(ts_file: Path, columns: int, rows: int) -> None:
    require_tool("gst-inspect-1.0", "rtpst2022-1-fecenc")
    drops = pattern(columns, rows)
    assert max(drops) < n_packets(ts_file) - columns * rows
    rebuilt, gone = await run_external_sender(gst_sender(ts_file, columns, rows), columns, rows, drops)
    assert (rebuilt, gone) == (len(drops) - 4, 4)


async def test_gstreamer_fecenc_random_loss_into_our_decoder(ts_file: Path) -> None:
    require_tool("gst-inspect-1.0", "rtpst2022-1-fecenc")
    drops = random_loss(10, 10, n_packets(ts_file), 0.08, seed=221)
    # The decoder's default, rate-following window (about 0.3 s at this ~1000 packets/s).
    rebuilt, gone = await run_external_sender(gst_sender(ts_file, 10, 10), 10, 10, drops, window_s=None)
    assert rebuilt > 0 and rebuilt + gone == len(drops)


async def test_gstreamer_fecenc_with_fec_loss_too(ts_file: Path) -> None:
    require_tool("gst-inspect-1.0", "rtpst2022-1-fecenc")
    drops = random_loss(5, 4, n_packets(ts_file), 0.08, seed=7)
    fec_loss = {1: {"drop_rate": 0.1, "seed": 3}, 2: {"drop_rate": 0.1, "seed": 4}}
    rebuilt, gone = await run_external_sender(gst_sender(ts_file, 5, 4), 5, 4, drops, fec_drops=fec_loss)
    assert rebuilt > 0 and rebuilt + gone == len(drops)


@pytest.mark.parametrize(("columns", "rows"), [(5, 4), (10, 10), (4, 20), (20, 5)])
async def test_ffmpeg_prompeg_pattern_into_our_decoder(ts_file: Path, columns: int, rows: int) -> None:
    require_tool("ffmpeg", "-version")
    drops = pattern(columns, rows)
    rebuilt, gone = await run_external_sender(ffmpeg_sender(ts_file, columns, rows), columns, rows, drops)
    assert (rebuilt, gone) == (len(drops) - 4, 4)


async def test_ffmpeg_prompeg_random_loss_into_our_decoder(ts_file: Path) -> None:
    require_tool("ffmpeg", "-version")
    drops = random_loss(10, 10, n_packets(ts_file), 0.08, seed=1)
    rebuilt, gone = await run_external_sender(ffmpeg_sender(ts_file, 10, 10), 10, 10, drops)
    assert rebuilt > 0 and rebuilt + gone == len(drops)


@pytest.mark.parametrize(("columns", "rows", "row_fec"), [(5, 4, True), (10, 10, True), (10, 10, False)])
async def test_our_encoder_into_gstreamer_fecdec(ts_file: Path, columns: int, rows: int, row_fec: bool) -> None:
    require_tool("gst-inspect-1.0", "rtpst2022-1-fecdec")
    source = rtp_packets_from_ts(ts_file.read_bytes(), first_seq=65000, ssrc=0)  # wraps; GStreamer's SSRC
    m = columns * rows
    if row_fec:
        drops = pattern(columns, rows)[:-4]  # singles per row and a row burst
    else:
        drops = [m + c * columns + c for c in range(min(columns, rows))] + [2 * m + columns + c for c in range(columns)]
    out_sock = await bound_udp_socket()
    base = free_port_block()
    gst = [
        GST, "-q", "rtpst2022-1-fecdec", "name=dec", "size-time=3000000000", "!",
        "udpsink", "host=127.0.0.1", f"port={port_of(out_sock)}", "sync=false", "async=false",
        "udpsrc", "address=127.0.0.1", f"port={base}",
        "caps=application/x-rtp,media=video,clock-rate=90000,encoding-name=MP2T,payload=33", "!", "dec.sink",
        "udpsrc", "address=127.0.0.1", f"port={base + 2}", "caps=application/x-rtp,payload=96", "!", "dec.fec_0",
        "udpsrc", "address=127.0.0.1", f"port={base + 4}", "caps=application/x-rtp,payload=96", "!", "dec.fec_1",
    ]  # fmt: skip
    proc = subprocess.Popen(gst, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    received: dict[int, bytes] = {}
    try:
        await wait_udp_bound([base, base + 2, base + 4])
        with LossyUdpProxy(("127.0.0.1", base), drop_indices=drops) as media_proxy:
            encoder = FecEncoder(columns, rows, row_fec=row_fec)

            async def collect() -> None:
                buf = bytearray(65536)
                while True:
                    with trio.move_on_after(2.0) as idle:
                        n = await out_sock.recv_into(buf)
                    if idle.cancelled_caught:
                        return
                    received.setdefault(seq_of(buf), bytes(buf[:n]))

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(collect)
                    await send_with_fec(
                        source,
                        encoder,
                        ("127.0.0.1", media_proxy.port),
                        ("127.0.0.1", base + 2),
                        ("127.0.0.1", base + 4),
                        rate_pps=1000,
                    )
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        out_sock.close()
    assert sorted(media_proxy.stats.dropped_indices) == sorted(drops)
    assert encoder.counters.fec_packets_sent > 0
    dropped_seqs = {seq_of(source[i]) for i in drops}
    assert dropped_seqs <= received.keys(), f"GStreamer did not rebuild {sorted(dropped_seqs - received.keys())}"
    assert [received[seq_of(p)] for p in source] == source  # every packet, rebuilt ones bit-identical


def test_port_probe_sees_our_own_socket() -> None:
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        assert udp_port_bound(s.getsockname()[1])
    finally:
        s.close()
