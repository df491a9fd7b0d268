"""The ``udp`` input kind: raw MPEG-TS over UDP, no RTP header (interop.md 2.3).

The ``udp`` and ``rtp`` *outputs* share one driver, ``engine.udp.UdpOutputDriver``.
"""

from __future__ import annotations

import socket
from typing import Any

import trio

from appliance.models.config import OutputConfig, RtpOutput, UdpInput, UdpOutput
from appliance.netio import BatchReceiver
from services.edge.engine.kinds.base import FlowPort, OutputDriver
from services.edge.engine.kinds.rtp import drain
from services.edge.engine.udp import UdpOutputDriver, open_input_socket


class UdpInputDriver:
    """One socket, drained in bounded batches; steady batches are handled in place."""

    def __init__(self, config: UdpInput, flow: FlowPort) -> None:
        self.config = config
        self.flow = flow
        self.sock: socket.socket | None = None

    def open(self) -> None:
        self.sock = open_input_socket(self.config.bind_addr, self.config.interface_addr)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = self.sock
        assert sock is not None
        flow = self.flow
        on_ts = flow.on_ts

        def per_packet(receiver: BatchReceiver, count: int) -> None:
            views, arrivals = receiver.views, receiver.arrivals
            for i in range(count):
                on_ts(0, views[i], arrivals[i])

        task_status.started()
        await drain(sock, flow, flow.ts_run_in_place, per_packet)

    def state(self, now_monotonic: float) -> str:
        return self.flow.signal_state(now_monotonic)

    def extra_counters(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


def open_udp_output(config: OutputConfig, flow: FlowPort) -> OutputDriver:
    """The ``rtp`` and ``udp`` outputs: sockets opened now (a bind failure fails the start)."""
    assert isinstance(config, (RtpOutput, UdpOutput))
    driver = UdpOutputDriver(config, ssrc=flow.ssrc)
    driver.open()
    return driver
