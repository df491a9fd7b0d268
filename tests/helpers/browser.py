"""Debian's headless Chromium for the browser tests (driven through playwright, never a
browser download): where it is, how it is started, and the skip rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("MEDIAPLANE_CHROMIUM", "/usr/bin/chromium"))
# Without the background-networking switches Chromium keeps dialling Google's hosts, which
# this closed network refuses (many at a time).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IN_CI = os.environ.get("CI", "").lower() == "true"
WAIT_MS = 20_000  # every browser-side wait is bounded (generous: 2 shared cores)


def need_chromium() -> None:
    """Skip without Debian's chromium; fail under ``CI=true``, where a skip would be a silent pass."""
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return
    reason = f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    if IN_CI:
        pytest.fail(f"{reason}; CI=true, where a skip would be a silent pass")
    pytest.skip(reason)
