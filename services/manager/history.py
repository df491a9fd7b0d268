"""The last minutes of every flow's bitrates, per node, for the dashboard's charts (issue 21).

A node page opened during an incident should show what the flow did *before* it was opened:
the browser alone cannot (its charts start empty), so the manager keeps a short window of the
``stats`` frames it already receives (interop.md 6: every second). Sans-IO: fed the payloads and
a wall-clock time, no I/O, no clock of its own.

Memory is bounded: per flow a fixed ring of :data:`DEFAULT_WINDOW_S` samples (one per second at
the most: a faster sender is sampled, not stored whole) of 16 bytes each (time as a double, input
and output bit rates as float32: 600 samples ≈ 9.4 KiB); at most :data:`MAX_FLOWS_PER_NODE` flows
per node. A flow or node that sent nothing for a whole window is dropped (checked per node as it
reports, and for every node once a minute), so a deleted node's history goes by itself.
"""

from __future__ import annotations

import math
import uuid
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["DEFAULT_WINDOW_S", "MAX_FLOWS_PER_NODE", "BitrateHistory", "FlowSeries"]

DEFAULT_WINDOW_S: Final = 600
"""Ten minutes: "the last minutes" of the issue, at one sample a second."""
MAX_FLOWS_PER_NODE: Final = 64
MIN_SPACING_S: Final = 0.9
"""Samples closer than this to the previous one are skipped (one a second at the most)."""
SWEEP_INTERVAL_S: Final = 60.0


@dataclass(slots=True)
class FlowSeries:
    """One flow's ring: ``times`` (Unix seconds), ``input_bps``, ``output_bps`` (all outputs)."""

    capacity: int
    name: str = ""
    times: array[float] = field(default_factory=lambda: array("d"))
    input_bps: array[float] = field(default_factory=lambda: array("f"))
    output_bps: array[float] = field(default_factory=lambda: array("f"))
    head: int = 0
    """Where the next sample goes once the ring is full."""

    def add(self, at: float, input_bps: float, output_bps: float) -> None:
        if len(self.times) < self.capacity:
            self.times.append(at)
            self.input_bps.append(input_bps)
            self.output_bps.append(output_bps)
            return
        self.times[self.head] = at
        self.input_bps[self.head] = input_bps
        self.output_bps[self.head] = output_bps
        self.head = (self.head + 1) % self.capacity

    @property
    def newest(self) -> float:
        if not self.times:
            return -math.inf
        return self.times[(self.head - 1) % len(self.times)]

    def since(self, start: float) -> tuple[list[float], list[float], list[float]]:
        """The samples at or after ``start``, oldest first."""
        order = list(range(self.head, len(self.times))) + list(range(self.head))
        kept = [i for i in order if self.times[i] >= start]
        return (
            [self.times[i] for i in kept],
            [round(self.input_bps[i]) for i in kept],
            [round(self.output_bps[i]) for i in kept],
        )


def _bps(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return 0.0
    return float(value)


class BitrateHistory:
    """Every node's flows' bit rates over the last ``window_s`` seconds."""

    def __init__(self, window_s: int = DEFAULT_WINDOW_S, max_flows_per_node: int = MAX_FLOWS_PER_NODE) -> None:
        self.window_s = window_s
        self._max_flows = max_flows_per_node
        self._nodes: dict[uuid.UUID, dict[str, FlowSeries]] = {}
        self._last_sweep = -math.inf

    def record(self, node_id: uuid.UUID, stats: Mapping[str, object], at: float) -> None:
        """Samples an edge ``stats`` payload (``flows[]`` with ``input.bitrate_bps`` and
        ``outputs[].bitrate_bps``) received at Unix time ``at``. Anything malformed is skipped."""
        flows = stats.get("flows")
        node = self._nodes.setdefault(node_id, {})
        if isinstance(flows, list):
            for flow in flows:
                self._sample(node, flow, at)
        self._expire(node, at)
        if not node:
            del self._nodes[node_id]
        if at - self._last_sweep >= SWEEP_INTERVAL_S:
            self._last_sweep = at
            for other_id in list(self._nodes):
                self._expire(self._nodes[other_id], at)
                if not self._nodes[other_id]:
                    del self._nodes[other_id]

    def _sample(self, node: dict[str, FlowSeries], flow: object, at: float) -> None:
        if not isinstance(flow, Mapping):
            return
        flow_id = flow.get("flow_id")
        if not isinstance(flow_id, str) or not flow_id:
            return
        series = node.get(flow_id)
        if series is None:
            if len(node) >= self._max_flows:
                return
            series = node[flow_id] = FlowSeries(capacity=self.window_s)
        if at - series.newest < MIN_SPACING_S:
            return
        name = flow.get("flow_name")
        series.name = name[:256] if isinstance(name, str) else ""
        source = flow.get("input")
        input_bps = _bps(source.get("bitrate_bps")) if isinstance(source, Mapping) else 0.0
        outputs = flow.get("outputs")
        output_bps = 0.0
        if isinstance(outputs, list):
            output_bps = sum(_bps(out.get("bitrate_bps")) for out in outputs if isinstance(out, Mapping))
        series.add(at, input_bps, output_bps)

    def _expire(self, node: dict[str, FlowSeries], at: float) -> None:
        for flow_id in [flow_id for flow_id, series in node.items() if at - series.newest > self.window_s]:
            del node[flow_id]

    def series(self, node_id: uuid.UUID, now: float, seconds: int | None = None) -> dict[str, Any]:
        """``{window_secs, flows: [{flow_id, flow_name, t, input_bps, output_bps}]}`` for the last
        ``seconds`` (at most the window) before ``now``; flows in id order."""
        span = self.window_s if seconds is None else max(1, min(seconds, self.window_s))
        start = now - span
        flows = []
        for flow_id, found in sorted(self._nodes.get(node_id, {}).items()):
            times, inputs, outputs = found.since(start)
            if times:
                row = {"flow_id": flow_id, "flow_name": found.name, "t": times}
                flows.append({**row, "input_bps": inputs, "output_bps": outputs})
        return {"window_secs": span, "flows": flows}

    def node_count(self) -> int:
        return len(self._nodes)
