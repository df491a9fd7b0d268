"""A real peer: Debian's FFmpeg publishes to RtmpServerConnection, and RtmpClientConnection pushes
to FFmpeg's RTMP listener. Plain blocking sockets on 127.0.0.1; every wait is a socket or process
timeout, every loop is bounded by a deadline and a count."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from services.edge.core.rtmp import (
    AudioData,
    ClientConnected,
    Connected,
    ConnectionClosed,
    ErrorReceived,
    Event,
    Metadata,
    PacketKind,
    PlayStarted,
    PublishRequested,
    PublishStarted,
    RtmpClientConnection,
    RtmpServerConnection,
    StreamEnded,
    VideoCodec,
    VideoData,
    amf0,
)
from services.edge.core.rtmp.flv import (
    TAG_AUDIO,
    TAG_SCRIPT,
    TAG_VIDEO,
    build_audio_tag,
    build_video_tag,
    iter_flv_file,
    parse_audio_tag,
    parse_video_tag,
)
from tests.helpers.ports import free_port
from tests.helpers.tools import need_tool

pytestmark = pytest.mark.interop

FFMPEG = "/usr/bin/ffmpeg"
SOURCE = ["-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25", "-f", "lavfi", "-i", "sine"]
ENCODE = ["-c:v", "libx264", "-g", "25", "-c:a", "aac", "-t", "2"]  # -t on the output: the sine never ends
DEADLINE_S = 60.0
MAX_READS = 100_000
T = TypeVar("T")


@pytest.fixture(autouse=True)
def _need_ffmpeg() -> None:
    need_tool(FFMPEG)  # a skip locally, a failure under CI=true


def in_thread(fn: Callable[[], T]) -> T:
    """Run the socket side in a thread; its exceptions and its timeout reach the test."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result(timeout=DEADLINE_S + 10)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def test_ffmpeg_publishes_to_the_server() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(20)
    port = listener.getsockname()[1]
    command = [FFMPEG, "-nostdin", "-v", "error", *SOURCE, *ENCODE, "-f", "flv", f"rtmp://127.0.0.1:{port}/live/key"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def serve() -> list[Event]:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(20)
            server = RtmpServerConnection()
            events: list[Event] = []
            deadline = time.monotonic() + DEADLINE_S
            for _ in range(MAX_READS):
                data = conn.recv(65536)
                for event in server.receive_data(data):
                    events.append(event)
                    if isinstance(event, PublishRequested):
                        server.accept_publish(event.stream_id)
                conn.sendall(server.data_to_send())
                assert server.buffered_input_bytes <= server.max_buffered_input_bytes
                if not data or time.monotonic() > deadline:
                    break
            return events

    try:
        events = in_thread(serve)
        _, stderr = proc.communicate(timeout=30)
    finally:
        stop(proc)
        listener.close()
    assert proc.returncode == 0, stderr
    assert stderr == b""

    connected = [e for e in events if isinstance(e, ClientConnected)]
    assert len(connected) == 1 and connected[0].app == "live"
    requests = [e for e in events if isinstance(e, PublishRequested)]
    assert [(r.app, r.stream_key, r.stream_id) for r in requests] == [("live", "key", 1)]
    metadata = [e for e in events if isinstance(e, Metadata)]
    assert metadata[0].name == "onMetaData" and metadata[0].values["width"] == 320.0

    video = [e for e in events if isinstance(e, VideoData)]
    audio = [e for e in events if isinstance(e, AudioData)]
    assert video[0].tag.codec is VideoCodec.AVC and video[0].tag.packet is PacketKind.SEQUENCE_HEADER
    assert video[0].tag.payload[0] == 1  # AVCDecoderConfigurationRecord configurationVersion
    assert audio[0].tag.packet is PacketKind.SEQUENCE_HEADER and len(audio[0].tag.payload) >= 2
    frames = [e for e in video if e.tag.packet is PacketKind.FRAME]
    assert 48 <= len(frames) <= 52  # 2 s at 25 fps
    assert frames[0].tag.is_keyframe and sum(f.tag.is_keyframe for f in frames) >= 2  # -g 25
    stamps = [f.timestamp for f in frames]
    assert stamps == sorted(stamps) and stamps[-1] - stamps[0] >= 1800
    assert any(f.tag.composition_time > 0 for f in frames)  # x264 B-frames
    assert len([e for e in audio if e.tag.packet is PacketKind.FRAME]) >= 80
    assert [e for e in events if isinstance(e, StreamEnded)] == [StreamEnded(1, "key", "FCUnpublish")]
    assert events[-1] == ConnectionClosed()


def connect_when_listening(port: int, proc: subprocess.Popen[bytes]) -> socket.socket:
    """Connect once FFmpeg listens; between attempts wait on the process (it must not exit)."""
    deadline = time.monotonic() + 20
    for _ in range(1000):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=20)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                break
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
    raise AssertionError("ffmpeg never listened")


def test_client_pushes_to_ffmpeg(tmp_path: Path) -> None:
    source = tmp_path / "source.flv"
    subprocess.run([FFMPEG, "-nostdin", "-v", "error", *SOURCE, *ENCODE, str(source)], check=True, timeout=60)
    tags = list(iter_flv_file(source.read_bytes()))
    assert len(tags) > 100

    port = free_port()
    out = tmp_path / "out.flv"
    listen = [FFMPEG, "-nostdin", "-v", "error", "-listen", "1", "-f", "flv", "-i", f"rtmp://127.0.0.1:{port}/live/key"]
    proc = subprocess.Popen([*listen, "-c", "copy", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def push() -> list[Event]:
        sock = connect_when_listening(port, proc)
        events: list[Event] = []
        with sock:
            client = RtmpClientConnection(app="live", tc_url=f"rtmp://127.0.0.1:{port}/live")
            client.publish("key")
            sock.sendall(client.data_to_send())
            for _ in range(MAX_READS):
                data = sock.recv(65536)
                events += client.receive_data(data)
                sock.sendall(client.data_to_send())
                if not data or any(isinstance(e, PublishStarted | ErrorReceived) for e in events):
                    break
            assert isinstance(events[-1], PublishStarted), events
            for tag in tags:
                if tag.tag_type == TAG_VIDEO:
                    video = parse_video_tag(tag.body)
                    assert build_video_tag(video) == tag.body
                    client.send_video(tag.timestamp, video)
                elif tag.tag_type == TAG_AUDIO:
                    audio = parse_audio_tag(tag.body)
                    assert build_audio_tag(audio) == tag.body
                    client.send_audio(tag.timestamp, audio)
                elif tag.tag_type == TAG_SCRIPT:
                    name, values = amf0.decode_all(tag.body)[:2]
                    assert name == "onMetaData" and isinstance(values, dict)
                    client.send_metadata(values, tag.timestamp)
                sock.sendall(client.data_to_send())
            client.unpublish()
            sock.sendall(client.data_to_send())
            sock.shutdown(socket.SHUT_WR)
            for _ in range(MAX_READS):  # drain until FFmpeg closes
                data = sock.recv(65536)
                events += client.receive_data(data)
                if not data:
                    break
        return events

    try:
        events = in_thread(push)
        _, stderr = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 0, stderr
    # FFmpeg's listener ignores FCUnpublish/deleteStream and reads the TCP close as EIO
    # (libavformat/rtmpproto.c get_packet); that one line is the only message allowed.
    assert [line for line in stderr.decode().splitlines() if "Input/output error" not in line] == []
    assert events[-1] == ConnectionClosed()

    received = list(iter_flv_file(out.read_bytes()))
    for tag_type in (TAG_VIDEO, TAG_AUDIO):
        assert [t.body for t in received if t.tag_type == tag_type] == [t.body for t in tags if t.tag_type == tag_type]
        assert [t.timestamp for t in received if t.tag_type == tag_type] == [
            t.timestamp for t in tags if t.tag_type == tag_type
        ]
    check = subprocess.run(
        [FFMPEG, "-nostdin", "-v", "error", "-i", str(out), "-f", "null", "-"], capture_output=True, timeout=60
    )
    assert check.returncode == 0 and check.stderr == b""  # the pushed stream decodes with zero errors


def test_client_plays_from_ffmpeg(tmp_path: Path) -> None:
    source = tmp_path / "source.flv"
    subprocess.run([FFMPEG, "-nostdin", "-v", "error", *SOURCE, *ENCODE, str(source)], check=True, timeout=60)
    tags = list(iter_flv_file(source.read_bytes()))
    port = free_port()
    serve = [FFMPEG, "-nostdin", "-v", "error", "-i", str(source), "-c", "copy", "-f", "flv", "-listen", "1"]
    proc = subprocess.Popen(
        [*serve, f"rtmp://127.0.0.1:{port}/live/key"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )

    def play() -> list[Event]:
        sock = connect_when_listening(port, proc)
        events: list[Event] = []
        with sock:
            client = RtmpClientConnection(app="live", tc_url=f"rtmp://127.0.0.1:{port}/live")
            client.play("key")
            sock.sendall(client.data_to_send())
            deadline = time.monotonic() + DEADLINE_S
            for _ in range(MAX_READS):
                data = sock.recv(65536)
                events += client.receive_data(data)
                sock.sendall(client.data_to_send())
                if not data or time.monotonic() > deadline:
                    break
        return events

    try:
        events = in_thread(play)
        _, stderr = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 0 and stderr == b"", stderr
    assert isinstance(events[0], Connected)
    assert events[1] == PlayStarted(1, "key")
    assert events[-1] == ConnectionClosed()
    video = [e for e in events if isinstance(e, VideoData)]
    audio = [e for e in events if isinstance(e, AudioData)]
    # FFmpeg sends the media on message stream 0; the tags arrive as they are in the file.
    assert [build_video_tag(e.tag) for e in video] == [t.body for t in tags if t.tag_type == TAG_VIDEO]
    assert [build_audio_tag(e.tag) for e in audio] == [t.body for t in tags if t.tag_type == TAG_AUDIO]
    assert [e.timestamp for e in video] == [t.timestamp for t in tags if t.tag_type == TAG_VIDEO]
