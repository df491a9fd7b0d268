"""Issue 15 item 2: a bad --url, a bad port and `mp completion` alone are usage errors (exit 2, one line).

docs/cli.md, "Exit codes": 2 is "a bad flag, a bad URL, ... (nothing was sent)".
The port wording is the same everywhere a port of 0 is not allowed: "1-65535".
"""

from __future__ import annotations

import subprocess

import pytest
from pydantic import TypeAdapter, ValidationError

from appliance.models.config import BindAddr, SocketAddr
from cli.errors import UsageError
from cli.settings import normalise_url
from cli.urls import parse_input, parse_output
from tests.cli.helpers import MP, one_line_error
from tests.cli.stub import ok, stub_server
from tests.cli.test_client import run_mp


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("htp:/bad", "the edge URL 'htp:/bad' is not http://HOST[:PORT]"),
        ("127.0.0.1:99999", "the edge URL '127.0.0.1:99999': the port must be 1-65535"),
        ("http://127.0.0.1:99999", "the edge URL 'http://127.0.0.1:99999': the port must be 1-65535"),
        ("127.0.0.1:0", "the edge URL '127.0.0.1:0': the port must be 1-65535"),
        ("http://h:port", "the edge URL 'http://h:port': the port must be 1-65535"),
        ("localhost:", "the edge URL 'localhost:' is not http://HOST[:PORT]"),
        ("http://:8080", "the edge URL has no host"),
    ],
)
def test_a_bad_edge_url_is_a_usage_error(
    url: str, text: str, cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_mp(["--url", url, "flow", "list"], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(f"mp: {text}"), err


@pytest.mark.parametrize("url", ["htp:/bad", "127.0.0.1:99999"])
def test_the_real_mp_exits_2_on_a_bad_url(url: str, cli_env: dict[str, str]) -> None:
    done = subprocess.run([MP, "--url", url, "health"], env=cli_env, capture_output=True, text=True, timeout=60)
    line = one_line_error(done, 2)
    assert "edge URL" in line


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("10.0.0.5:8080", "http://10.0.0.5:8080"),
        ("localhost", "http://localhost"),
        ("[::1]:8080", "http://[::1]:8080"),
        ("https://edge.example:8443/", "https://edge.example:8443"),
        ("http://10.0.0.5:8080/prefix/", "http://10.0.0.5:8080/prefix"),
    ],
)
def test_good_edge_urls_still_normalise(given: str, expected: str) -> None:
    assert normalise_url(given) == expected


def test_the_edge_url_from_the_environment_is_checked_too(cli_env: dict[str, str]) -> None:
    done = subprocess.run(
        [MP, "flow", "list"],
        env={**cli_env, "MEDIAPLANE_URL": "127.0.0.1:70000"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "the port must be 1-65535" in one_line_error(done, 2)


@pytest.mark.parametrize(
    "url", ["rtp://0.0.0.0:70000", "rtp://0.0.0.0:99999", "udp://0.0.0.0:65536", "srt://:70000", "rtp://0.0.0.0:x"]
)
def test_an_input_port_out_of_range_says_1_65535(url: str) -> None:
    with pytest.raises(UsageError, match="the port must be 1-65535") as info:
        parse_input(url)
    assert info.value.exit_code == 2


def test_an_output_port_out_of_range_says_1_65535() -> None:
    with pytest.raises(UsageError, match="the port must be 1-65535"):
        parse_output("udp://239.1.1.1:70000", "out1")


@pytest.mark.parametrize("port", ["0", "70000"])
def test_mp_says_1_65535_for_port_0_and_for_70000(
    port: str, cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_server({}) as stub:
        code, out, err = run_mp(
            ["--url", stub.url, "flow", "create", "f1", "--name", "F", "--input", f"rtp://0.0.0.0:{port}"], capsys
        )
        assert stub.requests == []
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "the port must be 1-65535" in err and "0-65535" not in err


@pytest.mark.parametrize("text", ["1.2.3.4:0", "1.2.3.4:70000"])
def test_the_shared_model_says_1_65535_where_0_is_not_allowed(text: str) -> None:
    with pytest.raises(ValidationError, match="the port must be 1-65535"):
        TypeAdapter(SocketAddr).validate_python(text)


def test_the_shared_model_says_0_65535_where_0_is_allowed() -> None:
    assert TypeAdapter(BindAddr).validate_python("0.0.0.0:0") == "0.0.0.0:0"
    with pytest.raises(ValidationError, match="the port must be 0-65535"):
        TypeAdapter(BindAddr).validate_python("0.0.0.0:70000")


def test_completion_without_a_shell_is_one_line_and_exit_2(
    cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_mp(["completion"], capsys)
    assert (code, out) == (2, "")
    assert err == "mp: Missing argument 'SHELL'. Choose from: bash, zsh, fish (try: mp completion --help)\n"


def test_the_real_mp_completion_without_a_shell(cli_env: dict[str, str]) -> None:
    done = subprocess.run([MP, "completion"], env=cli_env, capture_output=True, text=True, timeout=60)
    one_line_error(done, 2)


def test_a_good_url_still_reaches_the_edge(cli_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    with stub_server({("GET", "/api/v1/flows"): ok({"flows": []})}) as stub:
        bare = stub.url.removeprefix("http://")
        assert run_mp(["--url", bare, "flow", "list", "-q"], capsys) == (0, "", "")
