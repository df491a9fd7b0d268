"""WebRTC (WHEP) egress cost: the webrtc worker's CPU per viewer, and how many viewers it holds.

    python -m bench.webrtc [--quick] [--window 10] [--budget 180] [--keep DIR]

The source: ``testsrc2`` 1280x720 at 30 fps, libx264 ``-b:v 8M -maxrate 8M -bufsize 4M -g 60 -bf 0
-preset veryfast`` plus a sine in AAC, written once to an MPEG-TS file, then played in real time
(``ffmpeg -re -stream_loop -1 -c copy -f mpegts udp://...``, bounded by ``-t``) into the ``udp``
input of a flow on a real ``mp-edge --workers 1`` whose only output is ``webrtc`` in
``whep_server`` mode. The viewers are aiortc WHEP clients (H.264 + audio, recvonly, max-bundle,
host candidates on 127.0.0.1 only) in *separate* processes (at most ``VIEWERS_PER_PROCESS`` per
asyncio loop), a fresh set per step; they do not decode: each receiver's assembled frames are
taken off its decoder queue (``services.edge.webrtc.rtc.tap_encoded_frames``) and counted. Each
client socket asks for a 4 MiB receive buffer, and the kernel drops on those sockets are counted
(``/proc/net/udp``), so a slow client shows as *client drops*, not as edge loss.

Measured, per step (N viewers connected, ``SETTLE_S`` for their first keyframe, then a window):

- the webrtc worker's CPU (``utime + stime`` of ``python -m services.edge.webrtc.worker``, the
  mp-edge child, from ``/proc/<pid>/stat``) per second, in % of one core; the rest of mp-edge
  (control process + engine worker: udp input, TS analysis, TS to the webrtc worker) beside it;
  the viewer processes' CPU (not the edge's cost);
- at the viewers: video frames and bytes received in the window (the least viewer), and
  ``packetsLost`` of the receivers' ``inbound-rtp`` stats (grown in the window, summed).

Part 1, CPU per viewer: 0 (the output idle: no viewer), 1, 2, 4, 8 viewers, a ``--window`` each; a
least-squares line (over the clean steps when there are two, else all) gives the fixed part (the
fanout: TS demux, AAC -> Opus once) and the slope per viewer. Part 2, capacity: 4, 8, 16, 24, 32,
40, 48, 56, 64 viewers, ``STEP_S`` each, until the worker saturates (>= 95 % of a core), a viewer
loses packets or gets fewer than 95 % of the frames the window should hold, or ``--budget`` seconds
are spent; the figure is the largest count with zero loss. Part 3, the peer: ``ffmpeg -i udp:// -c
copy -f mpegts udp://`` remuxing the same 8 Mbit/s stream, its CPU over a window (the scale: the
cheapest thing one can do with this stream).

``--quick``: 1 and 2 viewers for 2 s, one capacity step, 2 s of ffmpeg, a 4 s source (a smoke run). Everything
binds 127.0.0.1; every process (edge, players, viewer processes) is bounded in time and killed at
exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench.edge_forward import free_port, running_edge
from bench.rtmp import UdpDrain, ffmpeg, log
from bench.tools.procfs import WEBRTC_WORKER, cpu_seconds, find_descendant, tree_cpu_seconds

FPS: Final = 30
SOURCE_S: Final = 20  # the TS file's length; it is looped
QUICK_SOURCE_S: Final = 4  # --quick: two GOPs, looped the same way (encoding 20 s took most of a smoke run)
SETTLE_S: Final = 3.0  # after the viewers connected: first keyframe (GOP 2 s) and steady state
STEP_S: Final = 5.0  # the window of a capacity step (SETTLE_S + STEP_S = 8 s)
CONNECT_TIMEOUT_S: Final = 60.0  # for a set of viewers to connect
VIEWERS_PER_PROCESS: Final = 16
CAPACITY_STEPS: Final = (4, 8, 16, 24, 32, 40, 48, 56, 64)
FIT_COUNTS: Final = (1, 2, 4, 8)
SATURATED: Final = 0.95  # of one core
MIN_FRAMES: Final = 0.95  # of the frames a window should hold
BEHIND_BYTES: Final = 1_000_000  # unread at the viewers' sockets: > 0.1 s of 8 Mbit/s per viewer
HOST_BUSY: Final = 0.90  # of all CPUs: a loss then may be CPU starvation of anyone
CLIENT_RCVBUF: Final = 4 * 1024 * 1024
FLOW_ID: Final = "webrtc-bench"


# ------------------------------------------------------------------------------------ media
def make_source(workdir: Path, seconds: int = SOURCE_S) -> Path:
    """The 8 Mbit/s H.264 + AAC TS file (made once per run)."""
    out = workdir / f"webrtc-source-8M-{seconds}s.ts"
    if out.exists():
        return out
    subprocess.run(
        [
            ffmpeg(),
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            f"testsrc2=size=1280x720:rate={FPS}:duration={seconds}",
            "-f",
            "lavfi",
            "-i",
            f"sine=frequency=1000:sample_rate=48000:duration={seconds}",
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-b:v",
            "8M",
            "-maxrate",
            "8M",
            "-bufsize",
            "4M",
            "-g",
            "60",
            "-bf",
            "0",
            "-pix_fmt",
            "yuv420p",
            "-c:a",
            "aac",
            "-b:a",
            "128k",
            "-f",
            "mpegts",
            str(out),
        ],
        check=True,
        timeout=600,
    )
    return out


@contextlib.contextmanager
def player(source: Path, port: int, seconds: float, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``ffmpeg -re -stream_loop -1`` of ``source`` to ``udp://127.0.0.1:port``, for at most ``seconds``."""
    with log_path.open("ab") as err:
        process = subprocess.Popen(
            [
                ffmpeg(),
                "-v",
                "error",
                "-re",
                "-stream_loop",
                "-1",
                "-i",
                str(source),
                "-t",
                f"{seconds:.0f}",
                "-c",
                "copy",
                "-f",
                "mpegts",
                f"udp://127.0.0.1:{port}?pkt_size=1316",
            ],
            stdin=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        yield process
    finally:
        _end(process)


def _end(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# ------------------------------------------------------------------------------------ viewer child
class _Viewer:
    """One aiortc WHEP viewer that counts assembled frames instead of decoding them."""

    def __init__(self) -> None:
        self.pc: Any = None
        self.location: str | None = None
        self.frames = 0
        self.bytes = 0
        self.audio_frames = 0
        self.last_ts = 0  # the newest frame's RTP timestamp (90 kHz, unwrapped from 0)
        self.inodes: set[int] = set()

    def _on_video(self, data: bytes, timestamp: int) -> None:
        self.frames += 1
        self.bytes += len(data)
        self.last_ts = max(self.last_ts, timestamp)

    def _on_audio(self, _data: bytes, _timestamp: int) -> None:
        self.audio_frames += 1

    async def connect(self, client: Any, url: str, timeout: float) -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
        from aiortc.rtcconfiguration import RTCBundlePolicy

        from services.edge.webrtc.rtc import tap_encoded_frames

        pc = self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[], bundlePolicy=RTCBundlePolicy.MAX_BUNDLE))
        connected = asyncio.Event()
        pc.on("connectionstatechange", lambda: connected.set() if pc.connectionState == "connected" else None)
        video = pc.addTransceiver("video", direction="recvonly")
        capabilities = RTCRtpReceiver.getCapabilities("video")
        codecs = capabilities.codecs if capabilities else []
        h264 = sorted(
            (c for c in codecs if c.mimeType.lower() == "video/h264"),
            key=lambda c: c.parameters.get("profile-level-id", "") != "42e01f",
        )
        video.setCodecPreferences(h264 + [c for c in codecs if c.mimeType.lower() == "video/rtx"])
        audio = pc.addTransceiver("audio", direction="recvonly")
        tap_encoded_frames(video.receiver, self._on_video)
        tap_encoded_frames(audio.receiver, self._on_audio)
        await asyncio.wait_for(pc.setLocalDescription(await pc.createOffer()), timeout)
        answer = await client.post(url, content=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"})
        if answer.status_code != 201:
            raise RuntimeError(f"WHEP POST: {answer.status_code} {answer.text[:200]}")
        self.location = answer.headers.get("location")
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        await asyncio.wait_for(connected.wait(), timeout)
        self._grow_buffers()

    def _grow_buffers(self) -> None:
        """A 4 MiB receive buffer on each ICE socket (capped by rmem_max); their inodes for the drop count."""
        for transceiver in self.pc.getTransceivers():
            with contextlib.suppress(AttributeError):
                for protocol in transceiver.receiver.transport.transport._connection._protocols:
                    sock = protocol.transport.get_extra_info("socket")
                    if sock is None:
                        continue
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
                    self.inodes.add(os.fstat(sock.fileno()).st_ino)

    async def lost(self) -> int:
        """``packetsLost`` summed over the receivers' ``inbound-rtp`` stats."""
        total = 0
        with contextlib.suppress(Exception):
            for report in (await self.pc.getStats()).values():
                if report.type == "inbound-rtp":
                    total += int(report.packetsLost or 0)
        return total

    async def snapshot(self) -> dict[str, int]:
        lost = await self.lost()
        return {
            "frames": self.frames,
            "bytes": self.bytes,
            "audio": self.audio_frames,
            "lost": lost,
            "ts": self.last_ts,
        }


def _socket_counts(inodes: set[int]) -> tuple[int, int]:
    """The kernel's drops on these UDP sockets (``drops``, the last column of /proc/net/udp) and
    the bytes queued on them unread (``rx_queue``): a viewer that is behind holds a queue."""
    drops = queued = 0
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 13 and int(parts[9]) in inodes:
            drops += int(parts[12])
            queued += int(parts[4].split(":")[1], 16)
    return drops, queued


def _emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _viewer_child(base: str, flow_id: str, count: int, timeout: float) -> None:
    """Connect ``count`` viewers; on ``start`` and ``stop`` lines (stdin) report their counters;
    then DELETE the sessions and close. Output: one JSON line per event (stdout)."""
    import aioice.ice
    import httpx

    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]  # loopback only
    loop = asyncio.get_running_loop()
    viewers = [_Viewer() for _ in range(count)]
    url = f"{base}/api/v1/flows/{flow_id}/whep"
    gate = asyncio.Semaphore(4)  # DTLS handshakes a few at a time
    errors: list[str] = []
    async with httpx.AsyncClient(timeout=timeout) as client:

        async def one(viewer: _Viewer) -> None:
            async with gate:
                try:
                    await viewer.connect(client, url, timeout)
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])

        try:
            await asyncio.gather(*(one(v) for v in viewers))
            up = [v for v in viewers if v.pc is not None and v.pc.connectionState == "connected"]
            _emit({"event": "connected", "connected": len(up), "errors": errors[:5]})
            inodes = set().union(*(v.inodes for v in up)) if up else set()
            for event in ("started", "stopped"):
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    return
                snaps = [await v.snapshot() for v in up]
                drops, queued = _socket_counts(inodes)
                _emit({"event": event, "viewers": snaps, "drops": drops, "queued": queued, "t": time.monotonic()})
        finally:
            for viewer in viewers:
                if viewer.location:
                    with contextlib.suppress(Exception):
                        await client.delete(httpx.URL(base + "/").join(viewer.location))
                if viewer.pc is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(viewer.pc.close(), 5)


# ------------------------------------------------------------------------------------ viewer processes
class ViewerProcesses:
    """N viewers spread over ``ceil(N / VIEWERS_PER_PROCESS)`` child processes, driven line by line."""

    def __init__(self, base: str, flow_id: str, count: int, lifetime_s: float, log_path: Path) -> None:
        self.count = count
        per = max(1, math.ceil(count / max(1, math.ceil(count / VIEWERS_PER_PROCESS))))
        sizes = [min(per, count - k) for k in range(0, count, per)]
        self.processes: list[subprocess.Popen[str]] = []
        with log_path.open("ab") as err:
            for size in sizes:
                self.processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "bench.webrtc",
                            "--viewer-child",
                            base,
                            flow_id,
                            str(size),
                            f"{lifetime_s}",
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                        cwd=Path(__file__).resolve().parent.parent,
                    )
                )

    def read_all(self, event: str, timeout_s: float) -> list[dict[str, Any]]:
        """One ``event`` line from every child, within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        out: dict[int, dict[str, Any]] = {}
        with selectors.DefaultSelector() as selector:
            for index, process in enumerate(self.processes):
                assert process.stdout is not None
                selector.register(process.stdout, selectors.EVENT_READ, index)
            while len(out) < len(self.processes):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"viewer processes: no {event!r} after {timeout_s:.0f} s")
                for key, _ in selector.select(remaining):
                    line = key.fileobj.readline()  # type: ignore[union-attr]
                    if not line:
                        raise RuntimeError(f"a viewer process exited before {event!r}")
                    message = json.loads(line)
                    if message.get("event") == event:
                        out[key.data] = message
                        selector.unregister(key.fileobj)
        return [out[k] for k in sorted(out)]

    def send(self, line: str) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(line + "\n")
            process.stdin.flush()

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.processes)

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
        deadline = time.monotonic() + 15
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
            for stream in (process.stdout,):
                if stream is not None:
                    stream.close()


# ------------------------------------------------------------------------------------ steps
@dataclass
class Step:
    viewers: int
    connected: int
    window_s: float
    worker_cpu: float  # cores (CPU s per s)
    rest_cpu: float  # the rest of mp-edge, cores
    client_cpu: float  # the viewer processes, cores
    min_frames: int = 0
    min_mbps: float = 0.0
    lost: int = 0
    missing: int = 0  # by RTP timestamps, summed over viewers
    client_drops: int = 0
    client_queued: int = 0  # bytes unread on the viewers' sockets at the window's end
    host_busy: float = 0.0  # the whole host's busy share of all CPUs in the window
    errors: list[str] = field(default_factory=list)

    @property
    def expected_frames(self) -> float:
        return FPS * self.window_s

    @property
    def clean(self) -> bool:
        return (
            self.connected == self.viewers
            and self.lost == 0
            and (self.viewers == 0 or self.min_frames >= MIN_FRAMES * self.expected_frames)
        )

    def verdict(self) -> str:
        if self.connected != self.viewers:
            return "CONNECT"
        if self.clean:
            return "ok"
        if self.lost or self.missing:
            what = "LOSS"
        else:  # frames late, none missing: the viewers are behind (their sockets hold a queue) or the edge sent late
            what = "SHORT, viewers behind" if self.client_queued > BEHIND_BYTES else "SHORT, edge late"
        return f"{what} (host busy)" if self.host_busy >= HOST_BUSY else what

    def line(self) -> str:
        frames = f"{self.min_frames}/{self.expected_frames:.0f}" if self.viewers else "-"
        mbps = f"{self.min_mbps:.2f}" if self.viewers else "-"
        return COLUMNS.format(
            self.viewers,
            self.connected,
            f"{100 * self.worker_cpu:.1f} %",
            f"{100 * self.rest_cpu:.1f} %",
            f"{100 * self.client_cpu:.1f} %",
            f"{100 * self.host_busy:.0f} %",
            frames,
            mbps,
            self.lost,
            self.missing,
            self.client_drops,
            f"{self.client_queued / 1e3:.0f}" if self.viewers else "-",
            self.verdict(),
        )


COLUMNS: Final = "  {:>7} {:>5} {:>10} {:>12} {:>12} {:>9} {:>15} {:>11} {:>6} {:>7} {:>8} {:>8}  {}"
HEADER: Final = COLUMNS.format(
    "viewers",
    "conn.",
    "webrtc wkr",
    "rest of edge",
    "viewer procs",
    "host busy",
    "frames min/exp",
    "Mbit/s min",
    "lost",
    "missing",
    "cl.drops",
    "cl.kB q.",
    "verdict",
)


def host_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from the ``cpu`` line of /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def run_step(
    base: str, edge_pid: int, worker_pid: int, viewers: int, window_s: float, workdir: Path, settle_s: float = SETTLE_S
) -> Step:
    """N viewers connected, ``settle_s``, then CPU and counters over ``window_s``."""
    group = ViewerProcesses(
        base, FLOW_ID, viewers, CONNECT_TIMEOUT_S + settle_s + window_s + 30, workdir / "viewers.log"
    )
    try:
        connected, errors = 0, []
        if viewers:
            for message in group.read_all("connected", CONNECT_TIMEOUT_S + 10):
                connected += message["connected"]
                errors += message["errors"]
        time.sleep(settle_s)
        if viewers:
            group.send("start")
            before = group.read_all("started", 20)
        w0, t0, c0, started = (
            cpu_seconds(worker_pid),
            tree_cpu_seconds(edge_pid),
            group.cpu_seconds(),
            time.monotonic(),
        )
        h0 = host_busy_ticks()
        time.sleep(window_s)
        h1 = host_busy_ticks()
        w1, t1, c1, elapsed = (
            cpu_seconds(worker_pid),
            tree_cpu_seconds(edge_pid),
            group.cpu_seconds(),
            time.monotonic() - started,
        )
        step = Step(
            viewers,
            connected,
            elapsed,
            (w1 - w0) / elapsed,
            ((t1 - t0) - (w1 - w0)) / elapsed,
            (c1 - c0) / elapsed,
            host_busy=(h1[0] - h0[0]) / max(1, h1[1] - h0[1]),
            errors=errors,
        )
        if viewers:
            group.send("stop")
            after = group.read_all("stopped", 20)
            deltas = [
                {key: b[key] - a[key] for key in ("frames", "bytes", "lost", "ts")}
                for ga, gb in zip(before, after, strict=True)
                for a, b in zip(ga["viewers"], gb["viewers"], strict=True)
            ]
            window = sum(gb["t"] - ga["t"] for ga, gb in zip(before, after, strict=True)) / len(after)
            step.window_s = window
            step.min_frames = min((d["frames"] for d in deltas), default=0)
            step.min_mbps = min((8 * d["bytes"] / window / 1e6 for d in deltas), default=0.0)
            step.lost = sum(d["lost"] for d in deltas)
            # frames the stream's RTP timestamps say were sent in the window but never arrived
            # (a viewer that is merely late counts them later: it is slow, not losing)
            step.missing = sum(max(0, round(d["ts"] / (90000 / FPS)) - d["frames"]) for d in deltas)
            step.client_drops = sum(gb["drops"] - ga["drops"] for ga, gb in zip(before, after, strict=True))
            step.client_queued = sum(gb["queued"] for gb in after)
        return step
    finally:
        group.close()


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``cpu = fixed + slope * viewers``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")
    return my - slope * mx, slope


def measure_ffmpeg(source: Path, window_s: float, workdir: Path) -> tuple[float, int]:
    """ffmpeg remuxing the played stream (udp in, TS over udp out): cores over ``window_s`` and bytes out."""
    in_port = free_port(socket.SOCK_DGRAM)
    drain = UdpDrain(1)
    with contextlib.closing(drain), (workdir / "ffmpeg-remux.log").open("ab") as err:
        remux = subprocess.Popen(
            [
                ffmpeg(),
                "-v",
                "error",
                "-i",
                f"udp://127.0.0.1:{in_port}?fifo_size=1000000&overrun_nonfatal=1",
                "-t",
                f"{window_s + 60:.0f}",
                "-c",
                "copy",
                "-f",
                "mpegts",
                f"udp://127.0.0.1:{drain.ports[0]}?pkt_size=1316",
            ],
            stdin=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            with player(source, in_port, window_s + 60, workdir / "player-ffmpeg.log"):
                deadline = time.monotonic() + 30
                while drain.received[0] == 0 and remux.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                if drain.received[0] == 0:
                    raise RuntimeError(f"ffmpeg remux sent nothing; see {err.name}")
                time.sleep(1.0)
                c0, b0, started = cpu_seconds(remux.pid), drain.received[0], time.monotonic()
                time.sleep(window_s)
                elapsed = time.monotonic() - started
                measured = (cpu_seconds(remux.pid) - c0) / elapsed, drain.received[0] - b0
                # ended while its input still flows: once the player stops, ffmpeg sits in its udp
                # read and ignores SIGTERM, and _end waited its full 10 s before killing it
                _end(remux)
                return measured
        finally:
            _end(remux)


# ------------------------------------------------------------------------------------ the run
def run(workdir: Path, *, quick: bool = False, window_s: float = 10.0, budget_s: float = 180.0) -> dict[str, Any]:
    """Parts 1-3; a dict with the table text (``text``), ``failed`` and the figures."""
    import httpx

    fit_counts = (1, 2) if quick else FIT_COUNTS
    capacity_steps = (4,) if quick else CAPACITY_STEPS
    window = 2.0 if quick else window_s
    step_s = 2.0 if quick else STEP_S
    if quick:
        budget_s = 30.0
    source_s = QUICK_SOURCE_S if quick else SOURCE_S
    log(f"bench.webrtc: making the 8 Mbit/s source ({source_s} s of 1280x720 {FPS} fps, x264 veryfast)")
    source = make_source(workdir, source_s)
    peer_cpu, peer_bytes = measure_ffmpeg(source, window, workdir)
    log(f"bench.webrtc: ffmpeg remux {100 * peer_cpu:.1f} % of a core")

    part1: list[Step] = []
    part2: list[Step] = []
    stop_reason = "all steps clean"
    config_dir = workdir / "edge-webrtc"
    config_dir.mkdir(parents=True, exist_ok=True)
    in_port = free_port(socket.SOCK_DGRAM)
    play_s = 60 + len(fit_counts) * (window + 40) + budget_s + 120
    with (
        running_edge(config_dir, workdir / "edge-webrtc.log") as (base, edge_pid),
        httpx.Client(base_url=base, timeout=10) as api,
    ):
        flow = {
            "id": FLOW_ID,
            "name": "WebRTC bench",
            "input": {"type": "udp", "bind_addr": f"127.0.0.1:{in_port}"},
            "outputs": [{"type": "webrtc", "id": "whep", "name": "whep", "mode": "whep_server"}],
        }
        answer = api.post("/api/v1/flows", json=flow)
        if answer.status_code != 200:
            raise RuntimeError(f"the edge refused the bench flow: {answer.status_code} {answer.text[:200]}")
        worker_pid = find_descendant(edge_pid, WEBRTC_WORKER, timeout_s=30.0)
        with player(source, in_port, play_s, workdir / "player-edge.log") as play:
            deadline = time.monotonic() + 30
            while api.get(f"/api/v1/stats/{FLOW_ID}").json()["data"]["input"]["state"] != "receiving":
                if time.monotonic() > deadline or play.poll() is not None:
                    raise RuntimeError("the flow's udp input is not receiving")
                time.sleep(0.2)
            for count in (0, *fit_counts):
                step = run_step(
                    base, edge_pid, worker_pid, count, window, workdir, settle_s=1.0 if count == 0 else SETTLE_S
                )
                log(f"bench.webrtc: part 1 {step.line()}")
                part1.append(step)
            started = time.monotonic()
            for count in capacity_steps:
                spent = time.monotonic() - started
                if spent + SETTLE_S + step_s + 10 + count * 0.5 > budget_s:
                    stop_reason = f"time budget ({budget_s:.0f} s) spent before {count} viewers"
                    break
                step = run_step(base, edge_pid, worker_pid, count, step_s, workdir)
                log(f"bench.webrtc: part 2 {step.line()}")
                part2.append(step)
                if not step.clean:
                    stop_reason = f"{step.verdict()} at {count} viewers"
                    break
                if step.worker_cpu >= SATURATED:
                    stop_reason = f"worker saturated at {count} viewers ({100 * step.worker_cpu:.0f} % of a core)"
                    break
            if play.poll() is not None:
                log("bench.webrtc: the player ended early (figures after that are void)")
        with contextlib.suppress(httpx.HTTPError):
            api.delete(f"/api/v1/flows/{FLOW_ID}")

    # a step whose viewers fell behind on a starved host under-reports what the worker needs:
    # fit the clean steps when there are two, else every step (and say which)
    fitted = [s for s in part1 if s.viewers and s.clean]
    if len(fitted) < 2:
        fitted = [s for s in part1 if s.viewers]
    fixed, slope = fit([(s.viewers, s.worker_cpu) for s in fitted])
    fit_note = (
        ", ".join(str(s.viewers) for s in fitted)
        + " viewers"
        + (" (the clean steps)" if all(s.clean for s in fitted) and len(fitted) < len(fit_counts) else "")
    )
    clean_counts = [s.viewers for s in part2 if s.clean]
    held = max(clean_counts, default=0)
    idle = part1[0].worker_cpu
    one = part1[1] if len(part1) > 1 else None
    lines = [
        f"WebRTC (WHEP) egress, one flow 8 Mbit/s H.264 1280x720 {FPS} fps (x264 veryfast, GOP 60, no B) + AAC,"
        " aiortc viewers (no decoding) in separate processes; CPU in % of one core:",
        f"  part 1: CPU per viewer, {window:g} s windows" + (" (0 = output idle, no viewer)" if part1 else ""),
        HEADER,
        *(s.line() for s in part1),
        f"  webrtc worker: fixed (fanout: TS demux + AAC->Opus once) {100 * fixed:.1f} %,"
        f" per viewer {100 * slope:.1f} % (least squares over {fit_note});"
        f" idle output {100 * idle:.1f} %",
        f"  viewer processes: {100 * one.client_cpu:.1f} % for 1 viewer" if one else "",
        f"  part 2: capacity, {SETTLE_S:g} s settle + {step_s:g} s window per step, budget {budget_s:.0f} s",
        HEADER,
        *(s.line() for s in part2),
        f"  largest viewer count at zero loss: {held} (stopped: {stop_reason})",
        f"  peer: ffmpeg -i udp:// -c copy -f mpegts udp:// (remux of the same stream): {100 * peer_cpu:.1f} %"
        f" ({8 * peer_bytes / window / 1e6:.2f} Mbit/s out);"
        + (f" one WHEP viewer costs {slope / peer_cpu:.1f}x that remux" if peer_cpu > 0 else ""),
    ]
    failed = not part1 or any(s.viewers and s.connected == 0 for s in part1)
    if failed:
        lines.append("  FAILED: a step had no connected viewer")
    steps = [s.__dict__ | {"clean": s.clean} for s in part1 + part2]
    return {
        "text": "\n".join(line for line in lines if line),
        "failed": failed,
        "fixed_pct": round(100 * fixed, 2),
        "fit_over": [s.viewers for s in fitted],
        "per_viewer_pct": round(100 * slope, 2),
        "idle_pct": round(100 * idle, 2),
        "max_viewers_zero_loss": held,
        "stop_reason": stop_reason,
        "ffmpeg_remux_pct": round(100 * peer_cpu, 2),
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--viewer-child"]:
        base, flow_id, count, lifetime = argv[1], argv[2], int(argv[3]), float(argv[4])
        with contextlib.suppress(TimeoutError):
            asyncio.run(asyncio.wait_for(_viewer_child(base, flow_id, count, 15.0), lifetime))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.webrtc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (figures mean little)")
    parser.add_argument("--window", type=float, default=10.0, help="part 1's window per viewer count, seconds")
    parser.add_argument("--budget", type=float, default=180.0, help="part 2's time budget, seconds")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs (and the source file) here")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            workdir = args.keep
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mp-bench-webrtc-")))
        result = run(workdir, quick=args.quick, window_s=args.window, budget_s=args.budget)
    print(result["text"])
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
