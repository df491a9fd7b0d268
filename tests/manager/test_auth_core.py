"""The sans-IO auth core (services/manager/auth.py) and the runtime settings model."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from argon2 import PasswordHasher

from appliance import errors
from services.manager import auth
from services.manager.service import RuntimeSettings
from services.manager.store import Role

NOW = dt.datetime(2026, 11, 21, 15, 4, 5, tzinfo=dt.UTC)
SECRET = "ab" * 32


def test_argon2id_with_the_parameters_of_7_1() -> None:
    hashed = auth.hash_password("Good-passw0rd")
    assert hashed.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert PasswordHasher().verify(hashed, "Good-passw0rd")
    assert auth.verify_password(hashed, "Good-passw0rd")
    assert not auth.verify_password(hashed, "Bad-passw0rd")
    assert not auth.verify_password("not a hash", "Good-passw0rd")


@pytest.mark.parametrize(
    ("password", "ok"),
    [
        ("Aa345678", True),
        ("Aa34567", False),
        ("Aa3" + "x" * 125, True),
        ("Aa3" + "x" * 126, False),
        ("aa345678", False),
        ("AA345678", False),
        ("Aabcdefg", False),
    ],
)
def test_password_policy(password: str, ok: bool) -> None:
    assert (auth.password_problem(password) is None) is ok


@pytest.mark.parametrize(
    ("username", "ok"),
    [("a", True), ("A.b_c-9", True), ("x" * 64, True), ("x" * 65, False), ("", False), ("a b", False), ("é", False)],
)
def test_username_policy(username: str, ok: bool) -> None:
    assert (auth.username_problem(username) is None) is ok


def test_jwt_round_trip_and_refusals() -> None:
    user_id, session_id = uuid.uuid4(), uuid.uuid4()
    token = auth.encode_session_jwt(
        SECRET, user_id=user_id, role=Role.ADMIN, session_id=session_id, now=NOW, lifetime=dt.timedelta(hours=1)
    )
    claims = auth.decode_session_jwt(SECRET, token, NOW)
    assert (claims.user_id, claims.session_id, claims.role) == (user_id, session_id, "admin")
    with pytest.raises(errors.AuthRequired):
        auth.decode_session_jwt(SECRET, token, NOW + dt.timedelta(hours=1))
    with pytest.raises(errors.AuthRequired):
        auth.decode_session_jwt("cd" * 32, token, NOW)
    with pytest.raises(errors.AuthRequired):
        auth.decode_session_jwt(SECRET, "garbage", NOW)


@pytest.mark.parametrize(
    ("method", "header", "cookie", "allowed"),
    [
        ("GET", None, None, True),
        ("POST", None, None, False),
        ("POST", "", "t", False),
        ("PUT", "t", "t", True),
        ("DELETE", "t", "u", False),
        ("PATCH", "any", None, True),
    ],
)
def test_csrf(method: str, header: str | None, cookie: str | None, allowed: bool) -> None:
    if allowed:
        auth.check_csrf(method, header, cookie)
    else:
        with pytest.raises(errors.NotAllowed):
            auth.check_csrf(method, header, cookie)


def test_roles_compare_as_at_least() -> None:
    assert auth.has_role(Role.SUPER_ADMIN, Role.ADMIN)
    assert auth.has_role(Role.OPERATOR, Role.OPERATOR)
    assert not auth.has_role(Role.OPERATOR, Role.ADMIN)
    assert not auth.has_role(Role.VIEWER, Role.OPERATOR)


def test_runtime_settings_defaults_and_bad_stored_values() -> None:
    assert RuntimeSettings.from_stored({}) == RuntimeSettings(session_lifetime_hours=24, max_login_attempts=5)
    stored = {"max_login_attempts": 0, "session_lifetime_hours": 2, "events_retention_days": 9}
    assert RuntimeSettings.from_stored(stored) == RuntimeSettings(
        session_lifetime_hours=2, max_login_attempts=5, events_retention_days=9
    )
