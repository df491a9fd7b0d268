"""The status page's state: the latest stats snapshot, a short history, the rendered frame.

Subscribed to the service's once-a-second snapshot (``EdgeService.snapshot_listeners``,
as the API's WebSocket is) for as long as the monitor listener runs, so that the bitrate
sparklines and the "alarm now" marks have a history when someone opens the page. The
HTML is rendered here, once per tick for every viewer, from the same Jinja templates as
the page itself; the WebSocket only carries those fragments (and new thumbnails).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from jinja2 import Environment, PackageLoader, select_autoescape

from appliance.models.stats import TR101290_INDICATORS, FlowState, FlowStats, StatsSnapshot
from services.edge.status.thumbnailer import Thumbnail, Thumbnailer

HISTORY_SAMPLES: Final = 90  # seconds of bitrate kept for the sparkline
ALARM_WINDOW_S: Final = 10.0  # an indicator that counted within this window is "alarm now"
MAX_PREVIEWS: Final = 16  # flows decoded at once (one ffmpeg each); the others show "no picture"
LEVEL_FRESH_S: Final = 3.0  # an audio level older than this is not shown
LEVEL_FLOOR_DB: Final = -60.0  # the left end of the level bar
SPARK_W: Final = 160
SPARK_H: Final = 32


def rate(bps: int | float | None) -> str:
    """``3.2 Mb/s``: bits per second with a unit."""
    value = float(bps or 0)
    for unit, scale in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} b/s"


def count(value: int | float | None) -> str:
    return f"{int(value or 0):,}"


def duration(secs: int | None) -> str:
    secs = int(secs or 0)
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h {minutes:02d}m"
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    return f"{minutes}m {seconds:02d}s"


def spark_points(values: list[int]) -> str:
    """SVG polyline points of ``values`` scaled into the sparkline box (newest at the right)."""
    if len(values) < 2:
        return ""
    top = max(values) or 1
    step = SPARK_W / (HISTORY_SAMPLES - 1)
    x0 = SPARK_W - step * (len(values) - 1)
    return " ".join(f"{x0 + i * step:.1f},{SPARK_H - 1 - (v / top) * (SPARK_H - 4):.1f}" for i, v in enumerate(values))


def level_width(dbfs: float) -> float:
    """The level bar's length (0-100) for a level in dBFS, linear in dB from ``LEVEL_FLOOR_DB``."""
    return round(max(0.0, min(100.0, (dbfs - LEVEL_FLOOR_DB) / -LEVEL_FLOOR_DB * 100)), 1)


def make_environment() -> Environment:
    env = Environment(
        loader=PackageLoader("services.edge.status", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(rate=rate, count=count, duration=duration)
    env.globals.update(
        spark_points=spark_points,
        level_width=level_width,
        SPARK_W=SPARK_W,
        SPARK_H=SPARK_H,
        INDICATORS=sorted(
            ((name, priority, label) for name, (priority, label) in TR101290_INDICATORS.items()), key=lambda i: i[1]
        ),
    )
    return env


@dataclass
class _FlowHistory:
    bitrates: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY_SAMPLES))
    tr: deque[tuple[float, dict[str, int]]] = field(default_factory=deque)

    def alarms(self) -> set[str]:
        """The indicators whose count went up within ``ALARM_WINDOW_S``."""
        if len(self.tr) < 2:
            return set()
        first, last = self.tr[0][1], self.tr[-1][1]
        return {name for name in TR101290_INDICATORS if last.get(name, 0) > first.get(name, 0)}


@dataclass(frozen=True)
class Frame:
    """One tick's page content: the system line and each flow's live part, in order."""

    system: str
    flows: list[tuple[str, str]]


class Mailbox:
    """A one-slot mailbox: a newer frame replaces an unsent one (slow clients skip)."""

    def __init__(self) -> None:
        self._value: Frame | None = None
        self._event = trio.Event()
        self.thumb_versions: dict[str, int] = {}

    def put(self, value: Frame) -> None:
        self._value = value
        self._event.set()

    async def take(self) -> Frame:
        await self._event.wait()
        self._event = trio.Event()
        value, self._value = self._value, None
        assert value is not None
        return value


class MonitorHub:
    def __init__(self, snapshot: Callable[[], StatsSnapshot], thumbnailer: Thumbnailer) -> None:
        self._snapshot = snapshot
        self.thumbnailer = thumbnailer
        self.env = make_environment()
        self._history: dict[str, _FlowHistory] = {}
        self._clients: set[Mailbox] = set()
        self.latest: StatsSnapshot | None = None

    # ------------------------------------------------------------------ the tick

    def on_snapshot(self, snapshot: StatsSnapshot) -> None:
        """The service's once-a-second snapshot: keep history, push a frame to every viewer."""
        now = trio.current_time()
        self.latest = snapshot
        seen = set()
        for flow in snapshot.flows:
            seen.add(flow.flow_id)
            history = self._history.setdefault(flow.flow_id, _FlowHistory())
            history.bitrates.append(flow.input.bitrate_bps if flow.state is FlowState.RUNNING else 0)
            if flow.tr101290 is not None:
                history.tr.append((now, {name: getattr(flow.tr101290, name) for name in TR101290_INDICATORS}))
                while history.tr and history.tr[0][0] < now - ALARM_WINDOW_S:
                    history.tr.popleft()
        for gone in set(self._history) - seen:
            del self._history[gone]
        self.thumbnailer.want(self._thumbnail_flows(snapshot) if self._clients else {})
        if self._clients:
            frame = self.frame(snapshot)
            for client in list(self._clients):
                client.put(frame)

    @staticmethod
    def _thumbnail_flows(snapshot: StatsSnapshot) -> dict[str, tuple[int, ...]]:
        """Running flows that carry video or audio (or may: without media analysis the edge
        cannot tell), with the audio PIDs to measure."""
        wanted: dict[str, tuple[int, ...]] = {}
        for f in snapshot.flows:
            if f.state is not FlowState.RUNNING:
                continue
            media = f.media_analysis
            if media is None:
                wanted[f.flow_id] = ()
            elif media.video_streams or media.audio_streams:
                wanted[f.flow_id] = tuple(sorted(a.pid for a in media.audio_streams))
            if len(wanted) == MAX_PREVIEWS:
                break
        return wanted

    # ------------------------------------------------------------------ rendering

    def _flow_context(self, flow: FlowStats) -> dict[str, Any]:
        history = self._history.get(flow.flow_id)
        now = trio.current_time()
        levels = {
            pid: level
            for pid, level in self.thumbnailer.levels.get(flow.flow_id, {}).items()
            if level.at > now - LEVEL_FRESH_S
        }
        return {
            "flow": flow,
            "bitrates": list(history.bitrates) if history else [],
            "alarms": history.alarms() if history else set(),
            "levels": levels,
        }

    def frame(self, snapshot: StatsSnapshot) -> Frame:
        system = self.env.get_template("_system.html").render(system=snapshot.system)
        flow_template = self.env.get_template("_flow.html")
        flows = [(f.flow_id, flow_template.render(**self._flow_context(f))) for f in snapshot.flows]
        return Frame(system, flows)

    def page(self) -> str:
        snapshot = self.latest or self._snapshot()
        return self.env.get_template("page.html").render(
            system=snapshot.system,
            flows=[self._flow_context(f) for f in snapshot.flows],
            thumbnails=self.thumbnailer.thumbnails,
        )

    # ------------------------------------------------------------------ viewers

    def join(self) -> Mailbox:
        mailbox = Mailbox()
        first = not self._clients
        self._clients.add(mailbox)
        snapshot = self.latest or self._snapshot()
        if first:
            self.thumbnailer.want(self._thumbnail_flows(snapshot))
        mailbox.put(self.frame(snapshot))  # the first frame at once
        return mailbox

    def leave(self, mailbox: Mailbox) -> None:
        self._clients.discard(mailbox)
        if not self._clients:
            self.thumbnailer.want({})

    @property
    def viewers(self) -> int:
        return len(self._clients)

    def message(self, frame: Frame, mailbox: Mailbox) -> str:
        """The WebSocket text for one viewer: the frame and the thumbnails it has not had yet."""
        thumbs: dict[str, str | None] = {}
        current: dict[str, Thumbnail] = self.thumbnailer.thumbnails
        for flow_id, thumb in current.items():
            if mailbox.thumb_versions.get(flow_id) != thumb.version:
                mailbox.thumb_versions[flow_id] = thumb.version
                thumbs[flow_id] = thumb.data_url()
        for flow_id in set(mailbox.thumb_versions) - set(current):
            del mailbox.thumb_versions[flow_id]
            thumbs[flow_id] = None  # no picture any more (flow stopped)
        body = {"system": frame.system, "flows": [[fid, html] for fid, html in frame.flows], "thumbs": thumbs}
        return json.dumps(body, separators=(",", ":"))
