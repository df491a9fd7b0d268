"""Run the installed `mp` console script against a real edge and look at what it printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

MP = str(Path(sys.executable).with_name("mp"))


class Mp:
    """`mp` bound to one edge URL and one clean HOME."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url = url
        self.env = {**env, "MEDIAPLANE_URL": url}

    def __call__(
        self, *args: str, input: str | None = None, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [MP, *args], env={**self.env, **(env or {})}, input=input, capture_output=True, text=True, timeout=timeout
        )

    def ok(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        done = self(*args, **kw)
        assert done.returncode == 0, f"mp {' '.join(args)} -> {done.returncode}\n{done.stderr}"
        return done

    def data(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.ok(*args, **kw).stdout)


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *, starts: str = "mp: ") -> str:
    """Assert a failure printed nothing on stdout and exactly one line on stderr; return it."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(starts), done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr.rstrip("\n")
