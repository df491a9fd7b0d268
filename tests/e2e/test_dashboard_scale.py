"""The fleet page with 200 nodes (issue 21: "still usable with 200 nodes"), measured in Chromium.

A real ``mp-manager``; 200 nodes created through ``POST /api/v1/nodes`` and simulated by
bench/manager.py's node workers (2 processes, one trio loop each): each registers over the real
``/ws/node`` link with its token and sends an edge-shaped ``stats`` (2 running flows) every
second and ``health`` every 15 s. Chromium opens ``/fleet`` as the admin; once the summary shows
all 200 online, the page is watched for MEASURE_S seconds:

- **update cadence**: fleet.js pushes ``performance.now()`` to ``window.__mpFleetUpdates`` after
  applying each ``dashboard_update`` (and the apply time to ``window.__mpFleetApplyMs``); the
  intervals' median must be <= 1.5 s, no gap over 6 s, and one update's apply p95 <= 100 ms;
- **main-thread load**: CDP ``Performance.getMetrics`` (``TaskDuration``, ``ScriptDuration``)
  before and after, and a ``longtask`` PerformanceObserver over the window: the main thread
  must be busy less than half of the wall time.

The figures are printed (``-s`` shows them) for the closing note.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from bench.manager import Workers, create_nodes
from bench.tools.procfs import cpu_seconds
from tests.helpers.dashboard import ADMIN_PASSWORD, ADMIN_USER, DashboardFleet, dashboard_fleet, shoot, signed_in
from tests.helpers.manager import tls_context

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

NODES = 200
WORKERS = 2
CONNECT_CONCURRENCY = 50
CONNECT_LIMIT_S = 60.0
MEASURE_S = 24.0  # ~23 updates: the nearest-rank p95 of their apply times (rank 22 of 23) is not the largest
MAX_MEDIAN_INTERVAL_S = 1.5
"""The stream's period is 1 s (interop.md 7.5 ``stats_broadcast_interval_ms``). The median, not the
p95: on a loaded 2-core CI host the manager (not the page) builds the odd frame late."""
MAX_APPLY_P95_MS = 100.0
"""The page's own share: applying one update to the 50 rows on screen."""
MAX_GAP_S = 6.0  # interop.md 6: at least one update every 5 s, plus a second of slack
MAX_BUSY_SHARE = 0.5

LONGTASKS_JS = """() => {
    window.__mpLongTasks = [];
    window.__mpMeasureFrom = performance.now();
    new PerformanceObserver((list) => {
        for (const entry of list.getEntries()) window.__mpLongTasks.push([entry.startTime, entry.duration]);
    }).observe({ type: "longtask" });
    return window.__mpMeasureFrom;
}"""


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


async def _add_nodes(fleet: DashboardFleet, workers: Workers) -> int:
    """Create NODES nodes and have the workers connect them; how many authenticated."""
    manager = fleet.manager
    async with httpx.AsyncClient(base_url=manager.url, verify=tls_context(manager.cert_path), timeout=30) as client:
        login = await client.post("/api/v1/auth/login", json={"username": ADMIN_USER, "password": ADMIN_PASSWORD})
        assert login.status_code == 200, login.text
        client.headers["X-CSRF-Token"] = login.json()["csrf_token"]
        tokens = await create_nodes(client, NODES, 0)
    shares = [("add", tokens[i::WORKERS]) for i in range(WORKERS)]
    replies = await workers.ask_all(shares, CONNECT_LIMIT_S + 30)
    return sum(reply["connected"] for reply in replies)


@contextmanager
def simulated_fleet(tmp_path: Path) -> Iterator[DashboardFleet]:
    with dashboard_fleet(tmp_path) as fleet:
        started = time.monotonic()
        workers = Workers(
            WORKERS, f"wss://127.0.0.1:{fleet.manager.port}/ws/node", fleet.manager.cert_path, CONNECT_CONCURRENCY
        )
        try:
            connected = trio.run(_add_nodes, fleet, workers)
            assert connected == NODES, f"{connected} of {NODES} simulated nodes connected"
            print(f"\n{NODES} simulated nodes connected in {time.monotonic() - started:.1f} s")
            yield fleet
        finally:
            workers.stop()


def test_the_fleet_page_stays_live_with_200_nodes(tmp_path: Path) -> None:
    with simulated_fleet(tmp_path) as fleet, signed_in(fleet.manager) as session:
        page = session.page
        from playwright.sync_api import expect

        expect(page.locator("#sum-online")).to_have_text(str(NODES), timeout=30_000)
        expect(page.locator("#fleet-body tr[data-node-id]")).to_have_count(50)  # one page of rows
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        before = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        t0 = page.evaluate(LONGTASKS_JS)
        pid = fleet.manager.process.pid
        manager_cpu0, started = cpu_seconds(pid), time.monotonic()
        # Bounded: the window ends MEASURE_S after t0 (page time), or fails 20 s later.
        page.wait_for_function(
            "([t0, span]) => performance.now() - t0 >= span",
            arg=[t0, MEASURE_S * 1000],
            polling=500,
            timeout=(MEASURE_S + 20) * 1000,
        )
        after = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        manager_cpu = (cpu_seconds(pid) - manager_cpu0) / (time.monotonic() - started)
        seen: dict[str, Any] = page.evaluate(
            """(t0) => ({
                marks: window.__mpFleetUpdates.filter((t) => t >= t0),
                costs: window.__mpFleetApplyMs.filter((_, i) => window.__mpFleetUpdates[i] >= t0),
                sent: window.__mpFleetSentAt.filter((_, i) => window.__mpFleetUpdates[i] >= t0),
                longtasks: window.__mpLongTasks,
                now: performance.now(),
                origin: performance.timeOrigin,
                rows: document.querySelectorAll('#fleet-body tr[data-node-id]').length,
                online: document.getElementById('sum-online').textContent,
            })""",
            t0,
        )
        shoot(page, "fleet-200")

        marks: list[float] = seen["marks"]
        costs: list[float] = seen["costs"]
        wall_ms = seen["now"] - t0
        # The first interval runs from the window's start to the first update in it.
        intervals = [(b - a) / 1000 for a, b in zip([t0, *marks], [*marks, seen["now"]], strict=True)]
        update_intervals = intervals[1:-1]  # between two applied updates
        task_s = after["TaskDuration"] - before["TaskDuration"]
        script_s = after["ScriptDuration"] - before["ScriptDuration"]
        layout_s = after["LayoutDuration"] - before["LayoutDuration"]
        busy = task_s / (wall_ms / 1000)
        longtasks = seen["longtasks"]
        longest = max((duration for _, duration in longtasks), default=0.0)
        # The manager's side: the intervals between the frames' own timestamps (when it built them).
        sent: list[float] = seen["sent"]
        produced = [(b - a) / 1000 for a, b in itertools.pairwise(sent)]
        # Built by the manager -> applied in the page (one host, one clock): the page's own lag.
        lag_ms = [seen["origin"] + mark - at for mark, at in zip(marks, sent, strict=True)]
        print(
            f"fleet page, {NODES} nodes, {wall_ms / 1000:.1f} s window: {len(marks)} updates applied;"
            f" interval p50 {percentile(update_intervals, 0.5):.2f} s, p95 {percentile(update_intervals, 0.95):.2f} s,"
            f" max gap {max(intervals):.2f} s; apply p50 {percentile(costs, 0.5):.1f} ms,"
            f" p95 {percentile(costs, 0.95):.1f} ms, max {max(costs, default=math.nan):.1f} ms;"
            f" frame built -> applied p50 {percentile(lag_ms, 0.5):.0f} ms, p95 {percentile(lag_ms, 0.95):.0f} ms;"
            f" main thread busy {busy:.1%} (task {task_s:.2f} s, script {script_s:.2f} s, layout {layout_s:.2f} s);"
            f" {len(longtasks)} long tasks, longest {longest:.0f} ms; manager: frames built p95"
            f" {percentile(produced, 0.95):.2f} s apart (max {max(produced, default=math.nan):.2f} s),"
            f" CPU {manager_cpu:.0%} of a core; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        assert seen["online"] == str(NODES)
        assert seen["rows"] == 50
        assert len(marks) >= MEASURE_S / MAX_GAP_S, f"only {len(marks)} updates in {wall_ms:.0f} ms"
        assert percentile(update_intervals, 0.5) <= MAX_MEDIAN_INTERVAL_S, update_intervals
        assert percentile(costs, 0.95) <= MAX_APPLY_P95_MS, costs
        assert max(intervals) <= MAX_GAP_S, intervals
        assert busy < MAX_BUSY_SHARE, f"main thread busy {busy:.1%}"
        assert session.problems == []
