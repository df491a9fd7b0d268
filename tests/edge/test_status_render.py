"""The status page's rendering and its thumbnail plumbing, without a running edge."""

from __future__ import annotations

import json

import trio

from appliance.models.stats import (
    AudioStream,
    FlowState,
    FlowStats,
    Health,
    InputStats,
    MediaAnalysis,
    OutputStats,
    StatsSnapshot,
    SystemStats,
    Tr101290Stats,
    VideoStream,
)
from services.edge.status.hub import HISTORY_SAMPLES, MonitorHub, count, duration, level_width, rate, spark_points
from services.edge.status.thumbnailer import (
    AudioLevel,
    Thumbnail,
    Thumbnailer,
    ffmpeg_command,
    parse_level_lines,
    split_jpegs,
)


def _snapshot(cc_errors: int = 0, packets: int = 1000, name: str = "Cam <1>") -> StatsSnapshot:
    flow = FlowStats(
        flow_id="cam1",
        flow_name=name,
        state=FlowState.RUNNING,
        health=Health.HEALTHY,
        uptime_secs=65,
        input=InputStats(input_type="rtp", state="receiving", packets_received=packets, bitrate_bps=3_210_000),
        outputs=[OutputStats(output_id="o1", output_name="Out 1", output_type="udp", bitrate_bps=3_000_000)],
        tr101290=Tr101290Stats(cc_errors=cc_errors),
        media_analysis=MediaAnalysis(
            protocol="rtp",
            video_streams=[VideoStream(pid=256, stream_type=27, codec="H.264", resolution="1280x720", frame_rate=25)],
            audio_streams=[AudioStream(pid=257, stream_type=15, codec="AAC", sample_rate_hz=48000, channels=2)],
        ),
    )
    system = SystemStats(uptime_secs=3725, total_flows=1, active_flows=1, version="0.1.0")
    return StatsSnapshot(system=system, flows=[flow])


class _Taps:
    def __init__(self) -> None:
        self.added: list[str] = []

    async def add(self, flow_id: str, output: object) -> None:
        self.added.append(flow_id)

    async def remove(self, flow_id: str, output_id: str) -> None:
        pass


def test_formatting() -> None:
    assert rate(3_210_000) == "3.2 Mb/s"
    assert rate(950) == "950 b/s"
    assert rate(1_500_000_000) == "1.5 Gb/s"
    assert count(1234567) == "1,234,567"
    assert duration(3725) == "1h 02m 05s"
    assert duration(59) == "0m 59s"
    assert spark_points([5]) == ""
    points = spark_points([0, 10]).split()
    assert len(points) == 2 and points[-1].startswith("160.0,")


def test_split_jpegs_keeps_a_partial_picture() -> None:
    buffer = bytearray(b"junk\xff\xd8one\xff\xd9\xff\xd8tw")
    assert split_jpegs(buffer) == [b"\xff\xd8one\xff\xd9"]
    buffer += b"o\xff\xd9"
    assert split_jpegs(buffer) == [b"\xff\xd8two\xff\xd9"]
    assert buffer == b""


def test_ffmpeg_reads_stdin_and_decodes_key_frames_only() -> None:
    command = ffmpeg_command("ffmpeg")
    assert command[command.index("-i") + 1] == "pipe:0"
    assert "-nostdin" in command
    assert command[command.index("-skip_frame") + 1] == "nokey"
    assert "-filter_complex" not in command
    with_audio = ffmpeg_command("ffmpeg", {257: 9, 258: 11})
    graph = with_audio[with_audio.index("-filter_complex") + 1]
    assert "[0:i:257]" in graph and "direct=1:file=/dev/fd/9[a0]" in graph and "file=/dev/fd/11[a1]" in graph
    assert with_audio[-7:] == ["-map", "[a0]", "-map", "[a1]", "-f", "null", "-"]


def test_audio_level_lines() -> None:
    window: dict[str, float] = {}
    text = (
        "frame:0    pts:0       pts_time:0\n"
        "lavfi.astats.Overall.Peak_level=-17.27\n"
        "lavfi.astats.Overall.RMS_level=-21.55\n"
        "frame:1    pts:12000   pts_time:0.25\n"
        "lavfi.astats.Overall.Peak_level=-inf\n"
    )
    assert parse_level_lines(text, window) == [(-17.27, -21.55)]
    assert parse_level_lines("lavfi.astats.Overall.RMS_level=-inf\n", window) == [(-120.0, -120.0)]
    assert level_width(0) == 100 and level_width(-30) == 50 and level_width(-120) == 0


async def test_page_and_live_frames_escape_and_mark_alarms() -> None:
    taps = _Taps()
    thumbnailer = Thumbnailer(taps.add, taps.remove)
    hub = MonitorHub(lambda: _snapshot(), thumbnailer)
    hub.on_snapshot(_snapshot(cc_errors=0))
    await trio.sleep(1)
    hub.on_snapshot(_snapshot(cc_errors=3, packets=2000))
    html = hub.page()
    assert "Cam &lt;1&gt;" in html and "Cam <1>" not in html
    assert "3.2 Mb/s" in html and "2,000" in html and "1h 02m 05s" in html
    assert "1280x720" in html and "48.0 kHz" in html
    assert 'class="alarm" data-ind="cc_errors"' in html  # counted within the window
    assert 'class="ok" data-ind="pat_errors"' in html
    assert "<polyline points=" in html
    assert "data-level" not in html  # no level measured yet
    thumbnailer.levels["cam1"] = {257: AudioLevel(-10.0, -20.0, trio.current_time())}
    html = hub.page()
    assert 'data-level="257"' in html and "-20 dBFS RMS" in html

    mailbox = hub.join()
    assert hub.viewers == 1
    frame = await mailbox.take()
    thumbnailer.thumbnails["cam1"] = Thumbnail(1, b"\xff\xd8x\xff\xd9", 0.0)
    first = json.loads(hub.message(frame, mailbox))
    assert [fid for fid, _ in first["flows"]] == ["cam1"]
    assert first["thumbs"]["cam1"].startswith("data:image/jpeg;base64,")
    assert json.loads(hub.message(frame, mailbox))["thumbs"] == {}  # sent once per version
    del thumbnailer.thumbnails["cam1"]
    assert json.loads(hub.message(frame, mailbox))["thumbs"] == {"cam1": None}
    hub.leave(mailbox)
    assert hub.viewers == 0


async def test_history_is_bounded() -> None:
    hub = MonitorHub(lambda: _snapshot(), Thumbnailer(_Taps().add, _Taps().remove))
    for _ in range(HISTORY_SAMPLES + 10):
        hub.on_snapshot(_snapshot())
    assert len(hub._history["cam1"].bitrates) == HISTORY_SAMPLES
