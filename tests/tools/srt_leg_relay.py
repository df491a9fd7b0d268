"""A two-way, lossy UDP relay for one SRT connection, in a process of its own.

``tests/e2e/test_edge_srt_lossy.py`` runs one per SRT leg. The caller sends to ``port``; the
relay forwards to ``target`` from its own socket, and what the target answers goes back to the
caller's last address. Caller-to-target datagrams are dropped by a ``LossyUdpProxy`` used as the
rule engine (``should_drop``: same seeds, same rules). While the outage is on, every SRT data
packet is dropped and its sequence number remembered, and every later copy of those
(retransmissions) is dropped too, so those messages never reach the target on this leg;
control packets pass. Bounded: it stops on ``stop()`` and in any case after ``max_s``.

Why a process: during an outage the SRT sender retransmits each lost message about seven
times (measured: 2,800 datagrams for 400 messages), and a relay thread busy dropping that storm
held the interpreter from the *other* leg's relay thread in the same process. On a loaded CI
host the other leg's acknowledgements came late enough that its sender dropped a run of
messages (81 in a row, starting with the outage), which no merge can bring back. Each relay
here has an interpreter of its own.

Protocol (stdin/stdout, one line each): the relay prints ``port N`` once bound; it reads
``down``, ``up`` and ``stop``; after ``stop`` it prints its counts as one JSON line and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.tools.lossy_proxy import LossyUdpProxy

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RelayCounts:
    forward: int = 0  # caller -> target datagrams seen
    forward_dropped: int = 0  # by the rules (random loss on data and control packets alike)
    data_dropped: int = 0  # of those, SRT data packets (first bit 0)
    outage_dropped: int = 0  # data packets (first sends and retransmissions) of an outage's messages
    outage_messages: int = 0  # distinct SRT sequence numbers taken out by outages
    backward: int = 0  # target -> caller datagrams


class SrtLegRelay:
    """The test's handle on one relay process: ``port``, ``outage(on)``, ``stop()``, ``counts``.

    ``counts`` is filled by ``stop()`` (the process's final tally)."""

    def __init__(
        self, target: tuple[str, int], *, drop_rate: float, seed: int, passthrough_first: int, max_s: float
    ) -> None:
        self.counts = RelayCounts()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.tools.srt_leg_relay",
                f"{target[0]}:{target[1]}",
                f"--drop-rate={drop_rate}",
                f"--seed={seed}",
                f"--passthrough-first={passthrough_first}",
                f"--max-s={max_s}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=ROOT,  # where ``tests`` imports from
        )
        assert self._process.stdout is not None
        first = self._process.stdout.readline().split()
        if first[:1] != ["port"]:
            self._process.kill()
            raise RuntimeError(f"the SRT leg relay did not start: {first!r}")
        self.port = int(first[1])

    def outage(self, on: bool) -> None:
        self._command("down" if on else "up")

    def stop(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self._command("stop")
            assert self._process.stdout is not None
            try:
                line = self._process.stdout.readline()
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
                raise
            if line:
                self.counts = RelayCounts(**json.loads(line))
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()

    def _command(self, word: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(word + "\n")
        self._process.stdin.flush()


def serve(target: tuple[str, int], rules: LossyUdpProxy, max_s: float) -> None:
    """The relay itself: runs until ``stop`` on stdin (or EOF) or ``max_s``."""
    counts = RelayCounts()
    front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for sock in (front, back):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
    down = threading.Event()
    stopping = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            word = line.strip()
            if word == "down":
                down.set()
            elif word == "up":
                down.clear()
            elif word == "stop":
                break
        stopping.set()

    threading.Thread(target=commands, daemon=True).start()
    print(f"port {front.getsockname()[1]}", flush=True)
    caller: tuple[str, int] | None = None
    gone: set[int] = set()  # SRT sequence numbers this leg must never deliver
    deadline = time.monotonic() + max_s
    while not stopping.is_set() and time.monotonic() < deadline:
        readable, _, _ = select.select([front, back], [], [], 0.02)
        for sock in readable:
            for _ in range(256):  # a bounded batch per wake-up
                try:
                    data, source = sock.recvfrom(65535)
                except (BlockingIOError, InterruptedError):
                    break
                if sock is front:
                    caller = source
                    index = counts.forward
                    counts.forward += 1
                    if len(data) >= 16 and not data[0] & 0x80:  # a data packet: 31-bit sequence number
                        seq = int.from_bytes(data[:4], "big")
                        if down.is_set() and seq not in gone:
                            gone.add(seq)
                            counts.outage_messages += 1
                        if seq in gone:
                            counts.outage_dropped += 1
                            continue
                    if rules.should_drop(index, data):
                        counts.forward_dropped += 1
                        counts.data_dropped += not data[0] & 0x80
                        continue
                    _send(back, data, target)
                else:
                    counts.backward += 1
                    if caller is not None:
                        _send(front, data, caller)
    stopping.wait()  # the counts go out on ``stop`` (or stdin's end: the test is gone)
    print(json.dumps(asdict(counts)), flush=True)


def _send(sock: socket.socket, data: bytes, dest: tuple[str, int]) -> None:
    try:
        sock.sendto(data, dest)
    except OSError:
        pass  # a full buffer on loopback: the SRT layer above sees it as loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="host:port the caller's datagrams go to")
    parser.add_argument("--drop-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--passthrough-first", type=int, default=0)
    parser.add_argument("--max-s", type=float, default=60.0)
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    target = (host, int(port))
    # The rule engine only: its own socket and thread are never used (stopped at the end).
    rules = LossyUdpProxy(target, drop_rate=args.drop_rate, seed=args.seed, passthrough_first=args.passthrough_first)
    try:
        serve(target, rules, args.max_s)
    finally:
        rules.stop()


if __name__ == "__main__":
    main()
