"""docs/edge.md's auth, token and flow-create examples, run verbatim against an edge set up as ``make run``.

The examples are the fenced ``sh`` blocks each preceded by an ``<!-- example: NAME -->`` line in
docs/edge.md. Each runs in its own ``bash`` (with ``set -eo pipefail``, so every command of the
block must succeed) that starts with the shell variables the earlier blocks set (``TOKEN``), in
the order of ``ORDER``: turn auth on (the demo runs with auth off), get tokens, create a flow,
turn auth off again. When the doc shows a ``json`` block right after an example, the example
must print that: every field shown, with the doc's ``...`` eliding the rest (``{...}``, ``[...]``,
``,...``) and a string ending in ``...`` standing for any string it starts.

The edge is started as tools/demo.py starts it (``mp-edge --config-dir DIR --listen-addr
127.0.0.1``, auth off, the demo flow created through the API) with one difference: a free port
instead of 8080, so the test never meets a running ``make run``. The doc's base URL
``http://127.0.0.1:8080`` is the only text of an example the test replaces. The demo flow holds
the demo's input port, so a create example that took it would be refused (409).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.edge import running_edge
from tools import demo

DOC = Path(__file__).resolve().parents[2] / "docs" / "edge.md"
DOC_URL = "http://127.0.0.1:8080"
# Every marked example, in the order they run (a new marker must be added here on purpose).
ORDER = ["auth-on", "token", "token-forms", "token-shell", "create", "auth-off"]

_MARKER = re.compile(r"^<!-- example: ([a-z0-9-]+) -->\s*$")
_FENCE = re.compile(r"^\s*```(\w*)\s*$")


def examples(text: str) -> dict[str, tuple[str, str | None]]:
    """NAME -> (the sh block after its marker, the json block right after that or None)."""
    lines = text.splitlines()
    found: dict[str, tuple[str, str | None]] = {}

    def block_at(index: int) -> tuple[str, str, int] | None:
        """The fenced block opening at ``lines[index]``: (language, body, index after it)."""
        match = _FENCE.match(lines[index]) if index < len(lines) else None
        if match is None:
            return None
        indent = len(lines[index]) - len(lines[index].lstrip())
        end = index + 1
        while end < len(lines) and not _FENCE.match(lines[end]):
            end += 1
        body = "\n".join(line[indent:] for line in lines[index + 1 : end])
        return match.group(1), body, end + 1

    for index, line in enumerate(lines):
        marker = _MARKER.match(line.strip())
        if marker is None:
            continue
        name = marker.group(1)
        assert name not in found, f"docs/edge.md marks two examples {name!r}"
        command = block_at(index + 1)
        assert command is not None and command[0] == "sh", f"example {name!r}: no ```sh block right after its marker"
        answer = block_at(command[2])
        found[name] = (command[1], answer[1] if answer is not None and answer[0] == "json" else None)
    return found


def doc_json(text: str) -> Any:
    """The doc's JSON with its ellipses taken out."""
    text = text.replace("{...}", "{}").replace("[...]", "[]")
    text = re.sub(r",\s*\.\.\.(?=\s*[}\]])", "", text)
    return json.loads(text)


def json_values(text: str) -> list[Any]:
    """The JSON values printed one after another (several ``curl -s`` answers, no newline between)."""
    decoder = json.JSONDecoder()
    values, index = [], 0
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        value, index = decoder.raw_decode(text, index)
        values.append(value)
    return values


def assert_shows(actual: Any, shown: Any, where: str = "$") -> None:
    """``actual`` has everything ``shown`` shows (a dict's keys, a list's first items, equal values)."""
    if isinstance(shown, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in shown.items():
            assert key in actual, f"{where}: no key {key!r} in {actual!r}"
            assert_shows(actual[key], value, f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(actual, list) and len(actual) >= len(shown), f"{where}: expected {shown!r}, got {actual!r}"
        for index, value in enumerate(shown):
            assert_shows(actual[index], value, f"{where}[{index}]")
    elif isinstance(shown, str) and shown.endswith("..."):
        assert isinstance(actual, str) and actual.startswith(shown[:-3]), f"{where}: {actual!r} is not {shown!r}"
    else:
        assert actual == shown, f"{where}: {actual!r} != {shown!r}"


def run_example(name: str, script: str, base_url: str, state: Path) -> str:
    body = script.replace(DOC_URL, base_url)
    wrapper = f"set -eo pipefail\nsource {state}\n{body}\ndeclare -p TOKEN > {state} 2>/dev/null || true\n"
    result = subprocess.run(["bash", "-c", wrapper], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (
        f"example {name!r} exited {result.returncode}:\n{body}\n{result.stdout}{result.stderr}"
    )
    assert result.stderr == "", f"example {name!r} wrote to stderr: {result.stderr}"
    return result.stdout


def test_the_marked_examples_are_the_expected_ones() -> None:
    found = examples(DOC.read_text())
    assert sorted(found) == sorted(ORDER), list(found)
    for name in ORDER:
        assert DOC_URL in found[name][0], f"example {name!r} does not talk to {DOC_URL} (make run's edge)"


def test_the_create_example_keeps_off_the_demo_ports() -> None:
    create = examples(DOC.read_text())["create"][0]
    addresses = set(re.findall(r'"(?:bind_addr|dest_addr)"\s*:\s*"([^"]+)"', create))
    assert addresses, create
    demo_addresses = {demo.FLOW["input"]["bind_addr"]} | {out["dest_addr"] for out in demo.FLOW["outputs"]}  # type: ignore[index]
    demo_ports = {address.rsplit(":", 1)[1] for address in demo_addresses} | {"8080", "8443", "9090"}
    assert not {address.rsplit(":", 1)[1] for address in addresses} & demo_ports, addresses


def test_the_examples_run_verbatim_against_the_demo_edge(tmp_path: Path) -> None:
    found = examples(DOC.read_text())
    state = tmp_path / "shell-state"
    state.write_text("")
    with running_edge(tmp_path) as edge:
        # make run's flow, auth off: the create example must not clash with it (the start may
        # fail when another test holds 127.0.0.1:5000; the flow and its addresses are kept anyway).
        with edge.client() as client:
            created = client.post("/api/v1/flows", json=demo.FLOW)
            assert created.status_code in (200, 500), created.text
        for name in ORDER:
            script, answer = found[name]
            out = run_example(name, script, edge.url, state)
            lines = [line for line in out.splitlines() if line.strip()]
            assert lines, f"example {name!r} printed nothing"
            if answer is not None:
                assert len(lines) == 1, f"example {name!r}: one answer expected, got {out}"
                assert_shows(json.loads(lines[0]), doc_json(answer), name)
            else:  # no answer shown: each answer (curl adds no newline) must be JSON and not an error
                for value in json_values(out):
                    assert value.get("success", True) is True and "error" not in value, (name, value)
            if name == "auth-on":
                with edge.client() as client:
                    assert client.get("/api/v1/flows").status_code == 401  # auth is on now
            if name == "token-shell":
                assert state.read_text().startswith("declare"), "TOKEN was not set"
        with edge.client() as client:  # auth-off ran last: the demo's own calls work again
            flows = client.get("/api/v1/flows").json()["data"]["flows"]
            assert {flow["id"] for flow in flows} == {"demo", "cam1"}


@pytest.mark.parametrize(
    ("shown", "actual", "ok"),
    [
        ('{"a":1,...}', {"a": 1, "b": 2}, True),
        ('{"a":{...},"b":[...]}', {"a": {"x": 1}, "b": [1]}, True),
        ('{"t":"eyJ..."}', {"t": "eyJabc"}, True),
        ('{"t":"eyJ..."}', {"t": "xyz"}, False),
        ('{"a":1}', {"a": 2}, False),
        ('{"a":[{"id":"demo",...}]}', {"a": [{"id": "demo", "n": 1}]}, True),
    ],
)
def test_the_comparison_reads_the_docs_ellipses(shown: str, actual: Any, ok: bool) -> None:
    if ok:
        assert_shows(actual, doc_json(shown))
    else:
        with pytest.raises(AssertionError):
            assert_shows(actual, doc_json(shown))
