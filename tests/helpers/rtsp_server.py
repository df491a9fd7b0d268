"""A real RTSP server for the tests: Debian's gst-rtsp-server, in its own process.

The project venv cannot import ``gi``, so :class:`GstRtspServer` runs
``tests/helpers/gst_rtsp_server.py`` under Debian's ``/usr/bin/python3`` (python3-gi) and
talks to it only through its command line, its ``READY <port>`` line and signals::

    need_gst_rtsp(video="h265")
    with GstRtspServer(video="h265", audio="aac-latm", auth="digest") as cam:
        probe(cam.url_with_credentials)
        cam.kill()      # the camera dies mid-stream
        cam.restart()   # and comes back on the same port
"""

from __future__ import annotations

import functools
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Literal
from urllib.parse import quote

import pytest

__all__ = ["SCRIPT", "SYSTEM_PYTHON", "GstRtspServer", "RtspServerError", "need_gst_rtsp"]

SYSTEM_PYTHON = "/usr/bin/python3"
SCRIPT = Path(__file__).with_name("gst_rtsp_server.py")

Video = Literal["h264", "h265"]
Audio = Literal["aac-hbr", "aac-latm", "none"]
Auth = Literal["none", "basic", "digest"]


class RtspServerError(RuntimeError):
    """The server script did not come up (its stderr is in the message)."""


def _script_args(
    *,
    port: int,
    mount: str,
    video: Video,
    audio: Audio,
    protocols: str | Sequence[str],
    auth: Auth,
    user: str,
    password: str,
    fps: int,
    size: str | tuple[int, int],
    gop: int,
    bitrate_kbps: int,
) -> list[str]:
    protos = protocols if isinstance(protocols, str) else ",".join(protocols)
    size_s = size if isinstance(size, str) else f"{size[0]}x{size[1]}"
    return [
        f"--port={port}",
        f"--mount={mount}",
        f"--video={video}",
        f"--audio={audio}",
        f"--protocols={protos}",
        f"--auth={auth}",
        f"--user={user}",
        f"--password={password}",
        f"--fps={fps}",
        f"--size={size_s}",
        f"--gop={gop}",
        f"--bitrate-kbps={bitrate_kbps}",
    ]


@functools.cache
def _check(video: Video, audio: Audio) -> str | None:
    """None when the script can build this pipeline, else why not (naming the Debian package)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing (Debian packages python3, python3-gi)"
    proc = subprocess.run(
        [SYSTEM_PYTHON, str(SCRIPT), "--check", f"--video={video}", f"--audio={audio}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode == 0:
        return None
    return proc.stderr.strip() or f"gst_rtsp_server.py --check exited {proc.returncode}"


def need_gst_rtsp(video: Video = "h264", audio: Audio = "aac-hbr") -> None:
    """Skip unless gst-rtsp-server can serve this video/audio; fail under ``CI=true``, where a skip
    would be a silent pass (tools/ensure-debs.sh installs the packages). The reason names the
    missing Debian package (python3-gi, gir1.2-gst-rtsp-server-1.0, gstreamer1.0-plugins-*)."""
    why = _check(video, audio)
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"gst-rtsp-server is unusable in CI (tools/ensure-debs.sh installs it): {why}")
    pytest.skip(f"gst-rtsp-server unusable: {why}")


class GstRtspServer:
    """One gst-rtsp-server process serving a live test pattern (+ a sine tone) on 127.0.0.1.

    Arguments mirror the script's flags. ``port=0`` picks a free port at the first start;
    :meth:`restart` reuses it.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        mount: str = "/cam",
        video: Video = "h264",
        audio: Audio = "aac-hbr",
        protocols: str | Sequence[str] = "tcp,udp",
        auth: Auth = "none",
        user: str = "user",
        password: str = "password",
        fps: int = 25,
        size: str | tuple[int, int] = "320x240",
        gop: int = 25,
        bitrate_kbps: int = 1000,
        ready_timeout: float = 15.0,
        stop_timeout: float = 5.0,
        tls: tuple[Path, Path] | None = None,
        cbr: bool = False,
    ) -> None:
        self.cbr = cbr  # H.264 padded to exactly ``bitrate_kbps`` (filler data), as CBR encoders do
        self.tls = tls  # (certificate, key) PEM files: serve rtsps:// (RTSP over TLS)
        self.mount = mount
        self.video: Video = video
        self.audio: Audio = audio
        self.auth: Auth = auth
        self.user = user
        self.password = password
        self.protocols = protocols
        self.fps = fps
        self.size = size
        self.gop = gop
        self.bitrate_kbps = bitrate_kbps
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._last_stderr = ""

    # -- addresses -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if not self._port:
            raise RtspServerError("the server has not started yet: no port")
        return self._port

    @property
    def url(self) -> str:
        scheme = "rtsps" if self.tls else "rtsp"
        return f"{scheme}://127.0.0.1:{self.port}{self.mount}"

    @property
    def url_with_credentials(self) -> str:
        """The URL with ``user:password@`` (percent-encoded), whatever the auth mode."""
        cred = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        return f"rtsp://{cred}@127.0.0.1:{self.port}{self.mount}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stderr_text(self) -> str:
        """What the current (or last) process wrote to stderr."""
        if self._stderr is not None and not self._stderr.closed:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")
        return self._last_stderr

    # -- life cycle ------------------------------------------------------------------------

    def command(self) -> list[str]:
        args = _script_args(
            port=self._port,
            mount=self.mount,
            video=self.video,
            audio=self.audio,
            protocols=self.protocols,
            auth=self.auth,
            user=self.user,
            password=self.password,
            fps=self.fps,
            size=self.size,
            gop=self.gop,
            bitrate_kbps=self.bitrate_kbps,
        )
        if self.cbr:
            args.append("--cbr")
        if self.tls is not None:
            args += [f"--tls-cert={self.tls[0]}", f"--tls-key={self.tls[1]}"]
        return [SYSTEM_PYTHON, str(SCRIPT), *args]

    def start(self) -> GstRtspServer:
        """Spawn the server and wait (at most ``ready_timeout``) for its ``READY <port>`` line."""
        if self.running:
            raise RtspServerError(f"already running (pid {self.pid})")
        self._close_stderr()
        self._stderr = tempfile.TemporaryFile(prefix="gst-rtsp-server-", suffix=".stderr")
        proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # a ^C at pytest reaches us, not the server: stop() ends it
        )
        self._proc = proc
        try:
            self._port = self._wait_ready(proc)
        except BaseException:
            self._reap(signal.SIGKILL)
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> int:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.ready_timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RtspServerError(
                        f"gst_rtsp_server.py: no READY line within {self.ready_timeout:.0f} s; "
                        f"stdout {buf!r}; stderr:\n{self.stderr_text()}"
                    )
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:  # EOF: the script exited
                    rc = proc.wait(timeout=self.stop_timeout)
                    raise RtspServerError(
                        f"gst_rtsp_server.py exited {rc} before READY; stdout {buf!r}; stderr:\n{self.stderr_text()}"
                    )
                buf += chunk
        line = buf.split(b"\n", 1)[0].decode(errors="replace").strip()
        word, _, port = line.partition(" ")
        if word != "READY" or not port.isdigit():
            raise RtspServerError(f"gst_rtsp_server.py: unexpected first line {line!r}; stderr:\n{self.stderr_text()}")
        if self._port and int(port) != self._port:
            raise RtspServerError(f"gst_rtsp_server.py listens on {port}, not {self._port}")
        return int(port)

    def stop(self) -> int | None:
        """SIGTERM, wait ``stop_timeout``, then SIGKILL. The exit code (None if not started)."""
        return self._reap(signal.SIGTERM)

    def kill(self) -> int | None:
        """SIGKILL: the camera dies mid-stream (no TEARDOWN, no RTCP BYE)."""
        return self._reap(signal.SIGKILL)

    def restart(self) -> GstRtspServer:
        """Stop (if still running) and start again on the same port."""
        self.stop()
        return self.start()

    def _reap(self, sig: signal.Signals) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        if proc.stdout is not None:
            proc.stdout.close()
        self._proc = None
        self._last_stderr = self.stderr_text()
        self._close_stderr()
        return proc.returncode

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> GstRtspServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<GstRtspServer {self.video}+{self.audio} auth={self.auth} port={self._port or '?'} {state}>"
