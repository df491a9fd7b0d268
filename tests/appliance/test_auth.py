"""Auth core (interop.md 4) with a fixed clock: tokens, verification, roles, rate limit."""

from __future__ import annotations

import base64

import jwt
import pytest

from appliance import auth, errors
from appliance.models.config import ServerAuth

SECRET = "s" * 40
SETTINGS = ServerAuth.model_validate(
    {
        "enabled": True,
        "jwt_secret": SECRET,
        "token_lifetime_secs": 600,
        "clients": [
            {"client_id": "ops", "client_secret": "ops-secret-0123456789", "role": "admin"},
            {"client_id": "noc", "client_secret": "noc-secret-0123456789", "role": "monitor"},
        ],
    }
)
NOW = 1_800_000_000


def request(client_id: str = "ops", secret: str = "ops-secret-0123456789") -> auth.TokenRequest:
    return auth.TokenRequest("client_credentials", client_id, secret)


def test_issue_and_verify() -> None:
    answer = auth.issue_token(SETTINGS, request(), NOW)
    assert answer["expires_in"] == 600 and answer["role"] == "admin" and answer["token_type"] == "bearer"
    principal = auth.verify_token(SETTINGS, str(answer["access_token"]), NOW + 599)
    assert principal == auth.Principal("ops", "admin")


def test_expiry_has_no_leeway() -> None:
    token = str(auth.issue_token(SETTINGS, request(), NOW)["access_token"])
    with pytest.raises(errors.AuthRequired, match="expired"):
        auth.verify_token(SETTINGS, token, NOW + 600)


def test_wrong_secret_and_unknown_client_answer_alike() -> None:
    for bad in (request(secret="x" * 20), request(client_id="ghost")):
        with pytest.raises(errors.InvalidInput, match="invalid client credentials"):
            auth.issue_token(SETTINGS, bad, NOW)


def test_auth_off_refuses_tokens() -> None:
    with pytest.raises(errors.InvalidInput, match="not enabled"):
        auth.issue_token(ServerAuth(), request(), NOW)


def test_only_hs256_is_accepted() -> None:
    token = jwt.encode(
        {"sub": "ops", "role": "admin", "iat": NOW, "exp": NOW + 60, "iss": "mediaplane-edge"},
        SECRET * 2,
        algorithm="HS512",
    )
    with pytest.raises(errors.AuthRequired):
        auth.verify_token(SETTINGS, token, NOW)


def test_role_check() -> None:
    auth.require_role(auth.Principal("noc", "monitor"), "any")
    with pytest.raises(errors.NotAllowed, match="admin role required"):
        auth.require_role(auth.Principal("noc", "monitor"), "admin")


@pytest.mark.parametrize(
    ("content_type", "body", "header", "expected"),
    [
        (
            "application/json",
            b'{"grant_type":"client_credentials","client_id":"a","client_secret":"b"}',
            None,
            ("a", "b"),
        ),
        (
            "application/x-www-form-urlencoded; charset=utf-8",
            b"grant_type=client_credentials&client_id=a&client_secret=b",
            None,
            ("a", "b"),
        ),
        (
            "application/x-www-form-urlencoded",
            b"grant_type=client_credentials",
            "Basic " + base64.b64encode(b"a:b").decode(),
            ("a", "b"),
        ),
    ],
)
def test_parse_token_request(content_type: str, body: bytes, header: str | None, expected: tuple[str, str]) -> None:
    parsed = auth.parse_token_request(content_type, body, header)
    assert (parsed.client_id, parsed.client_secret) == expected


def test_rate_limit_per_ip_with_loopback_exempt() -> None:
    limiter = auth.TokenRateLimiter()
    for i in range(3):
        limiter.check("192.0.2.1", 3, 100.0 + i)
    with pytest.raises(errors.RateLimited):
        limiter.check("192.0.2.1", 3, 103.0)
    limiter.check("192.0.2.2", 3, 103.0)  # another client is not affected
    limiter.check("192.0.2.1", 3, 161.0)  # the minute has passed
    for _ in range(10):
        limiter.check("127.0.0.1", 3, 200.0)  # loopback is exempt
        limiter.check("192.0.2.9", 0, 200.0)  # 0 turns the limit off
