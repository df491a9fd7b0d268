"""``appliance.systemd.stop_on_signals``: the one SIGINT/SIGTERM handling of the three services."""

from __future__ import annotations

import logging

import pytest
import trio

from appliance import systemd


async def test_stop_on_signals_sets_stop_and_swallows_a_second_signal(caplog: pytest.LogCaptureFixture) -> None:
    import os
    import signal

    stop = trio.Event()
    with caplog.at_level(logging.INFO, logger="test.signals"):
        async with trio.open_nursery() as nursery:
            await nursery.start(systemd.stop_on_signals, stop, logging.getLogger("test.signals"))
            os.kill(os.getpid(), signal.SIGTERM)
            with trio.fail_after(5):
                await stop.wait()
            os.kill(os.getpid(), signal.SIGINT)  # a second signal while stopping: taken, ignored
            with trio.fail_after(5):
                while "SIGINT received while stopping" not in caplog.text:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()  # trio would re-raise a signal still queued, here
    assert "SIGTERM received: stopping" in caplog.text
