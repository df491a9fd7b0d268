"""`mp stats`: what a person reads on a terminal (issue 15 item 1).

The detail view of `mp stats FLOW` (input and its peer, every TR 101 290 indicator
with its count and last alarm, media, IAT/PDV, outputs, SRT legs) and the table of
`mp stats` / `mp stats --watch` fitted to 80 and 132 columns: health and alarms
always there, bitrates with units, thousands separators, widths steady between
redraws. The tmux tests run the installed `mp` against a real `mp-edge`.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.commands.stats import (
    TR101290_INDICATORS,
    AlarmClock,
    last_alarms,
    stats_detail,
    stats_lines,
    stats_table,
)
from cli.render import bitrate, count
from tests.cli.helpers import MP, Mp
from tests.helpers.edge import Edge, free_udp_port, running_edge, wait_for
from tests.helpers.media import VIDEO_PID, TsSource, rtp_packet

_sessions = itertools.count()


# --------------------------------------------------------------------------- a flow's statistics object


def _flow(flow_id: str = "cam1", **over: object) -> dict[str, object]:
    flow: dict[str, object] = {
        "flow_id": flow_id,
        "flow_name": "Camera 1",
        "state": "Running",
        "health": "Warning",
        "uptime_secs": 3723,
        "input": {
            "input_type": "srt",
            "state": "receiving",
            "packets_received": 1234567,
            "bytes_received": 1163328000,
            "bitrate_bps": 3181970,
            "packets_lost": 12,
            "packets_filtered": 0,
            "packets_recovered_fec": 5,
            "redundancy_switches": 0,
            "srt_stats": {
                "state": "connected",
                "rtt_ms": 12.34,
                "send_rate_mbps": 0.0,
                "recv_rate_mbps": 3.2,
                "pkt_loss_total": 40,
                "pkt_retransmit_total": 1234,
                "uptime_ms": 1000,
            },
            "srt_leg2_stats": {"state": "connected", "rtt_ms": 30.0, "pkt_loss_total": 2, "pkt_retransmit_total": 9},
        },
        "outputs": [
            {
                "output_id": "out1",
                "output_name": "To studio B",
                "output_type": "udp",
                "state": "active",
                "packets_sent": 1234567,
                "bitrate_bps": 3153218,
                "packets_dropped": 0,
            },
            {
                "output_id": "out2",
                "output_name": "Backup",
                "output_type": "srt",
                "state": "connecting",
                "packets_sent": 0,
                "bitrate_bps": 0,
                "packets_dropped": 3,
                "srt_stats": {"state": "connecting", "rtt_ms": 0.0, "pkt_loss_total": 0, "pkt_retransmit_total": 0},
            },
        ],
        "tr101290": {
            "ts_packets_analyzed": 6132000,
            **dict.fromkeys(TR101290_INDICATORS, 0),
            "pcr_accuracy_errors": 17,
            "priority1_ok": True,
            "priority2_ok": False,
        },
        "media_analysis": {
            "protocol": "srt",
            "payload_format": "raw_ts",
            "program_count": 1,
            "video_streams": [
                {"pid": 256, "stream_type": 27, "codec": "h264", "resolution": "1920x1080", "frame_rate": 25.0}
            ],
            "audio_streams": [
                {
                    "pid": 257,
                    "stream_type": 15,
                    "codec": "aac",
                    "sample_rate_hz": 48000,
                    "channels": 2,
                    "bitrate_bps": 192000,
                    "language": "eng",
                }
            ],
            "total_bitrate_bps": 3158400,
        },
        "iat": {"min_us": 1494.6, "max_us": 5119.3, "avg_us": 3333.5},
        "pdv_jitter_us": 666.4,
    }
    flow.update(over)
    return flow


def test_the_cli_names_the_same_tr101290_indicators_as_the_stats_model() -> None:
    from appliance.models.stats import TR101290_INDICATORS as MODEL

    assert TR101290_INDICATORS == MODEL


def test_bitrates_have_units_and_counters_thousands_separators() -> None:
    assert [bitrate(v) for v in (0, 950_000, 3_181_970, 31_840_000, 318_000_000, 1.2e9, None)] == [
        "0 b/s", "950 kb/s", "3.2 Mb/s", "31.8 Mb/s", "318 Mb/s", "1.2 Gb/s", "-",
    ]  # fmt: skip
    assert count(1234567) == "1,234,567"
    table = stats_table({"flows": [_flow()]}, False, None)
    assert "3.2 Mb/s" in table and "1,234,567" in table


@pytest.mark.parametrize("width", [80, 132])
def test_the_table_fits_the_width_and_keeps_health_and_alarms(width: int) -> None:
    flows = [_flow(), _flow("studio-b-backup", health="Healthy")]
    lines = stats_table({"flows": flows}, False, width).splitlines()
    assert max(len(line) for line in lines) <= width, lines
    assert lines[0].split()[:3] == ["FLOW", "STATE", "HEALTH"] or lines[0].split()[:2] == ["FLOW", "HEALTH"]
    for header in ("FLOW", "HEALTH", "LOST", "P1", "P2", "OUTPUTS"):
        assert header in lines[0].split(), lines[0]
    assert re.search(r"^cam1 +(Running +)?Warning .* 3\.2 Mb/s .*12 +(5 +)?ok +ERR +\S", lines[1]), lines
    if width == 132:  # everything fits
        assert lines[0].split() == ["FLOW", "STATE", "HEALTH", "INPUT", "BITRATE", "PACKETS", "LOST", "FEC", "P1",
                                    "P2", "OUTPUTS"]  # fmt: skip
        assert "1,234,567" in lines[1]


def test_the_least_useful_columns_go_first_and_outputs_shrink_to_counts() -> None:
    flows = [_flow()]
    headers = {w: stats_table({"flows": flows}, False, w).splitlines()[0].split() for w in (132, 96, 80, 60, 40)}
    assert "INPUT" not in headers[96] and "FEC" in headers[96]
    assert headers[80] == ["FLOW", "STATE", "HEALTH", "BITRATE", "LOST", "P1", "P2", "OUTPUTS"]
    assert headers[40] == ["FLOW", "HEALTH", "P1", "P2", "OUTPUTS"]
    full = stats_table({"flows": flows}, False, 132).splitlines()[1]
    narrow = stats_table({"flows": flows}, False, 60).splitlines()[1]
    assert full.endswith("out1 3.2 Mb/s, out2 connecting drop 3") and narrow.endswith("1/2 active drop 3")


def test_widths_do_not_move_between_redraws() -> None:
    sticky: dict[str, int] = {}
    big = _flow(input={**_flow()["input"], "packets_received": 123_456_789_012, "bitrate_bps": 31_840_000})  # type: ignore[dict-item]
    small = _flow(input={**_flow()["input"], "packets_received": 7, "bitrate_bps": 950_000, "packets_lost": 0})  # type: ignore[dict-item]
    first = [line for line, _ in stats_lines([big], 132, sticky)]
    second = [line for line, _ in stats_lines([small], 132, sticky)]
    assert first[0] == second[0]  # the same header, so the same column positions
    assert first[1].index(" ok ") == second[1].index(" ok ")
    assert second[1].split()[:3] == ["cam1", "Running", "Warning"] and " 7 " in second[1]


def test_the_detail_view_reads_as_a_whole_at_80_columns() -> None:
    config = {
        "input": {"type": "srt", "mode": "listener", "local_addr": "0.0.0.0:9000"},
        "outputs": [{"id": "out1", "dest_addr": "239.1.1.2:5000"}, {"id": "out2", "mode": "caller",
                                                                    "remote_addr": "203.0.113.7:9000"}],
    }  # fmt: skip
    today = time.strftime("%Y-%m-%d", time.gmtime())
    events = [
        {"flow_id": "cam1", "category": "analysis", "message": "TR 101 290 priority 2 alarm raised: PCR accuracy error",
         "details": {"indicator": "pcr_accuracy_errors"}, "timestamp": f"{today}T13:01:02.123Z"},
    ]  # fmt: skip
    text = stats_detail(_flow(), False, 80, config, last_alarms(events, "cam1"))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert re.search(r"^INPUT +srt  receiving  listening on 0\.0\.0\.0:9000$", text, re.M), text
    assert re.search(r"^  SRT leg 1 +connected  RTT 12\.3 ms  loss 40  retransmits 1,234$", text, re.M), text
    assert re.search(r"^  SRT leg 2 +connected  RTT 30\.0 ms  loss 2  retransmits 9$", text, re.M), text
    assert re.search(r"IAT min 1\.5 ms  avg 3\.3 ms  max 5\.1 ms  PDV 666 µs", text), text
    assert re.search(r"^TR 101 290 +P1 ok  P2 ERR  6,132,000 TS packets$", text, re.M), text
    for _name, (priority, label) in TR101290_INDICATORS.items():
        assert re.search(rf"^  {priority}  {label} +\d", text, re.M), label
    assert re.search(r"^  2  PCR accuracy error +17  13:01:02Z, active$", text, re.M), text
    assert re.search(r"^  1  TS sync loss +0  -$", text, re.M), text
    assert re.search(r"^  video +PID 256  h264  1920x1080  25 fps$", text, re.M), text
    assert re.search(r"^  audio +PID 257  aac  48 kHz  2 ch  eng  192 kb/s$", text, re.M), text
    assert re.search(r"^  out1 +active +3\.2 Mb/s +1,234,567 +0 .*to 239\.1\.1\.2:5000$", text, re.M), text
    assert re.search(r"^  out2 +connecting +0 b/s +0 +3 .*calling 203\.0\.113\.7:9000$", text, re.M), text
    assert re.search(r"^  out2 SRT +connecting  loss 0  retransmits 0$", text, re.M), text


def test_last_alarms_follow_raise_clear_and_restart() -> None:
    def ev(message: str, indicator: str | None = None, at: str = "2020-01-02T03:04:05.000Z") -> dict[str, object]:
        details = {"indicator": indicator} if indicator else None
        return {"flow_id": "f", "category": "analysis" if indicator else "flow", "message": message,
                "details": details, "timestamp": at}  # fmt: skip

    events = [
        ev("TR 101 290 priority 1 alarm raised: PAT error", "pat_errors", "2020-01-02T03:04:05.000Z"),
        ev("flow started"),
        ev("TR 101 290 priority 1 alarm raised: continuity count error", "cc_errors", "2020-01-02T03:04:05.000Z"),
        ev("TR 101 290 priority 1 alarm cleared: continuity count error", "cc_errors", "2020-01-02T03:04:15.000Z"),
        {**ev("TR 101 290 priority 2 alarm raised: CRC error", "crc_errors"), "flow_id": "other"},
    ]
    assert last_alarms(events, "f") == {"cc_errors": "01-02 03:04:05Z, cleared 01-02 03:04:15Z"}


def test_while_watching_the_time_a_count_went_up_is_kept() -> None:
    clock = AlarmClock()
    clock.update([_flow()])
    assert clock.of("cam1") == {}
    clock.update([_flow(tr101290={**_flow()["tr101290"], "cc_errors": 2})])  # type: ignore[dict-item]
    assert list(clock.of("cam1")) == ["cc_errors"] and clock.of("cam1")["cc_errors"].startswith("seen ")


# --------------------------------------------------------------------------- on a real terminal (tmux)


class Tmux:
    """One private tmux server running one command in a pane of a fixed size."""

    def __init__(self, command: str, env: dict[str, str], tmp_path: Path, width: int, height: int = 40) -> None:
        self.socket = f"mp-stats-test-{os.getpid()}-{next(_sessions)}"
        self.env, self.width = env, width
        script = tmp_path / f"{self.socket}.sh"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items() if k.isidentifier())
        script.write_text(f'{exports}{command}\necho "EXIT=$?"\nsleep 300\n')
        self._tmux("new-session", "-d", "-x", str(width), "-y", str(height), "-s", "mp", f"bash --norc {script}")

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args], env=self.env, capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "mp")

    def wait(self, pattern: str, timeout: float = 30.0) -> str:
        """The screen once `pattern` is on it (polled, bounded)."""

        def shown() -> str | None:
            screen = self.screen()
            return screen if re.search(pattern, screen, re.M) else None

        return str(wait_for(shown, timeout, 0.2))

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "mp", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=30)
        socket_dir = Path(self.env.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
        (socket_dir / self.socket).unlink(missing_ok=True)


@pytest.fixture
def term_env(cli_env: dict[str, str]) -> dict[str, str]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (tools/ensure-debs.sh installs it)")
    env = {k: v for k, v in cli_env.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}  # the pane's size rules
    env["PATH"] = str(Path(MP).parent) + os.pathsep + env.get("PATH", "")
    env["TERM"] = "xterm-256color"
    return env


@pytest.fixture(scope="module")
def live_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Edge, dict[str, int]]]:
    """One edge with two running flows fed a stream with continuity errors, for every terminal test here."""
    tmp = tmp_path_factory.mktemp("stats-view")
    with running_edge(tmp) as edge:
        ports = {"cam1": free_udp_port(), "studio-b-backup": free_udp_port()}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIAPLANE_", "MP_"))}
        mp = Mp(edge.url, {**env, "HOME": str(tmp), "NO_COLOR": "1"})
        for flow_id, port in ports.items():
            outs = [f"udp://127.0.0.1:{free_udp_port()}" for _ in range(2)]
            mp.ok("flow", "create", flow_id, "--name", f"Flow {flow_id}", "--input", f"rtp://127.0.0.1:{port}",
                  "--output", outs[0], "--output", outs[1])  # fmt: skip
        stop = threading.Event()
        senders = [threading.Thread(target=_send, args=(port, stop), daemon=True) for port in ports.values()]
        for sender in senders:
            sender.start()
        try:
            wait_for(lambda: mp.data("stats", "cam1")["tr101290"]["cc_errors"] > 0, timeout=30, interval=0.2)
            wait_for(lambda: mp.data("stats", "cam1")["input"]["packets_received"] > 1000, timeout=30, interval=0.2)
            yield edge, ports
        finally:
            stop.set()
            for sender in senders:
                sender.join(10)


def _send(port: int, stop: threading.Event) -> None:
    """RTP/TS at 300 datagrams a second (about 3.2 Mb/s), a continuity error every 200 datagrams; bounded."""
    import socket

    source = TsSource()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        start = time.monotonic()
        for i in range(300 * 120):
            if stop.is_set():
                return
            if i % 200 == 199:
                source.cc[VIDEO_PID] = (source.cc[VIDEO_PID] + 3) & 0x0F  # a continuity count error
            sock.sendto(rtp_packet(i, i * 900, source.datagram()), ("127.0.0.1", port))
            ahead = start + (i + 1) / 300 - time.monotonic()
            if ahead > 0:
                stop.wait(ahead)


def _fits(screen: str, width: int) -> None:
    lines = screen.rstrip("\n").splitlines()
    assert all(len(line) <= width for line in lines), screen
    assert not any(line.endswith("…") and "updated" not in line for line in lines), screen  # nothing cut


@pytest.mark.e2e
@pytest.mark.parametrize("width", [80, 132])
def test_mp_stats_flow_on_a_terminal_is_the_detail_view(
    live_edge: tuple[Edge, dict[str, int]], term_env: dict[str, str], tmp_path: Path, width: int
) -> None:
    edge, ports = live_edge
    term = Tmux(f"mp --url {edge.url} stats cam1", term_env, tmp_path, width, height=50)
    try:
        screen = term.wait(r"^EXIT=\d+$")
    finally:
        term.close()
    assert "EXIT=0" in screen and "Traceback" not in screen, screen
    _fits(screen, width)
    assert re.search(r"^FLOW +cam1  Flow cam1$", screen, re.M), screen
    assert re.search(r"^STATE +Running  (Healthy|Warning|Error|Critical)  up ", screen, re.M), screen
    assert re.search(rf"^INPUT +rtp  receiving  on 127\.0\.0\.1:{ports['cam1']}$", screen, re.M), screen
    assert re.search(r"^  rate +\d+\.\d Mb/s  \d{1,3}(,\d{3})+ packets  \d{1,3}(,\d{3})+ bytes$", screen, re.M)
    assert re.search(r"^  IAT/PDV +IAT min [\d.]+ (ms|µs)  avg .* PDV [\d.]+ (ms|µs)$", screen, re.M), screen
    assert re.search(r"^TR 101 290 +P1 (ok|ERR)  P2 ok  \d{1,3}(,\d{3})+ TS packets$", screen, re.M), screen
    assert re.search(r"^  P  INDICATOR +COUNT  LAST ALARM \(UTC\)$", screen, re.M), screen
    for _name, (priority, label) in TR101290_INDICATORS.items():
        assert re.search(rf"^  {priority}  {label} +[\d,]+  \S", screen, re.M), (label, screen)
    cc = re.search(r"^  1  continuity count error +([\d,]+)  (\d\d:\d\d:\d\dZ), (active|cleared \S+)$", screen, re.M)
    assert cc and int(cc[1].replace(",", "")) > 0, screen  # the count and when its alarm was raised
    assert re.search(r"^MEDIA +rtp  rtp_ts  1 program  [\d.]+ Mb/s$", screen, re.M), screen
    assert re.search(r"^  video +PID 256  h264", screen, re.M), screen
    assert re.search(r"^  ID +(TYPE +)?STATE +BITRATE +(SENT +)?DROPPED", screen, re.M), screen
    assert re.search(r"^  out1 +(udp +)?active +\d+\.\d Mb/s .* to 127\.0\.0\.1:\d+$", screen, re.M), screen
    assert re.search(r"^  out2 +(udp +)?active ", screen, re.M), screen


def _row(screen: str, flow_id: str) -> str:
    return next((line for line in screen.splitlines() if line.startswith(flow_id + " ")), "")


def _starts(line: str) -> list[int]:
    return [m.start() for m in re.finditer(r"(?<=  )\S", line)]


@pytest.mark.e2e
@pytest.mark.parametrize("width", [80, 132])
def test_mp_stats_watch_fits_the_terminal_and_holds_still(
    live_edge: tuple[Edge, dict[str, int]], term_env: dict[str, str], tmp_path: Path, width: int
) -> None:
    edge, _ = live_edge
    term = Tmux(f"mp --url {edge.url} stats --watch", term_env, tmp_path, width, height=12)
    try:
        first = term.wait(r"^cam1 .*Mb/s")
        stamp = re.search(r"updated (\d\d:\d\d:\d\d)", first)
        assert stamp, first

        def redrawn() -> str | None:
            screen = term.screen()
            return screen if f"updated {stamp[1]}" not in screen and _row(screen, "cam1") else None

        second = wait_for(redrawn, 20, 0.2)
        for screen in (first, second):
            _fits(screen, width)
            assert screen.count("FLOW") == 1, screen  # redrawn in place
            header = next(line for line in screen.splitlines() if line.startswith("FLOW"))
            for column in ("FLOW", "HEALTH", "LOST", "P1", "P2", "OUTPUTS"):
                assert column in header.split(), header
            assert re.search(
                r"^cam1 .*(Healthy|Warning|Error|Critical) .* \d+\.\d Mb/s .*  (ok|ERR) +ok +\S", _row(screen, "cam1")
            )
            assert re.search(r" \d+\.\d Mb/s", _row(screen, "studio-b-backup")), screen
        head = [next(line for line in s.splitlines() if line.startswith("FLOW")) for s in (first, second)]
        assert head[0] == head[1]  # the same columns at the same places
        assert _starts(_row(first, "cam1")) == _starts(_row(second, "cam1")), (first, second)
        if width == 132:
            assert head[0].split() == ["FLOW", "STATE", "HEALTH", "INPUT", "BITRATE", "PACKETS", "LOST", "FEC",
                                       "P1", "P2", "OUTPUTS"]  # fmt: skip
            assert re.search(r" \d{1,3}(,\d{3})+ ", _row(second, "cam1")), second  # thousands separators
            assert re.search(r"out1 \d+\.\d Mb/s, out2 \d+\.\d Mb/s$", _row(second, "cam1")), second
        else:
            assert re.search(r"2/2 active$|out1 \d+\.\d Mb/s, out2 \d+\.\d Mb/s$", _row(second, "cam1")), second
        term.keys("C-c")
        term.wait(r"^EXIT=130$")
    finally:
        term.close()


@pytest.mark.e2e
def test_mp_stats_flow_watch_redraws_the_detail_view_with_when_a_count_went_up(
    live_edge: tuple[Edge, dict[str, int]], term_env: dict[str, str], tmp_path: Path
) -> None:
    edge, _ = live_edge
    term = Tmux(f"mp --url {edge.url} stats cam1 --watch", term_env, tmp_path, 80, height=50)
    try:  # the stream has a continuity error every 0.7 s: the count goes up while mp watches
        screen = term.wait(r"^  1  continuity count error +[\d,]+  seen \d\d:\d\d:\d\dZ$")
        _fits(screen, 80)
        assert screen.count("TR 101 290") == 1, screen  # redrawn in place
        assert re.search(r"^  1  TS sync loss +0  -$", screen, re.M), screen
        assert re.search(r"^http://127\.0\.0\.1:\d+  updated \d\d:\d\d:\d\d  Ctrl-C to quit$", screen, re.M), screen
        term.keys("C-c")
        term.wait(r"^EXIT=130$")
    finally:
        term.close()


def test_a_stopped_flow_reads_plainly() -> None:
    stopped = {
        "flow_id": "off1",
        "flow_name": "Off",
        "state": "Stopped",
        "health": "Healthy",
        "uptime_secs": 0,
        "input": {"input_type": "rtp", "state": "idle", "bitrate_bps": 0, "packets_lost": 0},
        "outputs": [],
        "tr101290": None,
        "media_analysis": None,
        "iat": None,
        "pdv_jitter_us": None,
    }
    text = stats_detail(stopped, False, 80, {"input": {"bind_addr": "0.0.0.0:5000"}}, {})
    assert text.splitlines()[:3] == [
        "FLOW        off1  Off",
        "STATE       Stopped  Healthy",
        "INPUT       rtp  idle  on 0.0.0.0:5000",
    ]
    assert "TR 101 290  - (no analysis: the flow is not running)" in text and "OUTPUTS     none" in text
    row = stats_table({"flows": [stopped]}, False, 80).splitlines()[1]
    assert row.split() == ["off1", "Stopped", "Healthy", "0", "b/s", "0", "-", "-", "-"]
