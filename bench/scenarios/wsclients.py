"""N WebSocket clients of the edge's stats stream, for a bounded time (a child process of scenario 5).

    python -m bench.scenarios.wsclients ws://127.0.0.1:PORT/api/v1/ws/stats COUNT SECONDS

Prints ``{"connected": n}`` once every client is connected (or after 30 s), then at the end
``{"connected": n, "frames": total, "errors": e}``. Each client reads every frame.
"""

from __future__ import annotations

import json
import sys

import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url


async def run(url: str, count: int, seconds: float) -> dict[str, int]:
    counts = {"connected": 0, "frames": 0, "errors": 0}
    all_connected = trio.Event()

    async def client() -> None:
        try:
            async with open_websocket_url(url) as ws:
                counts["connected"] += 1
                if counts["connected"] == count:
                    all_connected.set()
                while True:
                    await ws.get_message()
                    counts["frames"] += 1
        except (OSError, HandshakeError, ConnectionClosed):
            counts["errors"] += 1

    async def announce() -> None:
        with trio.move_on_after(30):
            await all_connected.wait()
        print(json.dumps({"connected": counts["connected"]}), flush=True)

    with trio.move_on_after(seconds + 30):
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(client)
            await announce()
            await trio.sleep(seconds)
            nursery.cancel_scope.cancel()
    return counts


def main() -> None:
    url, count, seconds = sys.argv[1], int(sys.argv[2]), min(float(sys.argv[3]), 600.0)
    print(json.dumps(trio.run(run, url, count, seconds)), flush=True)


if __name__ == "__main__":
    main()
