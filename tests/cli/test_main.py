"""Exit codes, one-line errors, --debug, local validation before any request, --version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cli.main
from cli.client import EdgeClient
from tests.cli.stub import ok, stub_server
from tests.cli.test_client import run_mp

MP = str(Path(sys.executable).with_name("mp"))


def test_version(cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from appliance import __version__

    assert run_mp(["--version"], capsys) == (0, f"mp {__version__}\n", "")


@pytest.mark.parametrize(
    "args",
    [
        ["flow", "bogus"],
        ["nosuch"],
        ["flow", "show"],
        ["stats", "--count", "x"],
        ["flow", "list", "-o", "xml"],
        ["completion", "tcsh"],
    ],
)
def test_usage_errors_exit_2(args: list[str], cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_mp(args, capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("mp: ")  # one line, like every other error
    assert err.endswith(" --help)\n")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["flwo", "list"], "mp: No such command 'flwo'. Did you mean 'flow'? (try: mp --help)\n"),
        (["flow", "show"], "mp: Missing argument 'FLOW'. (try: mp flow show --help)\n"),
        (
            ["flow", "list", "-o", "xml"],
            "mp: Invalid value for '-o' / '--format': 'xml' is not one of 'table', 'json', 'yaml'. "
            "(try: mp flow list --help)\n",
        ),
    ],
)
def test_usage_error_text(
    args: list[str], expected: str, cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_mp(args, capsys) == (2, "", expected)


def test_command_name_finds_the_word_after_global_options() -> None:
    assert cli.main.command_name(["--url", "http://x:1", "-p", "lab", "--debug", "flow", "list"]) == "flow"
    assert cli.main.command_name(["--timeout", "5", "stats", "--watch"]) == "stats"
    assert cli.main.command_name(["--url", "flow"]) is None  # "flow" is the URL here; nothing named: whole tree
    assert cli.main.command_name(["nosuch"]) is None
    assert cli.main.command_name(["--help"]) is None


def test_ctrl_c_exits_130_without_a_traceback(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(EdgeClient, "get", interrupted)
    code, out, err = run_mp(["flow", "list"], capsys)
    assert (code, out) == (130, "")
    assert "Traceback" not in err


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(EdgeClient, "get", broken)
    assert run_mp(["flow", "list"], capsys) == (
        1,
        "",
        "mp: internal error: ZeroDivisionError: division by zero (rerun with --debug)\n",
    )
    with pytest.raises(ZeroDivisionError):
        cli.main._debug = False
        cli.main.main(["--debug", "flow", "list"])


def test_usage_error_from_mp_itself_is_exit_2(cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_mp(["--url", "ftp://x", "flow", "list"], capsys)
    assert (code, out, err) == (2, "", "mp: the edge URL must start with http:// or https://, not ftp://\n")


def test_flow_create_validates_locally_before_sending(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_server({}) as stub:
        code, out, err = run_mp(
            [
                "--url",
                stub.url,
                "flow",
                "create",
                "f1",
                "--name",
                "Cam 1",
                "--input",
                "rtp://0.0.0.0:0",
                "--output",
                "udp://239.1.1.1:5000",
            ],
            capsys,
        )
        assert code == 2 and out == ""
        assert err.startswith("mp: invalid flow: input.bind_addr: ")
        assert "port must be 1-65535" in err
        code, _, err = run_mp(
            ["--url", stub.url, "flow", "create", "bad id!", "--name", "x", "--input", "rtp://:5000"], capsys
        )
        assert code == 2 and err.startswith("mp: invalid flow: id: ")
        assert stub.requests == []  # nothing was sent


def test_flow_create_without_a_terminal_names_what_is_missing(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_mp(["flow", "create", "f1"], capsys)
    assert (code, out) == (2, "")
    assert err == "mp: missing --name, --input (or give the whole flow with -f flow.json)\n"


def test_flow_create_dry_run_prints_the_body(cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_mp(
        [
            "flow",
            "create",
            "f1",
            "--name",
            "Cam 1",
            "--input",
            "rtp://0.0.0.0:5000",
            "--output",
            "udp://239.1.1.1:5000",
            "--output",
            "rtp://239.1.1.2:5000",
            "--output-id",
            "main",
            "--dry-run",
        ],
        capsys,
    )
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "id": "f1",
        "name": "Cam 1",
        "input": {"type": "rtp", "bind_addr": "0.0.0.0:5000"},
        "outputs": [
            {"type": "udp", "id": "main", "name": "main", "dest_addr": "239.1.1.1:5000"},
            {"type": "rtp", "id": "out1", "name": "out1", "dest_addr": "239.1.1.2:5000"},
        ],
    }


def test_flow_create_from_stdin_sends_the_file(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    body = {"id": "f2", "name": "From file", "input": {"type": "udp", "bind_addr": "0.0.0.0:6000"}, "outputs": []}
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(body)))
    with stub_server({("POST", "/api/v1/flows"): lambda req: (200, {"success": True, "data": req.body})}) as stub:
        code, out, err = run_mp(["--url", stub.url, "flow", "create", "-f", "-"], capsys)
    assert code == 0, err
    assert stub.requests[0].body == body
    assert json.loads(out) == body
    assert err == "flow 'f2' created and started\n"


def test_a_bad_body_file_is_a_usage_error(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "flow.json"
    bad.write_text('{"id": "f1",\n "name": }')
    code, out, err = run_mp(["flow", "create", "-f", str(bad)], capsys)
    assert (code, out) == (2, "")
    assert err == f"mp: {bad} is not valid JSON: Expecting value at line 2 column 10\n"


def test_config_show_masks_flow_secrets_and_apply_refuses_them(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = {
        "version": 1,
        "server": {"listen_addr": "0.0.0.0", "listen_port": 8080},
        "flows": [
            {
                "id": "f1",
                "name": "F",
                "input": {
                    "type": "srt",
                    "mode": "listener",
                    "local_addr": "0.0.0.0:9000",
                    "passphrase": "correct-horse-42",
                },
                "outputs": [],
            }
        ],
    }
    with stub_server({("GET", "/api/v1/config"): ok(config)}) as stub:
        code, out, _ = run_mp(["--url", stub.url, "config", "show"], capsys)
        assert code == 0 and "correct-horse-42" not in out and "**********" in out
        code, out, _ = run_mp(["--url", stub.url, "config", "show", "--show-secrets"], capsys)
        assert json.loads(out) == config
        (tmp_path / "masked.json").write_text(
            json.dumps(json.loads(run_mp(["--url", stub.url, "config", "show"], capsys)[1]))
        )
        code, _, err = run_mp(["--url", stub.url, "config", "apply", "-f", str(tmp_path / "masked.json")], capsys)
        assert code == 2 and "masked secret at flows.0.input.passphrase" in err
        assert stub.count("PUT", "/api/v1/config") == 0


def test_mp_script_runs_and_exits_with_codes(cli_env: dict[str, str]) -> None:
    """The installed console script itself (not just main()): exit code, stdout, stderr."""
    done = subprocess.run([MP, "flow", "show"], env=cli_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and "Missing argument" in done.stderr
    done = subprocess.run(
        [MP, "--url", "http://127.0.0.1:1", "health"], env=cli_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("mp: cannot reach the edge at http://127.0.0.1:1: connection refused")
    assert "Traceback" not in done.stderr
