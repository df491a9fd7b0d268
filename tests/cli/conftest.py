from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A clean environment for `mp`: its own HOME and XDG dir, no MEDIAPLANE_* from the caller."""
    import os

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIAPLANE_", "MP_", "XDG_CONFIG"))}
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1", "COLUMNS": "200"})
    for key in list(os.environ):
        if key.startswith(("MEDIAPLANE_", "MP_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", env["HOME"])
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    monkeypatch.setenv("NO_COLOR", "1")
    yield env
