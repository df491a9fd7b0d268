"""The ``rtmp`` input kind: an RTMP(S) listener that publishers push to (interop.md 2.3).

Flows on one ``listen_addr`` share its listener (``engine/rtmp/listener.py``), each with its
``(app, stream_key)`` route; the publisher's FLV tags become MPEG-TS (``core/mux/from_flv.py``)
handed to the flow as raw TS, 1316-byte datagrams. ``state``: ``receiving`` while a publisher
feeds the flow, else ``listening``; the active publisher's address is ``peer_addr`` in the
input's counters. Events (category ``rtmp``): publisher connected (info), publisher error
(warning), server error (critical).
"""

from __future__ import annotations

from typing import Any

import trio

from appliance.models.config import RtmpInput, split_host_port
from services.edge.engine.kinds.base import FlowPort
from services.edge.engine.rtmp.listener import Route, RtmpListener, join, leave


class RtmpInputDriver:
    """One route on a (possibly shared) RTMP listener."""

    def __init__(self, config: RtmpInput, flow: FlowPort) -> None:
        self.config = config
        self.flow = flow
        self.route = Route(flow, config.app.strip("/"), config.stream_key, config.max_publishers)
        self.listener: RtmpListener | None = None

    def open(self) -> None:
        host, port = split_host_port(self.config.listen_addr)
        self.listener = join(host, port, self.config.tls, self.route)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The listener's system task accepts and feeds the flow; this task only holds the route.
        task_status.started()
        await trio.sleep_forever()

    def state(self, now_monotonic: float) -> str:
        return "receiving" if self.route.active is not None else "listening"

    def extra_counters(self) -> dict[str, Any]:
        active = self.route.active
        return {"peer_addr": active.peer} if active is not None else {}

    def close(self) -> None:
        if self.listener is not None:
            leave(self.listener, self.route)
            self.listener = None
