"""The seven scenarios of ``python -m bench``: number -> (title, run(options) -> table rows)."""

from __future__ import annotations

from collections.abc import Callable

from bench.scenarios.common import Options, Row
from bench.scenarios.forward import scenario_1, scenario_2
from bench.scenarios.isolation import scenario_5
from bench.scenarios.latency import scenario_4
from bench.scenarios.multiflow import scenario_3, scenario_6
from bench.scenarios.scaling import scenario_7

SCENARIOS: dict[int, tuple[str, Callable[[Options], list[Row]]]] = {
    1: ("1 input -> 1 UDP output, zero-loss rate vs srt-live-transmit and socat", scenario_1),
    2: ("1 input -> 4 and -> 16 outputs vs GStreamer tee", scenario_2),
    3: ("50, 100, 200 flows x 10 Mbit/s on one worker: loss and CPU", scenario_3),
    4: ("added latency at 50 % of scenario 1's peak", scenario_4),
    5: ("isolation: loss while the REST API and WebSockets are loaded", scenario_5),
    6: ("memory: RSS idle, 1 flow, 50 flows", scenario_6),
    7: ("scaling: K flows over W = 1, 2, ... workers, zero-loss aggregate rate", scenario_7),
}
