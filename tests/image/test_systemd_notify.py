"""appliance.systemd against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance import systemd


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    try:
        yield sock, {"NOTIFY_SOCKET": str(path)}
    finally:
        sock.close()


def test_ready_reaches_the_socket(notify_socket: tuple[socket.socket, dict[str, str]]) -> None:
    sock, env = notify_socket
    assert systemd.notify_ready(env=env) is True
    assert sock.recv(4096) == b"READY=1"


def test_ready_with_status_is_one_datagram(notify_socket: tuple[socket.socket, dict[str, str]]) -> None:
    sock, env = notify_socket
    assert systemd.notify_ready("listening on :8080", env=env)
    assert sock.recv(4096) == b"READY=1\nSTATUS=listening on :8080"


def test_watchdog_and_stopping(notify_socket: tuple[socket.socket, dict[str, str]]) -> None:
    sock, env = notify_socket
    assert systemd.notify_watchdog(env=env)
    assert systemd.notify_stopping(env=env)
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert sock.recv(4096) == b"STOPPING=1"


def test_status_newlines_cannot_inject_assignments(notify_socket: tuple[socket.socket, dict[str, str]]) -> None:
    sock, env = notify_socket
    assert systemd.notify_status("2 flows\nREADY=1", env=env)
    assert sock.recv(4096) == b"STATUS=2 flows READY=1"


def test_notify_reads_the_process_environment(
    notify_socket: tuple[socket.socket, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, env = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", env["NOTIFY_SOCKET"])
    assert systemd.notify("READY=1")
    assert sock.recv(4096) == b"READY=1"


def test_abstract_namespace_socket() -> None:
    name = f"mediaplane-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        assert systemd.notify("WATCHDOG=1", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"WATCHDOG=1"


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "relative/path"}])
def test_no_socket_is_a_noop(env: dict[str, str]) -> None:
    assert systemd.notify("READY=1", env=env) is False


def test_send_failure_is_swallowed(tmp_path: Path) -> None:
    # systemd gone (socket file removed): the service must keep running.
    assert systemd.notify("WATCHDOG=1", env={"NOTIFY_SOCKET": str(tmp_path / "missing.sock")}) is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert systemd.watchdog_interval(env=env) == expected
