"""RTMP ingest cost: mp-edge against ffmpeg, in one run.

    python -m bench.rtmp [--quick] [--seconds 20] [--bitrate-kbps 8000]

One H.264/AAC source (``testsrc2`` 1280x720 at 25 fps, x264 at ``--bitrate-kbps``, AAC 128 kbit/s,
made once with ffmpeg into an FLV file) is published in real time (``ffmpeg -re -c copy -f flv``)
twice, one after the other:

- **mediaplane**: into a real ``mp-edge --workers 1``, a flow with an ``rtmp`` input and two
  ``udp`` outputs to local sinks: the edge takes RTMP, rebuilds MPEG-TS (``core.mux``), analyses
  it and sends it twice;
- **ffmpeg**: into ``ffmpeg -listen 1 -i rtmp://... -c copy -f mpegts udp://...`` (one output):
  the plain RTMP to TS remux.

Measured: the CPU seconds (user + system) of the box under test (the mp-edge process tree, or
the remuxing ffmpeg) per second of media published, and that the sinks received the stream.
The ratio is mediaplane / ffmpeg. ffmpeg does less (one output, no analysis), so a ratio above
1 is expected; the figure to watch is the edge's own CPU per second of media.

``--quick`` publishes 3 s (a smoke run: its figures mean little). Everything binds 127.0.0.1;
every process is bounded in time and is gone at exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.edge_forward import free_port, running_edge
from bench.tools.procfs import tree_cpu_seconds

STREAM_KEY: Final = "bench"
APP: Final = "live"
PUBLISH_SLACK_S: Final = 30.0  # on top of the media's duration, for a publisher to finish


@dataclass
class Result:
    """One measured path."""

    name: str
    media_s: float
    cpu_s: float
    received_bytes: int

    @property
    def cpu_ms_per_media_s(self) -> float:
        return 1000.0 * self.cpu_s / self.media_s if self.media_s else float("nan")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ffmpeg() -> str:
    path = shutil.which("ffmpeg")
    if path is None:
        raise RuntimeError("ffmpeg is not installed (tools/ensure-debs.sh installs it)")
    return path


def make_source(workdir: Path, seconds: float, bitrate_kbps: int) -> Path:
    """An H.264/AAC FLV file of ``seconds`` at ``bitrate_kbps`` (made once per run)."""
    out = workdir / f"source-{bitrate_kbps}k-{seconds:g}s.flv"
    if out.exists():
        return out
    rate = f"{bitrate_kbps}k"
    subprocess.run(
        [
            ffmpeg(),
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            f"testsrc2=size=1280x720:rate=25:duration={seconds}",
            "-f",
            "lavfi",
            "-i",
            f"sine=frequency=1000:sample_rate=48000:duration={seconds}",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-g",
            "50",
            "-b:v",
            rate,
            "-minrate",
            rate,
            "-maxrate",
            rate,
            "-bufsize",
            rate,
            "-c:a",
            "aac",
            "-b:a",
            "128k",
            "-f",
            "flv",
            str(out),
        ],
        check=True,
        timeout=300,
    )
    return out


class UdpDrain:
    """UDP sockets on 127.0.0.1 that count what arrives, in one thread (bounded by ``close``)."""

    def __init__(self, count: int) -> None:
        self.sockets = []
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(0.2)
            self.sockets.append(sock)
        self.received = [0] * count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def ports(self) -> list[int]:
        return [sock.getsockname()[1] for sock in self.sockets]

    def _run(self) -> None:
        import selectors

        selector = selectors.DefaultSelector()
        for index, sock in enumerate(self.sockets):
            selector.register(sock, selectors.EVENT_READ, index)
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.2):
                with contextlib.suppress(OSError):
                    self.received[key.data] += len(key.fileobj.recv(65535))  # type: ignore[union-attr]
        selector.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.sockets:
            sock.close()


def wait_listening(port: int, timeout_s: float = 20.0) -> None:
    """Until something accepts TCP connections on 127.0.0.1:port (probes connect and close)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")
        time.sleep(0.05)


def publish(source: Path, url: str, seconds: float) -> None:
    """Publish ``source`` in real time to ``url`` (``-re -c copy -f flv``); raises if ffmpeg fails."""
    subprocess.run(
        [ffmpeg(), "-v", "error", "-re", "-i", str(source), "-c", "copy", "-f", "flv", url],
        check=True,
        timeout=seconds + PUBLISH_SLACK_S,
    )


def measure_edge(source: Path, seconds: float, workdir: Path) -> Result:
    """The edge: rtmp input, two udp outputs; its process tree's CPU over the publication."""
    import httpx

    config_dir = workdir / "edge-rtmp"
    config_dir.mkdir(parents=True, exist_ok=True)
    rtmp_port = free_port()
    drain = UdpDrain(2)
    try:
        with running_edge(config_dir, workdir / "edge-rtmp.log") as (base, pid):
            flow = {
                "id": "rtmp-bench",
                "name": "RTMP bench",
                "input": {
                    "type": "rtmp",
                    "listen_addr": f"127.0.0.1:{rtmp_port}",
                    "app": APP,
                    "stream_key": STREAM_KEY,
                },
                "outputs": [
                    {"type": "udp", "id": f"o{k}", "name": f"o{k}", "dest_addr": f"127.0.0.1:{port}"}
                    for k, port in enumerate(drain.ports)
                ],
            }
            with httpx.Client(base_url=base, timeout=10) as api:
                answer = api.post("/api/v1/flows", json=flow)
                if answer.status_code != 200:
                    raise RuntimeError(f"the edge refused the bench flow: {answer.status_code} {answer.text[:200]}")
            wait_listening(rtmp_port)
            cpu_before = tree_cpu_seconds(pid)
            publish(source, f"rtmp://127.0.0.1:{rtmp_port}/{APP}/{STREAM_KEY}", seconds)
            cpu = tree_cpu_seconds(pid) - cpu_before
    finally:
        drain.close()
    return Result("mediaplane (rtmp in, 2 udp out)", seconds, cpu, min(drain.received))


def measure_ffmpeg(source: Path, seconds: float, workdir: Path) -> Result:
    """``ffmpeg -listen 1`` remuxing RTMP to TS over UDP; its own CPU (``wait4``'s rusage).

    Its stderr goes to ``ffmpeg-remux.log``: ffmpeg's listener reports the publisher's close as
    an "Input/output error" (it ignores FCUnpublish), which is not a failure."""
    rtmp_port = free_port()
    drain = UdpDrain(1)
    remux_log = (workdir / "ffmpeg-remux.log").open("ab")
    remux = subprocess.Popen(
        [
            ffmpeg(),
            "-v",
            "error",
            "-listen",
            "1",
            "-i",
            f"rtmp://127.0.0.1:{rtmp_port}/{APP}/{STREAM_KEY}",
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
        wait_for_bound(rtmp_port)
        publish(source, f"rtmp://127.0.0.1:{rtmp_port}/{APP}/{STREAM_KEY}", seconds)
        deadline = time.monotonic() + PUBLISH_SLACK_S
        while True:  # the remux ends when the publisher does
            pid, status, usage = os.wait4(remux.pid, os.WNOHANG)
            if pid:
                remux.returncode = os.waitstatus_to_exitcode(status)
                cpu = usage.ru_utime + usage.ru_stime
                break
            if time.monotonic() > deadline:
                raise TimeoutError("ffmpeg's remux did not end after its publisher")
            time.sleep(0.05)
    finally:
        if remux.returncode is None:
            remux.kill()
            remux.wait(5)
        remux_log.close()
        drain.close()
    return Result("ffmpeg -listen 1 -c copy -f mpegts (1 udp out)", seconds, cpu, drain.received[0])


def wait_for_bound(port: int, timeout_s: float = 20.0) -> None:
    """Until a TCP socket listens on 127.0.0.1:port, read from /proc/net/tcp (no probe
    connection: ffmpeg -listen 1 takes the first connection as its publisher)."""
    wanted = f"0100007F:{port:04X}"
    deadline = time.monotonic() + timeout_s
    while True:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        if any(line.split()[1] == wanted and line.split()[3] == "0A" for line in lines):  # 0A: LISTEN
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"ffmpeg does not listen on 127.0.0.1:{port} after {timeout_s:.0f} s")
        time.sleep(0.05)


def run(seconds: float, bitrate_kbps: int, workdir: Path) -> dict[str, Any]:
    """Both paths, the edge first; a dict with the table text and the figures."""
    source = make_source(workdir, seconds, bitrate_kbps)
    log(f"bench.rtmp: {seconds:g} s of {bitrate_kbps} kbit/s H.264 + AAC, published in real time")
    ours = measure_edge(source, seconds, workdir)
    log(f"bench.rtmp: mediaplane {ours.cpu_ms_per_media_s:.0f} ms CPU per s of media")
    peer = measure_ffmpeg(source, seconds, workdir)
    log(f"bench.rtmp: ffmpeg {peer.cpu_ms_per_media_s:.0f} ms CPU per s of media")
    ratio = ours.cpu_ms_per_media_s / peer.cpu_ms_per_media_s if peer.cpu_s else float("nan")
    lines = [
        f"RTMP ingest, {bitrate_kbps} kbit/s H.264 + AAC for {seconds:g} s (CPU per second of media):",
        *(
            f"  {r.name:52} {r.cpu_ms_per_media_s:7.0f} ms/s   received {r.received_bytes / 1e6:8.1f} MB"
            for r in (ours, peer)
        ),
        f"  ratio mediaplane / ffmpeg: {ratio:.2f}",
    ]
    failed = ours.received_bytes == 0 or peer.received_bytes == 0
    if failed:
        lines.append("  FAILED: a sink received nothing")
    return {
        "text": "\n".join(lines),
        "failed": failed,
        "bitrate_kbps": bitrate_kbps,
        "seconds": seconds,
        "mediaplane_cpu_ms_per_s": round(ours.cpu_ms_per_media_s, 1),
        "ffmpeg_cpu_ms_per_s": round(peer.cpu_ms_per_media_s, 1),
        "ratio": round(ratio, 2),
    }


@contextlib.contextmanager
def _workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="mp-bench-rtmp-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rtmp", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 s of media (a smoke run)")
    parser.add_argument("--seconds", type=float, default=20.0, help="media published per path")
    parser.add_argument("--bitrate-kbps", type=int, default=8000, help="the video bit rate")
    parser.add_argument("--keep", type=Path, default=None, help="keep the source and the logs here")
    args = parser.parse_args(argv)
    with _workdir(args.keep) as workdir:
        result = run(3.0 if args.quick else args.seconds, args.bitrate_kbps, workdir)
    print(result["text"])
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
