"""Thumbnails and audio levels for the status page, decoded by ffmpeg in its own process.

How the picture gets out of the engine without touching its packet loop: while someone
watches the page, each running flow gets a hidden, hot-added raw-UDP output (the engine's
ordinary ``udp`` output driver, ``TAP_OUTPUT_ID``) that sends a copy of the flow's TS to a
loopback socket this module bound. That socket is handed to ``ffmpeg`` as its stdin
(``-i pipe:0``; each ``read`` is one datagram of whole TS packets), so there is no port to
race for and nothing is decoded in the control process or in the worker. ffmpeg decodes key
frames only (``-skip_frame nokey``: one picture per GOP, a fraction of a full decode), scales
them to ``THUMB_WIDTH`` and writes JPEGs to its stdout, which this side splits and keeps
(latest only). The tap is not part of the configuration: it never appears in the stats, the
config or the metrics, and it is removed when the last viewer leaves or the flow stops.
A flow restarted by the service loses its tap with its runtime; the missing pictures make
the session restart (``STALE_AFTER_S``), which adds it again.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import socket
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import trio

from appliance.models.config import UdpOutput

_log = logging.getLogger("mediaplane.edge.status")

TAP_OUTPUT_ID: Final = "mp-status-thumbnail"
THUMB_WIDTH: Final = 320
STALE_AFTER_S: Final = 15.0  # no picture for this long: restart ffmpeg and the tap
RETRY_AFTER_S: Final = 3.0
MAX_JPEG_BYTES: Final = 2 * 1024 * 1024
RECV_BUFFER: Final = 4 * 1024 * 1024
MAX_RETRY_S: Final = 60.0
AUDIO_WINDOW_SAMPLES: Final = 12000  # 0.25 s at 48 kHz

AddTap = Callable[[str, UdpOutput], Awaitable[None]]
RemoveTap = Callable[[str, str], Awaitable[None]]


@dataclass(frozen=True)
class Thumbnail:
    version: int
    jpeg: bytes
    at: float  # trio time of arrival

    def data_url(self) -> str:
        return "data:image/jpeg;base64," + base64.b64encode(self.jpeg).decode("ascii")


@dataclass(frozen=True)
class AudioLevel:
    peak_dbfs: float
    rms_dbfs: float
    at: float  # trio time


def ffmpeg_command(ffmpeg: str, audio_fds: dict[int, int] | None = None) -> list[str]:
    """Read MPEG-TS from stdin; write a small JPEG of every key frame of the first video stream
    (if any) to stdout, and each audio PID's levels (``audio_fds``: PID -> fd) to its fd."""
    audio = _audio_args(audio_fds or {})
    return [
        ffmpeg,
        "-hide_banner",
        "-loglevel",
        "error",
        "-nostdin",  # stdin is the media, not the keyboard
        "-probesize",
        "2000000",
        "-analyzeduration",
        "3000000",
        "-skip_frame",
        "nokey",
        "-f",
        "mpegts",
        "-i",
        "pipe:0",
        "-map",
        "0:v:0?",
        "-an",
        "-sn",
        "-dn",
        "-fps_mode",
        "passthrough",
        "-vf",
        f"scale={THUMB_WIDTH}:-2",
        "-q:v",
        "7",
        "-c:v",
        "mjpeg",
        "-f",
        "image2pipe",
        "pipe:1",
        *audio,
    ]


def _audio_args(audio_fds: dict[int, int]) -> list[str]:
    if not audio_fds:
        return []
    chains = []
    maps: list[str] = []
    for index, (pid, fd) in enumerate(sorted(audio_fds.items())):
        chains.append(
            f"[0:i:{pid}]asetnsamples=n={AUDIO_WINDOW_SAMPLES}:p=0,"
            "astats=metadata=1:reset=1:measure_perchannel=none:measure_overall=Peak_level+RMS_level,"
            f"ametadata=mode=print:direct=1:file=/dev/fd/{fd}[a{index}]"
        )
        maps += ["-map", f"[a{index}]"]
    return ["-filter_complex", ";".join(chains), *maps, "-f", "null", "-"]


def parse_level_lines(text: str, last: dict[str, float]) -> list[tuple[float, float]]:
    """``(peak, rms)`` for each complete window in ``ametadata`` print lines; ``last`` carries a
    window across calls. ``-inf`` (silence) reads as -120 dBFS."""
    out = []
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.startswith("frame:"):
            last.clear()
            continue
        name = key.rsplit(".", 1)[-1]
        if name in ("Peak_level", "RMS_level"):
            try:
                number = float(value)
            except ValueError:
                continue
            last[name] = max(number, -120.0)
            if len(last) == 2:
                out.append((last["Peak_level"], last["RMS_level"]))
                last.clear()
    return out


def split_jpegs(buffer: bytearray) -> list[bytes]:
    """Take every complete JPEG (SOI .. EOI) off the front of ``buffer``; the rest stays."""
    out: list[bytes] = []
    while True:
        start = buffer.find(b"\xff\xd8")
        if start < 0:
            buffer.clear()
            return out
        end = buffer.find(b"\xff\xd9", start + 2)
        if end < 0:
            del buffer[:start]
            if len(buffer) > MAX_JPEG_BYTES:
                buffer.clear()
            return out
        out.append(bytes(buffer[start : end + 2]))
        del buffer[: end + 2]


class Thumbnailer:
    """One decoding session per watched flow; ``want({flow_id: audio_pids})`` says which flows are
    watched and which of their audio PIDs to measure (a change of PIDs restarts the session)."""

    def __init__(self, add_tap: AddTap, remove_tap: RemoveTap) -> None:
        self._add_tap = add_tap
        self._remove_tap = remove_tap
        self.ffmpeg = shutil.which("ffmpeg")
        self.thumbnails: dict[str, Thumbnail] = {}
        self.levels: dict[str, dict[int, AudioLevel]] = {}
        self._sessions: dict[str, tuple[tuple[int, ...], trio.CancelScope]] = {}
        self._versions = 0
        self._nursery: trio.Nursery | None = None
        if self.ffmpeg is None:
            _log.warning("status page: ffmpeg is not installed, so there are no thumbnails")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    def want(self, flows: dict[str, tuple[int, ...]]) -> None:
        """Start sessions for ``flows``, stop the others (their pictures and levels are dropped)."""
        if self.ffmpeg is None or self._nursery is None:
            return
        for flow_id, (pids, scope) in list(self._sessions.items()):
            if flows.get(flow_id) != pids:
                scope.cancel()
                del self._sessions[flow_id]
                if flow_id not in flows:
                    self.thumbnails.pop(flow_id, None)
                self.levels.pop(flow_id, None)
        for flow_id, pids in flows.items():
            if flow_id not in self._sessions:
                scope = trio.CancelScope()
                self._sessions[flow_id] = (pids, scope)
                self._nursery.start_soon(self._keep_session, flow_id, pids, scope)

    async def _keep_session(self, flow_id: str, pids: tuple[int, ...], scope: trio.CancelScope) -> None:
        with scope:
            delay = RETRY_AFTER_S
            while True:
                produced = False
                try:
                    produced = await self._session(flow_id, pids)
                except Exception as exc:  # a session's failure never takes the listener down
                    _log.debug("thumbnail of %s: %s", flow_id, exc)
                # A session that never produced anything (no video, no audio) backs off.
                delay = RETRY_AFTER_S if produced else min(delay * 2, MAX_RETRY_S)
                await trio.sleep(delay)

    async def _session(self, flow_id: str, pids: tuple[int, ...]) -> bool:
        """One ffmpeg and one tap until ffmpeg ends or goes quiet; True if it produced anything."""
        assert self.ffmpeg is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        pipes = {pid: os.pipe() for pid in pids}
        readers: dict[int, trio.lowlevel.FdStream] = {}
        process: trio.Process | None = None
        tapped = False
        produced = False
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            write_fds = {pid: w for pid, (_, w) in pipes.items()}
            process = await trio.lowlevel.open_process(
                ffmpeg_command(self.ffmpeg, write_fds),
                stdin=sock.fileno(),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                pass_fds=tuple(write_fds.values()),
            )
            sock.close()  # ffmpeg holds it now
            for fd in write_fds.values():
                os.close(fd)
            readers = {pid: trio.lowlevel.FdStream(r) for pid, (r, _) in pipes.items()}
            pipes = {}
            tap = UdpOutput(
                type="udp", id=TAP_OUTPUT_ID, name="status page thumbnail", dest_addr=f"127.0.0.1:{port}", dscp=0
            )
            await self._add_tap(flow_id, tap)
            tapped = True
            _log.debug("thumbnail of %s: tap on 127.0.0.1:%d", flow_id, port)
            assert process.stdout is not None
            async with trio.open_nursery() as nursery:
                for pid, reader in readers.items():
                    nursery.start_soon(self._read_levels, flow_id, pid, reader)
                produced = await self._read_pictures(flow_id, process.stdout)
                nursery.cancel_scope.cancel()
            return produced or flow_id in self.levels
        finally:
            sock.close()
            for r, w in pipes.values():
                os.close(r)
                os.close(w)
            for reader in readers.values():
                reader.close()
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                if tapped:
                    try:
                        await self._remove_tap(flow_id, TAP_OUTPUT_ID)
                    except Exception as exc:
                        _log.debug("thumbnail of %s: removing the tap: %s", flow_id, exc)
                if process is not None:
                    if process.returncode is None:
                        process.kill()
                    await process.wait()

    async def _read_pictures(self, flow_id: str, stdout: trio.abc.ReceiveStream) -> bool:
        """Keep the latest JPEG until ffmpeg ends or nothing at all comes for ``STALE_AFTER_S``."""
        buffer = bytearray()
        produced = False
        while True:
            with trio.move_on_after(STALE_AFTER_S) as quiet:
                chunk = await stdout.receive_some(65536)
            if quiet.cancelled_caught:
                fresh = self.levels.get(flow_id, {})
                if any(level.at > trio.current_time() - STALE_AFTER_S for level in fresh.values()):
                    continue  # audio only, and the audio is live
                _log.debug("thumbnail of %s: nothing for %.0fs, restarting", flow_id, STALE_AFTER_S)
                return produced
            if not chunk:
                return produced  # ffmpeg ended (no stream it could use, or it failed)
            buffer += chunk
            for jpeg in split_jpegs(buffer):
                produced = True
                self._versions += 1
                self.thumbnails[flow_id] = Thumbnail(self._versions, jpeg, trio.current_time())

    async def _read_levels(self, flow_id: str, pid: int, reader: trio.lowlevel.FdStream) -> None:
        pending = b""
        window: dict[str, float] = {}
        while chunk := await reader.receive_some(65536):
            pending += chunk
            text, _, rest = pending.rpartition(b"\n")
            pending = rest[-4096:]
            for peak, rms in parse_level_lines(text.decode("ascii", "replace"), window):
                self.levels.setdefault(flow_id, {})[pid] = AudioLevel(peak, rms, trio.current_time())
