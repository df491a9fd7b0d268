"""Fast start: `mp --help` and `mp flow list` import nothing heavy they do not use.

Timing lives in bench/cli_start.py; this test pins the cause of slowness instead:
which modules a run pulls in. It runs the real entry point in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli.stub import ok, stub_server

SERVER_STACK = {"quart", "quart_trio", "hypercorn", "trio", "trio_websocket", "services", "werkzeug", "aioquic"}
HEAVY = {"httpx", "httpcore", "rich.live", "numpy", "cryptography", "jwt", "prometheus_client"}

PROBE = """
import atexit, json, sys
def dump():
    sys.__stderr__.write("\\nMODULES=" + json.dumps(sorted(sys.modules)) + "\\n")
atexit.register(dump)
sys.argv = ["mp", *json.loads(sys.argv[1])]
from cli.main import main
main()
"""


def loaded_modules(args: list[str], env: dict[str, str]) -> tuple[int, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], env=env, capture_output=True, text=True, timeout=60
    )
    marker = done.stderr.rsplit("MODULES=", 1)
    assert len(marker) == 2, done.stderr
    return done.returncode, {name for name in json.loads(marker[1]) if name}


def tops(modules: set[str]) -> set[str]:
    return modules | {m.split(".")[0] for m in modules}


def test_flow_list_imports_neither_the_server_stack_nor_pydantic_nor_rich(cli_env: dict[str, str]) -> None:
    with stub_server({("GET", "/api/v1/flows"): ok({"flows": []})}) as stub:
        code, modules = loaded_modules(["--url", stub.url, "flow", "list"], cli_env)
    assert code == 0
    assert "cli.commands.flow" in modules  # the probe really ran the command
    found = tops(modules)
    assert not found & SERVER_STACK
    assert not found & HEAVY
    assert "pydantic" not in found  # Typer would import it per option; cli/_fastparams.py prevents that
    assert "rich" not in found  # tables are plain text (cli/render.py)
    assert "yaml" not in found
    assert not found & {"http", "email", "ssl"}  # cli/_http.py: a plain socket, no http.client


def test_flow_list_as_a_table_stays_light_too(cli_env: dict[str, str]) -> None:
    with stub_server({("GET", "/api/v1/flows"): ok({"flows": []})}) as stub:
        code, modules = loaded_modules(["--url", stub.url, "flow", "list", "-o", "table"], cli_env)
    assert code == 0
    assert not tops(modules) & (SERVER_STACK | HEAVY | {"pydantic", "rich"})


def test_help_imports_no_server_stack(cli_env: dict[str, str]) -> None:
    code, modules = loaded_modules(["--help"], cli_env)
    assert code == 0
    found = tops(modules)
    assert not found & SERVER_STACK
    assert not found & HEAVY
    assert "pydantic" not in found
    assert "rich" not in found  # plain Click help (rich_markup_mode=None)


@pytest.mark.parametrize("args", [["flow", "create", "--help"], ["stats", "--help"], ["--version"]])
def test_other_help_pages_stay_light(args: list[str], cli_env: dict[str, str]) -> None:
    code, modules = loaded_modules(args, cli_env)
    assert code == 0
    assert not tops(modules) & (SERVER_STACK | HEAVY | {"pydantic"})
