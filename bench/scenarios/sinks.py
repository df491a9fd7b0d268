"""Many ``RtpSink``s in one child process, woken by epoll (for 16 outputs and 50 flows).

    python -m bench.scenarios.sinks COUNT      # stdin: reset / report / quit, one JSON line each

The same protocol as ``bench.edge_forward``'s sink child, whose loop polls every socket on each
wake-up: with 50 sockets that is ~50 ``recvmmsg`` calls per datagram at 10 Mbit/s per flow, and
the sink then needs a core of its own. Here only the sockets epoll reports readable are read,
and a busy pass is followed by a 1 ms pause so each ``recvmmsg`` takes a batch. Arrival times
are kernel timestamps, so the pause does not move the latency figures.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from bench.edge_forward import SinkChild
from bench.tools.rtpsink import RtpSink

PAUSE_S = 0.001
REPO = Path(__file__).resolve().parents[2]


def serve(count: int) -> None:
    sinks = [RtpSink(("127.0.0.1", 0), seconds=1e9, latency=index == 0) for index in range(count)]
    by_fd = {sink.sock.fileno(): index for index, sink in enumerate(sinks)}
    poller = select.epoll()
    for fd in by_fd:
        poller.register(fd, select.EPOLLIN)
    stdin = sys.stdin.fileno()
    poller.register(stdin, select.EPOLLIN)
    print(json.dumps({"ports": [s.address[1] for s in sinks]}), flush=True)
    while True:
        events = poller.poll(0.05)
        command = None
        for fd, _ in events:
            if fd == stdin:
                command = sys.stdin.readline().strip()
            else:
                sinks[by_fd[fd]].poll()
        if command is not None:
            if command in ("quit", ""):
                return
            if command == "reset":
                for index, sink in enumerate(sinks):
                    sink.poll()  # anything late from the previous step goes with the old counters
                    sinks[index] = RtpSink(("127.0.0.1", 0), sock=sink.sock, seconds=1e9, latency=index == 0)
                print(json.dumps({"reset": True}), flush=True)
            elif command == "report":
                for sink in sinks:
                    sink.poll()
                reports = []
                for sink in sinks:
                    r = sink.report(0.0)
                    reports.append(
                        {
                            "received": r.received,
                            "lost": r.lost,
                            "reordered": r.reordered,
                            "duplicated": r.duplicated,
                            "latency_ms": r.latency_ms,
                        }
                    )
                print(json.dumps({"sinks": reports}), flush=True)
        elif events:
            time.sleep(PAUSE_S)


class SinkProcess(SinkChild):
    """``SinkChild``'s interface (ports, command, close) on the epoll sink child above."""

    def __init__(self, count: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.scenarios.sinks", str(count)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ports = self._read()["ports"]


if __name__ == "__main__":
    serve(int(sys.argv[1]))
