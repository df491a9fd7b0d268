"""``mp-manager serve`` end to end: the real console script, real HTTPS on loopback.

Covers interop.md 1.3 (flags, env, files, /health, headers), 13 (HSTS in direct mode only,
SIGTERM within 5 s, ``--version`` == /health's version) and the rule that no secret reaches
a log or an error text.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import ssl
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from tests.helpers.manager import (
    JWT_SECRET,
    MASTER_KEY,
    Manager,
    manager_env,
    run_manager_cli,
    running_manager,
    start_manager,
    tls_context,
)
from tests.manager.certs import ca_signed_pair

pytestmark = pytest.mark.e2e

SECURITY_HEADERS = {"x-content-type-options": "nosniff", "x-frame-options": "DENY"}
HSTS = ("strict-transport-security", "max-age=31536000")


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    with running_manager(tmp_path_factory.mktemp("serve"), extra_args=["--log-level", "debug"]) as manager:
        yield manager


@pytest.fixture
def client(manager: Manager) -> Iterator[httpx.Client]:
    with manager.client() as client:
        yield client


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --------------------------------------------------------------------------- direct mode


def test_health_answers_over_tls_trusting_the_generated_certificate(manager: Manager, client: httpx.Client) -> None:
    assert manager.scheme == "https"
    r = client.get("/health")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "status": "ok",
        "service": "mediaplane-manager",
        "version": r.json()["version"],
        "self_signed_cert": True,
    }
    assert isinstance(r.json()["version"], str) and r.json()["version"]


def test_plain_http_is_not_served_in_direct_mode(manager: Manager) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{manager.port}/health", timeout=5)


def test_an_untrusting_client_refuses_the_self_signed_certificate(manager: Manager) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(manager.url + "/health", timeout=5)  # the system CAs only


@pytest.mark.parametrize("path", ["/health", "/api/v1/no-such-route", "/health?x=1"])
def test_every_answer_carries_the_security_headers_and_hsts(client: httpx.Client, path: str) -> None:
    r = client.get(path)
    for name, value in {**SECURITY_HEADERS, HSTS[0]: HSTS[1]}.items():
        assert r.headers.get_list(name) == [value], (path, name)


def test_an_unknown_route_is_404_with_a_bare_error_body(client: httpx.Client) -> None:
    r = client.get("/api/v1/no-such-route")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert list(body) == ["error"]
    assert "/api/v1/no-such-route" in body["error"]


def test_a_wrong_method_is_405_with_a_bare_error_body(client: httpx.Client) -> None:
    r = client.post("/health", json={})
    assert r.status_code == 405
    assert list(r.json()) == ["error"]
    assert r.headers["x-frame-options"] == "DENY"


def test_the_generated_certificate_names_this_host(manager: Manager) -> None:
    certificate = x509.load_pem_x509_certificate(manager.cert_path.read_bytes())
    hostname = socket.gethostname().lower()
    cn = certificate.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    assert [attribute.value for attribute in cn] == [hostname[:64]]
    assert certificate.issuer == certificate.subject
    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName)[:2] == [hostname, "localhost"]
    ips = set(sans.get_values_for_type(x509.IPAddress))
    assert {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")} <= ips
    assert host_addresses() <= ips


def host_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """This host's non-link-scope addresses as iproute2 reports them (an independent source)."""
    if shutil.which("ip") is None:
        return set()
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout
    found = set()
    for link in json.loads(out):
        for info in link.get("addr_info", []):
            if info.get("scope") != "link":
                found.add(ipaddress.ip_address(info["local"]))
    assert found, "iproute2 listed no address at all"
    return found


def test_the_files_are_private(manager: Manager) -> None:
    assert mode(manager.data_dir) == 0o700
    assert mode(manager.data_dir / "tls") == 0o700
    assert mode(manager.key_path) == 0o600
    assert b"PRIVATE KEY" in manager.key_path.read_bytes()


def test_version_flag_prints_the_version_health_reports(client: httpx.Client) -> None:
    result = run_manager_cli(["--version"], env=manager_env(MEDIAPLANE_JWT_SECRET=None, MEDIAPLANE_MASTER_KEY=None))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"mp-manager {client.get('/health').json()['version']}\n"


def test_the_log_names_the_url_and_never_a_secret(manager: Manager, client: httpx.Client) -> None:
    client.get("/health")
    client.get("/api/v1/no-such-route", headers={"Authorization": f"Bearer {JWT_SECRET}"})
    log = manager.log()
    assert f"listening on https://127.0.0.1:{manager.port}" in log
    assert "GET /health 200" in log  # --log-level debug: the access log is on, so it was written
    for secret in (JWT_SECRET, MASTER_KEY, JWT_SECRET.lower(), MASTER_KEY.upper()):
        assert secret not in log


# --------------------------------------------------------------------------- restarts and modes


def test_a_second_start_reuses_the_pair(tmp_path: Path) -> None:
    with running_manager(tmp_path) as first:
        cert, key = first.cert_path.read_bytes(), first.key_path.read_bytes()
        assert "generated a self-signed certificate" in first.log()
    with running_manager(tmp_path) as second, second.client() as client:
        assert client.get("/health").json()["self_signed_cert"] is True
        assert second.cert_path.read_bytes() == cert
        assert second.key_path.read_bytes() == key
        assert "generated a self-signed certificate" not in second.run_log()
        assert "serving the self-signed certificate" in second.run_log()


def test_an_operator_pair_signed_by_a_ca_is_served_and_not_self_signed(tmp_path: Path) -> None:
    tls_dir = tmp_path / "manager" / "tls"
    tls_dir.mkdir(parents=True)
    ca_pem, cert_pem, key_pem = ca_signed_pair(hostname="manager.test", ip="127.0.0.1")
    (tls_dir / "cert.pem").write_bytes(cert_pem)
    (tls_dir / "key.pem").write_bytes(key_pem)
    (tmp_path / "ca.pem").write_bytes(ca_pem)
    with running_manager(tmp_path, ca_path=tmp_path / "ca.pem") as manager, manager.client() as client:
        assert client.get("/health").json()["self_signed_cert"] is False
        assert "generated a self-signed certificate" not in manager.log()
    assert (tls_dir / "cert.pem").read_bytes() == cert_pem


@pytest.mark.parametrize(
    ("env_mode", "flag"),
    [("behind_proxy", None), ("direct", "behind_proxy"), ("not-a-mode", "behind_proxy")],
    ids=["env", "flag-beats-env", "flag-ignores-a-bad-env"],
)
def test_behind_proxy_serves_plain_http_without_hsts(tmp_path: Path, env_mode: str, flag: str | None) -> None:
    env = manager_env(MEDIAPLANE_TLS_MODE=env_mode)
    args = ["--tls-mode", flag] if flag else []
    with running_manager(tmp_path, env=env, extra_args=args) as manager, manager.client() as client:
        assert manager.scheme == "http"
        r = client.get("/health")
        assert r.json() == {
            "status": "ok",
            "service": "mediaplane-manager",
            "version": r.json()["version"],
            "self_signed_cert": False,
        }
        for path in ("/health", "/nope"):
            r = client.get(path)
            assert HSTS[0] not in r.headers
            for name, value in SECURITY_HEADERS.items():
                assert r.headers[name] == value
        assert not (manager.data_dir / "tls").exists()
        assert mode(manager.data_dir) == 0o700


def test_the_tls_mode_flag_beats_the_environment_for_direct_too(tmp_path: Path) -> None:
    env = manager_env(MEDIAPLANE_TLS_MODE="behind_proxy")
    with running_manager(tmp_path, env=env, extra_args=["--tls-mode", "direct"]) as manager:
        assert manager.scheme == "https"
        with manager.client() as client:
            assert client.get("/health").headers["strict-transport-security"] == HSTS[1]


# --------------------------------------------------------------------------- start-up failures

MALFORMED = "feedface" * 7 + "f00dfee"  # 63 hex characters
MALFORMED_LONG = "feedface" * 8 + "0"  # 65
NOT_HEX = "feedface" * 7 + "feedfacg"


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("MEDIAPLANE_JWT_SECRET", None, "is not set"),
        ("MEDIAPLANE_JWT_SECRET", "", "is malformed"),
        ("MEDIAPLANE_JWT_SECRET", MALFORMED, "is malformed"),
        ("MEDIAPLANE_JWT_SECRET", MALFORMED_LONG, "is malformed"),
        ("MEDIAPLANE_JWT_SECRET", " " + JWT_SECRET, "is malformed"),
        ("MEDIAPLANE_MASTER_KEY", None, "is not set"),
        ("MEDIAPLANE_MASTER_KEY", NOT_HEX, "is malformed"),
        ("MEDIAPLANE_MASTER_KEY", MALFORMED, "is malformed"),
        ("MEDIAPLANE_TLS_MODE", "https", "must be 'direct' or 'behind_proxy'"),
    ],
)
def test_a_missing_or_malformed_variable_exits_2_naming_it_but_not_its_value(
    tmp_path: Path, variable: str, value: str | None, reason: str
) -> None:
    data_dir = tmp_path / "manager"
    result = run_manager_cli(["serve", "--data-dir", str(data_dir)], env=manager_env(**{variable: value}))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"mp-manager: {variable} {reason}")
    for secret in (value, JWT_SECRET, MASTER_KEY):
        if secret and secret.strip():
            assert secret.strip() not in result.stderr
    assert not data_dir.exists()  # the environment is checked before anything is created


def test_the_jwt_secret_is_checked_before_the_master_key(tmp_path: Path) -> None:
    env = manager_env(MEDIAPLANE_JWT_SECRET=None, MEDIAPLANE_MASTER_KEY=None)
    result = run_manager_cli(["serve", "--data-dir", str(tmp_path / "m")], env=env)
    assert result.returncode == 2
    assert "MEDIAPLANE_JWT_SECRET" in result.stderr and "MEDIAPLANE_MASTER_KEY" not in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--tls-mode", "https"], "--tls-mode"),
        (["--port", "65536"], "--port"),
        (["--listen-addr", "manager.example"], "--listen-addr"),
    ],
)
def test_a_bad_flag_exits_2(tmp_path: Path, args: list[str], words: str) -> None:
    result = run_manager_cli(["serve", "--data-dir", str(tmp_path / "m"), *args])
    assert result.returncode == 2, result.stderr
    assert words in result.stderr


def test_a_cert_without_its_key_exits_2_naming_the_files(tmp_path: Path) -> None:
    tls_dir = tmp_path / "manager" / "tls"
    with running_manager(tmp_path):
        pass
    (tls_dir / "key.pem").unlink()
    result = run_manager_cli(["serve", "--data-dir", str(tmp_path / "manager"), "--listen-addr", "127.0.0.1"])
    assert result.returncode == 2, result.stderr
    assert str(tls_dir / "key.pem") in result.stderr
    assert not (tls_dir / "key.pem").exists()  # nothing was generated over the operator's cert


def test_a_port_in_use_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        manager = start_manager(tmp_path / "manager", port=port, wait=False)
        assert manager.process.wait(30) == 1, manager.log()
    assert f"mp-manager: cannot listen on 127.0.0.1:{port}" in manager.log()


# --------------------------------------------------------------------------- stopping


def test_sigterm_closes_listener_and_connections_and_exits_within_5s(tmp_path: Path) -> None:
    manager = start_manager(tmp_path / "manager")
    try:
        context = tls_context(manager.cert_path)
        # An idle keep-alive connection after one request...
        keep_alive = context.wrap_socket(
            socket.create_connection(("127.0.0.1", manager.port), timeout=10), server_hostname="127.0.0.1"
        )
        keep_alive.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert keep_alive.recv(65536).startswith(b"HTTP/1.1 200")
        # ...and a connection that never even started its TLS handshake.
        silent = socket.create_connection(("127.0.0.1", manager.port), timeout=10)
        started = time.monotonic()
        manager.process.send_signal(15)
        returncode = manager.process.wait(10)
        elapsed = time.monotonic() - started
        assert returncode == 0, manager.log()
        assert elapsed < 5.0, elapsed
        assert closed(keep_alive) and closed(silent)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", manager.port), timeout=5).close()
        assert "SIGTERM received: stopping" in manager.log()
        keep_alive.close()
        silent.close()
    finally:
        manager.stop(timeout=5)


def closed(sock: socket.socket) -> bool:
    """Whether the peer has closed ``sock`` (EOF or a reset once unread bytes are drained), within 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if sock.recv(65536) == b"":
                return True
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False
