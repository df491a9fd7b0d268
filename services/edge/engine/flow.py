"""One running flow inside an engine worker: its input loop, outputs and analysis.

A flow runs on the immutable ``FlowConfig`` it was started with; a change is a
restart (stop, then start) decided by the control process. Outputs are the one
exception: they are hot-added and hot-removed without touching the input or
the other outputs (edge interface §3).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Final

import trio

from appliance.models.config import FlowConfig, OutputConfig, RtpInput, UdpInput
from appliance.netio import BatchReceiver
from services.edge.core.analysis import FlowAnalysis
from services.edge.core.rtp import parse_rtp
from services.edge.core.seq import SequenceTracker
from services.edge.engine.udp import TS_PACKET, FlowStartError, UdpOutputDriver, open_input_socket

_log = logging.getLogger("mediaplane.engine")
RECV_BATCH: Final = 64
SIGNAL_TIMEOUT_S: Final = 1.0  # no datagram for this long: the input state is "waiting"


class TokenBucket:
    """``max_bitrate_mbps`` policing (interop.md 2.3): bytes over the rate are filtered."""

    def __init__(self, rate_mbps: float) -> None:
        self.rate_bytes_s = rate_mbps * 1e6 / 8
        # A 50 ms burst, at least a few datagrams, so jitter on a compliant stream passes.
        self.capacity = max(self.rate_bytes_s * 0.05, 8 * 1500)
        self.tokens = self.capacity
        self.last: float | None = None

    def allow(self, size: int, now: float) -> bool:
        if self.last is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate_bytes_s)
        self.last = now
        if self.tokens >= size:
            self.tokens -= size
            return True
        return False


class FlowRuntime:
    """A started flow in this worker. ``run`` binds, reports started, then pumps."""

    def __init__(self, config: FlowConfig, on_failed: Callable[[str, str], None]) -> None:
        if not isinstance(config.input, (RtpInput, UdpInput)):
            raise FlowStartError(f"input type {config.input.type!r} is not supported by this engine yet")
        self.config = config
        self.flow_id = config.id
        self.input_config: RtpInput | UdpInput = config.input
        self.is_rtp = isinstance(config.input, RtpInput)
        self.scope = trio.CancelScope()
        self.outputs: list[UdpOutputDriver] = []
        self.analysis = FlowAnalysis(
            media_analysis=config.media_analysis,
            tr07_mode=getattr(config.input, "tr07_mode", False),
        )
        self.sequence = SequenceTracker()
        self.packets_received = 0
        self.bytes_received = 0
        self.packets_filtered = 0
        self.last_arrival = 0.0
        self._on_failed = on_failed
        self._ssrc = int.from_bytes(os.urandom(4), "big")
        self._nursery: trio.Nursery | None = None
        self._allowed_sources: frozenset[str] | None = None
        self._allowed_pts: frozenset[int] | None = None
        self._bucket: TokenBucket | None = None
        if isinstance(self.input_config, RtpInput):
            if self.input_config.allowed_sources:
                self._allowed_sources = frozenset(
                    ipaddress.ip_address(ip).compressed for ip in self.input_config.allowed_sources
                )
            if self.input_config.allowed_payload_types:
                self._allowed_pts = frozenset(self.input_config.allowed_payload_types)
            if self.input_config.max_bitrate_mbps:
                self._bucket = TokenBucket(self.input_config.max_bitrate_mbps)
        # Kernel receive times are CLOCK_REALTIME; the analysers want one monotonic clock.
        self._realtime_offset = time.time() - time.monotonic()

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the input and open the outputs (errors come out of ``nursery.start``), then pump."""
        with self.scope:
            sock = open_input_socket(self.input_config.bind_addr, self.input_config.interface_addr)
            try:
                for output in self.config.outputs:
                    self.outputs.append(self._open_output(output))
            except FlowStartError:
                sock.close()
                self._close_outputs()
                raise
            with sock:
                try:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        for output in self.outputs:
                            nursery.start_soon(output.run_writer)
                        task_status.started()
                        await self._pump(sock)
                except Exception as exc:  # the flow boundary (style §3): the flow fails, the worker runs on
                    _log.error("flow %s failed", self.flow_id, exc_info=exc)
                    self._on_failed(self.flow_id, f"input failed: {exc}")
                finally:
                    self._close_outputs()

    def _open_output(self, config: OutputConfig) -> UdpOutputDriver:
        if config.type not in ("rtp", "udp"):
            raise FlowStartError(f"output type {config.type!r} is not supported by this engine yet")
        driver = UdpOutputDriver(config, input_is_rtp=self.is_rtp, ssrc=self._ssrc)  # type: ignore[arg-type]
        driver.open()
        return driver

    def stop(self) -> None:
        self.scope.cancel()

    def _close_outputs(self) -> None:
        for output in self.outputs:
            output.close()

    def add_output(self, config: OutputConfig) -> None:
        """Hot-add: open the output and append it; the input loop picks it up on its next batch."""
        if any(o.output_id == config.id for o in self.outputs):
            raise FlowStartError(f"output {config.id!r} exists in flow {self.flow_id!r}")
        driver = self._open_output(config)
        assert self._nursery is not None
        self._nursery.start_soon(driver.run_writer)
        # A new list, so an iteration in progress is not disturbed.
        self.outputs = [*self.outputs, driver]

    def remove_output(self, output_id: str) -> bool:
        """Hot-remove; False when the output is not running in this flow."""
        driver = next((o for o in self.outputs if o.output_id == output_id), None)
        if driver is None:
            return False
        self.outputs = [o for o in self.outputs if o is not driver]
        driver.close()
        return True

    # ------------------------------------------------------------------ data path

    async def _pump(self, sock: socket.socket) -> None:
        receiver = BatchReceiver(sock, batch=RECV_BATCH, slot_size=2048, timestamps=True)
        handle = self._handle_rtp_batch if self.is_rtp else self._handle_udp_batch
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                count = receiver.recv_batch()
                if count == 0:
                    break
                handle(receiver, count)
                for output in self.outputs:
                    output.flush()
                if count < RECV_BATCH:
                    break
                await trio.lowlevel.checkpoint()  # a full batch: let other flows run

    def _handle_rtp_batch(self, receiver: BatchReceiver, count: int) -> None:
        views, arrivals, sources = receiver.views, receiver.arrivals, receiver.sources
        outputs = self.outputs
        offset = self._realtime_offset
        payloads: list[memoryview] = []
        times: list[float] = []
        rtp_times: list[int | None] = []
        allowed_sources, allowed_pts, bucket = self._allowed_sources, self._allowed_pts, self._bucket
        for i in range(count):
            view = views[i]
            size = len(view)
            arrival = arrivals[i] - offset
            self.packets_received += 1
            self.bytes_received += size
            if allowed_sources is not None and ipaddress.ip_address(sources[i][0]).compressed not in allowed_sources:
                self.packets_filtered += 1
                continue
            header = parse_rtp(view)
            if header is None or not _is_ts(view, header.payload_offset, header.payload_end):
                self.packets_filtered += 1  # not RTP carrying whole TS packets
                continue
            if allowed_pts is not None and header.payload_type not in allowed_pts:
                self.packets_filtered += 1
                continue
            if bucket is not None and not bucket.allow(size, arrival):
                self.packets_filtered += 1
                continue
            self.sequence.on_packet(header.sequence, header.ssrc)
            datagram = bytes(view)
            payload = memoryview(datagram)[header.payload_offset : header.payload_end]
            payloads.append(payload)
            times.append(arrival)
            rtp_times.append(header.timestamp)
            for output in outputs:
                output.offer(datagram, payload, arrival)
        if payloads:
            self.last_arrival = times[-1]
            self.analysis.on_batch(payloads, times, rtp_times)

    def _handle_udp_batch(self, receiver: BatchReceiver, count: int) -> None:
        views, arrivals = receiver.views, receiver.arrivals
        outputs = self.outputs
        offset = self._realtime_offset
        payloads: list[memoryview] = []
        times: list[float] = []
        for i in range(count):
            view = views[i]
            size = len(view)
            self.packets_received += 1
            self.bytes_received += size
            if not _is_ts(view, 0, size):
                self.packets_filtered += 1
                continue
            arrival = arrivals[i] - offset
            datagram = bytes(view)
            payload = memoryview(datagram)
            payloads.append(payload)
            times.append(arrival)
            for output in outputs:
                output.offer(datagram, payload, arrival)
        if payloads:
            self.last_arrival = times[-1]
            self.analysis.on_batch(payloads, times, [None] * len(payloads))

    # ------------------------------------------------------------------ stats

    def counters(self, now_monotonic: float) -> dict[str, object]:
        """The compact per-flow snapshot sent to the control process."""
        receiving = self.packets_received > 0 and now_monotonic - self.last_arrival < SIGNAL_TIMEOUT_S
        snapshot = self.analysis.snapshot(now_monotonic)
        return {
            "input": {
                "state": "receiving" if receiving else ("listening" if self.packets_received == 0 else "waiting"),
                "packets_received": self.packets_received,
                "bytes_received": self.bytes_received,
                "packets_lost": self.sequence.lost,
                "packets_filtered": self.packets_filtered,
                "packets_recovered_fec": 0,
                "redundancy_switches": 0,
            },
            "outputs": [output.counters() for output in self.outputs],
            "analysis": snapshot,
        }


def _is_ts(view: memoryview, start: int, end: int) -> bool:
    """Whole 188-byte TS packets. A bad sync byte inside is the analyser's to count (TR 101 290)."""
    length = end - start
    return length > 0 and length % TS_PACKET == 0
