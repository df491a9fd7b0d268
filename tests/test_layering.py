"""Cores do no I/O (style H11): no trio, sockets, clocks or randomness under core/ and protocol/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE_DIRS = ("services/edge/core", "appliance/protocol", "appliance/tunnel", "appliance/relayproto")
CORE_FILES = (
    "services/relay/native_plane.py",  # services/relay also holds the trio drivers
    "services/relay/control.py",
    "services/edge/nmos/ids.py",
    "services/edge/nmos/tai.py",
    "services/edge/nmos/model.py",
    "services/edge/nmos/connection.py",
    "services/edge/nmos/registration.py",
)
FORBIDDEN = {"trio", "quart", "quart_trio", "hypercorn", "socket", "sqlite3", "time", "random", "asyncio"}


def top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_cores_do_no_io() -> None:
    files = sorted([*(p for d in CORE_DIRS for p in (ROOT / d).rglob("*.py")), *(ROOT / f for f in CORE_FILES)])
    assert len(files) > 5  # an empty list must not pass quietly
    for path in files:
        assert not top_level_imports(path) & FORBIDDEN, path


def test_the_cli_does_not_import_the_server_stack() -> None:
    files = sorted((ROOT / "cli").rglob("*.py"))
    for path in files:
        assert not top_level_imports(path) & {"quart", "quart_trio", "hypercorn", "services"}, path
