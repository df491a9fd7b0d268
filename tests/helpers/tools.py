"""Test-time access to the external tools the tests drive (ffmpeg, ffprobe, ...)."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["need_tool"]


def need_tool(tool: str) -> str:
    """The tool's path; skip without it, but fail under ``CI=true``, where a skip would be a
    silent pass (tools/ensure-debs.sh installs every tool the tests use)."""
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is missing in CI (tools/ensure-debs.sh installs it)")
        pytest.skip(f"{tool} not installed")
    return path
