"""``/api/v1/settings`` and the TLS routes against a real ``mp-manager serve`` (interop.md 7.4, 7.5, 13)."""

from __future__ import annotations

import contextlib
import hashlib
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.helpers.manager import Manager, login, start_manager
from tests.manager.certs import ca_signed_pair, key_pem
from tests.manager.test_auth import prepared_data_dir, set_cookie_headers

pytestmark = pytest.mark.e2e

DEFAULTS = {
    "events_retention_days": 30,
    "ws_keepalive_interval_secs": 15,
    "session_lifetime_hours": 24,
    "max_login_attempts": 5,
    "node_offline_threshold_secs": 30,
    "stats_broadcast_interval_ms": 1000,
}
PASSWORD = "Settings-passw0rd"
ROLES = ("viewer", "operator", "admin")
TLS_KEYS = {"subject", "issuer", "self_signed", "not_before", "not_after", "fingerprint_sha256"}


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Manager]:
    started = start_manager(prepared_data_dir(tmp_path_factory.mktemp("settings")))
    try:
        with started.client() as root:
            login(root)
            for role in ROLES:
                body = {"username": f"the-{role}", "password": PASSWORD, "role": role}
                assert root.post("/api/v1/users", json=body).status_code == 201
        yield started
    finally:
        started.stop()


@contextlib.contextmanager
def as_role(manager: Manager, role: str = "super_admin") -> Iterator[httpx.Client]:
    with manager.client() as c:
        r = login(c) if role == "super_admin" else login(c, f"the-{role}", PASSWORD)
        assert r.status_code == 200, r.text
        yield c


@pytest.fixture
def root(manager: Manager) -> Iterator[httpx.Client]:
    with as_role(manager) as c:
        yield c


def test_get_fills_every_default(root: httpx.Client) -> None:
    r = root.get("/api/v1/settings")
    assert r.status_code == 200
    # prepared_data_dir stored max_login_attempts = 100; every other key is its default.
    assert r.json() == {**DEFAULTS, "max_login_attempts": 100}


def test_put_changes_the_keys_sent_and_answers_the_full_object(root: httpx.Client) -> None:
    r = root.put(
        "/api/v1/settings", json={"settings": {"events_retention_days": 7, "stats_broadcast_interval_ms": 100}}
    )
    assert r.status_code == 200
    expected = {**DEFAULTS, "max_login_attempts": 100, "events_retention_days": 7, "stats_broadcast_interval_ms": 100}
    assert r.json() == expected
    assert root.get("/api/v1/settings").json() == expected
    assert root.put("/api/v1/settings", json={"settings": {}}).json() == expected
    r = root.put(
        "/api/v1/settings", json={"settings": {"events_retention_days": 30, "stats_broadcast_interval_ms": 1000}}
    )
    assert r.json() == {**DEFAULTS, "max_login_attempts": 100}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"no_such_key": 1}, "no_such_key"),
        ({"events_retention_days": None}, "events_retention_days"),
        ({"events_retention_days": 366}, "events_retention_days"),
        ({"events_retention_days": 0}, "events_retention_days"),
        ({"ws_keepalive_interval_secs": 301}, "ws_keepalive_interval_secs"),
        ({"session_lifetime_hours": 721}, "session_lifetime_hours"),
        ({"max_login_attempts": 101}, "max_login_attempts"),
        ({"node_offline_threshold_secs": 4}, "node_offline_threshold_secs"),
        ({"stats_broadcast_interval_ms": 60001}, "stats_broadcast_interval_ms"),
        ({"max_login_attempts": "7"}, "max_login_attempts"),
        ({"max_login_attempts": True}, "max_login_attempts"),
        ({"max_login_attempts": 7.5}, "max_login_attempts"),
    ],
)
def test_a_bad_key_is_400_naming_it_and_nothing_is_written(
    root: httpx.Client, settings: dict[str, object], named: str
) -> None:
    # A valid key sent beside the bad one is not written either: every key is checked first.
    r = root.put("/api/v1/settings", json={"settings": {"events_retention_days": 9, **settings}})
    assert r.status_code == 400
    error = r.json()["error"]
    assert named in error
    for value in settings.values():
        if isinstance(value, int | float) and not isinstance(value, bool):
            assert str(value) not in error
    assert root.get("/api/v1/settings").json()["events_retention_days"] == 30


@pytest.mark.parametrize("body", [{}, {"settings": None}, {"settings": []}, {"settings": {}, "extra": 1}])
def test_a_bad_body_is_400(root: httpx.Client, body: dict[str, object]) -> None:
    assert root.put("/api/v1/settings", json=body).status_code == 400


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("operator", 403), ("admin", 200)])
def test_settings_and_tls_need_admin(manager: Manager, role: str, status: int) -> None:
    with as_role(manager, role) as c:
        assert c.get("/api/v1/settings").status_code == status
        assert c.put("/api/v1/settings", json={"settings": {}}).status_code == status
        assert c.get("/api/v1/settings/tls").status_code == status
        if status == 403:
            # 403 before 400: the body is not even valid.
            assert c.put("/api/v1/settings", json={"settings": {"nope": None}}).status_code == 403
            r = c.post("/api/v1/settings/tls/upload", json={"cert_pem": "x", "key_pem": "y"})
            assert r.status_code == 403
    with manager.client() as anonymous:
        assert anonymous.get("/api/v1/settings").status_code == 401
        assert anonymous.get("/api/v1/settings/tls").status_code == 401


def test_settings_are_live(manager: Manager, root: httpx.Client) -> None:
    # session_lifetime_hours: the next login's cookie and JWT.
    assert root.put("/api/v1/settings", json={"settings": {"session_lifetime_hours": 2}}).status_code == 200
    with manager.client() as c:
        cookies = set_cookie_headers(login(c))
        assert "Max-Age=7200" in cookies["session"]
    # max_login_attempts lowered to 1: the next login from this IP (which logged in just now) is 429.
    assert root.put("/api/v1/settings", json={"settings": {"max_login_attempts": 1}}).status_code == 200
    with manager.client() as c:
        assert login(c).status_code == 429
    # Raised again with the session still open: logins work at once.
    r = root.put("/api/v1/settings", json={"settings": {"max_login_attempts": 100, "session_lifetime_hours": 24}})
    assert r.status_code == 200
    with manager.client() as c:
        assert login(c).status_code == 200


def test_tls_describes_the_served_self_signed_certificate(manager: Manager, root: httpx.Client) -> None:
    r = root.get("/api/v1/settings/tls")
    assert r.status_code == 200
    info = r.json()
    assert set(info) == TLS_KEYS
    certificate = x509.load_pem_x509_certificate(manager.cert_path.read_bytes())
    digest = hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest().upper()
    assert info["fingerprint_sha256"] == ":".join(digest[i : i + 2] for i in range(0, 64, 2))
    assert info["self_signed"] is True
    assert info["subject"] == info["issuer"] and info["subject"].startswith("CN=")
    assert info["not_before"].endswith("Z") and info["not_after"] > info["not_before"]


def test_upload_refuses_what_it_cannot_serve(manager: Manager, root: httpx.Client) -> None:
    _, cert, key = ca_signed_pair(hostname="localhost", ip="127.0.0.1")
    other_key = key_pem(ec.generate_private_key(ec.SECP256R1()))
    before = (manager.cert_path.read_bytes(), manager.key_path.read_bytes())
    cases: list[tuple[dict[str, object], int]] = [
        ({"cert_pem": "not a pem", "key_pem": key.decode()}, 400),
        ({"cert_pem": cert.decode(), "key_pem": "not a pem"}, 400),
        ({"cert_pem": cert.decode(), "key_pem": other_key.decode()}, 400),
        ({"cert_pem": cert.decode()}, 400),
        ({"cert_pem": cert.decode(), "key_pem": 5}, 400),
        ({"cert_pem": cert.decode() + " " * 64 * 1024, "key_pem": key.decode()}, 413),
    ]
    for body, status in cases:
        r = root.post("/api/v1/settings/tls/upload", json=body)
        assert r.status_code == status, (body.keys(), r.text)
        assert r.json()["success"] is False and r.json()["error"]
        assert "PRIVATE KEY" not in r.text and "BEGIN" not in r.text
    assert (manager.cert_path.read_bytes(), manager.key_path.read_bytes()) == before


def test_an_uploaded_pair_is_served_after_a_restart(tmp_path: Path) -> None:
    data_dir = prepared_data_dir(tmp_path)
    ca, cert, key = ca_signed_pair(hostname="localhost", ip="127.0.0.1")
    manager = start_manager(data_dir)
    try:
        with manager.client() as root:
            login(root)
            r = root.post("/api/v1/settings/tls/upload", json={"cert_pem": cert.decode(), "key_pem": key.decode()})
            assert r.status_code == 200
            assert r.json()["success"] is True and "restart" in r.json()["message"]
            # Until the restart, the old certificate is served and described.
            assert root.get("/api/v1/settings/tls").json()["self_signed"] is True
    finally:
        manager.stop()
    assert manager.cert_path.read_bytes() == cert and manager.key_path.read_bytes() == key
    assert stat.S_IMODE(manager.key_path.stat().st_mode) == 0o600
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(ca)
    restarted = start_manager(data_dir, ca_path=ca_path)  # the client now trusts only the test CA
    try:
        with restarted.client() as client:
            assert client.get("/health").json()["self_signed_cert"] is False
            login(client)
            info = client.get("/api/v1/settings/tls").json()
            assert info["self_signed"] is False
            assert info["subject"] == "CN=localhost" and info["issuer"] == "CN=Test CA"
    finally:
        restarted.stop()
    assert key.decode() not in manager.log()
