"""RTSP ingest cost: mp-edge pulling a camera against ffmpeg pulling the same camera, in one run.

    python -m bench.rtsp [--quick] [--seconds 20] [--bitrate-kbps 8000] [--size 1280x720]

The camera is Debian's gst-rtsp-server (``tests/helpers/rtsp_server.py``: a live ``videotestsrc``
ball, x264 ultrafast/zerolatency in CBR mode at ``--bitrate-kbps`` (filler data pads the easy
picture to the rate, as a broadcast encoder's CBR does), key frame every 50 frames, 25 fps,
plus AAC 128 kbit/s, RFC 3640), a fresh one per path. Three paths, one after the other:

- **mediaplane tcp**: a real ``mp-edge --workers 1``, a flow with an ``rtsp`` input
  (``transport: tcp``, RTP interleaved on the RTSP connection) and two ``udp`` outputs to local
  sinks: the edge depacketises H.264 + AAC, muxes MPEG-TS, analyses it and sends it twice;
- **mediaplane udp**: the same with ``transport: udp`` (RTP/RTCP on their own port pairs), in
  the same mp-edge (the tcp flow deleted first);
- **ffmpeg**: ``ffmpeg -rtsp_transport tcp -i URL -c copy -f mpegts udp://...`` (one output).

Each path is measured over ``--seconds`` of steady state, which starts one second after the
input reached ``receiving`` (the edge's ``GET /api/v1/stats/{flow}``) or after ffmpeg's first
datagram reached its sink. Measured: the CPU seconds (user + system, ``/proc``) of the box under
test (the mp-edge process tree, or ffmpeg) per second of media, the bytes the sinks received in
that window (the least of the two edge sinks: a broken path cannot look cheap) and the RTP loss
the edge counted (``input.rtsp_stats.rtp_lost``, the whole session). The ratio is mediaplane /
ffmpeg; ffmpeg does less (one output, no analysis), so a ratio above 1 is expected.

The table prints the TS rate the sinks actually received beside the camera's rate.

``--quick`` measures 3 s per path (a smoke run: its figures mean little). Everything binds
127.0.0.1; every process is bounded in time and is gone at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.edge_forward import running_edge
from bench.rtmp import Result, UdpDrain, ffmpeg, log
from bench.tools.procfs import tree_cpu_seconds
from tests.helpers.rtsp_server import GstRtspServer

SETTLE_S: Final = 1.0  # after the input is up, before the window opens
UP_TIMEOUT_S: Final = 30.0  # for the input to reach ``receiving`` / the first datagram
FFMPEG_SLACK_S: Final = 60.0  # ffmpeg's own ``-t`` bound, on top of the run's length
FPS: Final = 25
GOP: Final = 50


@dataclass
class RtspResult(Result):
    """One path; ``rtp_lost`` is the edge's count (None for ffmpeg, which does not say)."""

    rtp_lost: int | None = None

    @property
    def ts_mbps(self) -> float:
        return 8 * self.received_bytes / self.media_s / 1e6 if self.media_s else float("nan")


@dataclass
class Camera:
    """What the gst-rtsp-server camera is asked for."""

    size: str
    bitrate_kbps: int

    def server(self) -> GstRtspServer:
        return GstRtspServer(
            video="h264", audio="aac-hbr", size=self.size, fps=FPS, gop=GOP, bitrate_kbps=self.bitrate_kbps, cbr=True
        )


def _wait_until(what: str, check: Callable[[], bool], timeout_s: float = UP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f} s")
        time.sleep(0.1)


def _window(pid: int, drain: UdpDrain, seconds: float) -> tuple[float, float, int]:
    """Sleep ``seconds`` after SETTLE_S; (media seconds, CPU seconds of ``pid``'s tree, bytes at
    the emptiest sink) over that window."""
    time.sleep(SETTLE_S)
    bytes_before = list(drain.received)
    cpu_before, started = tree_cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    cpu, elapsed = tree_cpu_seconds(pid) - cpu_before, time.monotonic() - started
    return elapsed, cpu, min(after - before for after, before in zip(drain.received, bytes_before, strict=True))


def measure_edge(camera: Camera, transports: tuple[str, ...], seconds: float, workdir: Path) -> list[RtspResult]:
    """One edge, one flow per transport in turn (an rtsp input, two udp outputs, a fresh camera
    each); its process tree's CPU over each window. The flow is deleted before the next."""
    import httpx

    config_dir = workdir / "edge-rtsp"
    config_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with (
        running_edge(config_dir, workdir / "edge-rtsp.log") as (base, pid),
        httpx.Client(base_url=base, timeout=10) as api,
    ):
        for transport in transports:
            drain = UdpDrain(2)
            with contextlib.closing(drain), camera.server() as cam:
                flow_id = f"rtsp-bench-{transport}"
                flow = {
                    "id": flow_id,
                    "name": f"RTSP bench ({transport})",
                    "input": {"type": "rtsp", "rtsp_url": cam.url, "transport": transport},
                    "outputs": [
                        {"type": "udp", "id": f"o{k}", "name": f"o{k}", "dest_addr": f"127.0.0.1:{port}"}
                        for k, port in enumerate(drain.ports)
                    ],
                }
                answer = api.post("/api/v1/flows", json=flow)
                if answer.status_code != 200:
                    raise RuntimeError(f"the edge refused the bench flow: {answer.status_code} {answer.text[:200]}")

                def edge_input(flow_id: str = flow_id) -> dict[str, Any]:
                    data: dict[str, Any] = api.get(f"/api/v1/stats/{flow_id}").json()["data"]["input"]
                    return data

                _wait_until(
                    f"the rtsp input ({transport}) is not receiving", lambda: edge_input()["state"] == "receiving"
                )
                media_s, cpu, received = _window(pid, drain, seconds)
                lost = (edge_input().get("rtsp_stats") or {}).get("rtp_lost")
                api.delete(f"/api/v1/flows/{flow_id}")  # TEARDOWN while the camera is still up
            results.append(RtspResult(f"mediaplane (rtsp {transport} in, 2 udp out)", media_s, cpu, received, lost))
    return results


def measure_ffmpeg(camera: Camera, seconds: float, workdir: Path) -> RtspResult:
    """``ffmpeg -rtsp_transport tcp`` remuxing the camera to TS over UDP; its CPU (``/proc``).

    Bounded by its own ``-t`` as well as by the kill at the end; stderr to ``ffmpeg-rtsp.log``."""
    drain = UdpDrain(1)
    with (
        contextlib.closing(drain),
        (workdir / "ffmpeg-rtsp.log").open("ab") as remux_log,
        camera.server() as cam,
    ):
        remux = subprocess.Popen(
            [
                ffmpeg(),
                "-v",
                "error",
                "-rtsp_transport",
                "tcp",
                "-i",
                cam.url,
                "-t",
                f"{seconds + FFMPEG_SLACK_S:g}",
                "-c",
                "copy",
                "-f",
                "mpegts",
                f"udp://127.0.0.1:{drain.ports[0]}?pkt_size=1316",
            ],
            stdin=subprocess.DEVNULL,
            stderr=remux_log,
        )
        try:
            _wait_until("ffmpeg's sink got nothing", lambda: drain.received[0] > 0 or remux.poll() is not None)
            if remux.poll() is not None:
                raise RuntimeError(f"ffmpeg exited with {remux.returncode}; see {remux_log.name}")
            media_s, cpu, received = _window(remux.pid, drain, seconds)
        finally:
            remux.terminate()
            try:
                remux.wait(10)
            except subprocess.TimeoutExpired:
                remux.kill()
                remux.wait(5)
    return RtspResult("ffmpeg -rtsp_transport tcp -c copy -f mpegts (1 udp out)", media_s, cpu, received)


def run(seconds: float, bitrate_kbps: int, workdir: Path, size: str = "1280x720") -> dict[str, Any]:
    """The three paths (edge tcp, edge udp, ffmpeg); a dict with the table text and the figures."""
    camera = Camera(size, bitrate_kbps)
    log(f"bench.rtsp: camera {size} {FPS} fps H.264 (x264 CBR {bitrate_kbps} kbit/s) + AAC, {seconds:g} s per path")
    results = measure_edge(camera, ("tcp", "udp"), seconds, workdir)
    results.append(measure_ffmpeg(camera, seconds, workdir))
    for r in results:
        log(f"bench.rtsp: {r.name}: {r.cpu_ms_per_media_s:.0f} ms CPU per s of media")
    tcp, udp, peer = results

    def ratio(ours: RtspResult) -> float:
        return ours.cpu_ms_per_media_s / peer.cpu_ms_per_media_s if peer.cpu_s else float("nan")

    lines = [
        f"RTSP ingest, camera {size} {FPS} fps H.264 (x264 CBR {bitrate_kbps} kbit/s) + AAC,"
        f" {seconds:g} s of steady state per path (CPU per second of media):",
        f"  {'path':58} {'CPU':>10} {'TS at sink':>14} {'received':>11} {'RTP lost':>9}",
        *(
            f"  {r.name:58} {r.cpu_ms_per_media_s:5.0f} ms/s {r.ts_mbps:7.2f} Mbit/s"
            f" {r.received_bytes / 1e6:8.1f} MB {'-' if r.rtp_lost is None else r.rtp_lost:>9}"
            for r in results
        ),
        f"  ratio mediaplane / ffmpeg: tcp {ratio(tcp):.2f}, udp {ratio(udp):.2f}",
    ]
    failed = any(r.received_bytes == 0 for r in results)
    if failed:
        lines.append("  FAILED: a sink received nothing")
    return {
        "text": "\n".join(lines),
        "failed": failed,
        "bitrate_kbps": bitrate_kbps,
        "size": size,
        "seconds": seconds,
        "paths": {
            key: {
                "cpu_ms_per_s": round(r.cpu_ms_per_media_s, 1),
                "ts_mbps": round(r.ts_mbps, 3),
                "received_bytes": r.received_bytes,
                "rtp_lost": r.rtp_lost,
            }
            for key, r in zip(("mediaplane_tcp", "mediaplane_udp", "ffmpeg"), results, strict=True)
        },
        "ratio_tcp": round(ratio(tcp), 2),
        "ratio_udp": round(ratio(udp), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rtsp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 s per path (a smoke run)")
    parser.add_argument("--seconds", type=float, default=20.0, help="steady state measured per path")
    parser.add_argument("--bitrate-kbps", type=int, default=8000, help="the camera's x264 CBR bit rate")
    parser.add_argument("--size", default="1280x720", help="the camera's picture, WIDTHxHEIGHT")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs here")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            workdir = args.keep
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mp-bench-rtsp-")))
        result = run(3.0 if args.quick else args.seconds, args.bitrate_kbps, workdir, args.size)
    print(result["text"])
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
