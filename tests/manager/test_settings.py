"""The manager's start-up settings (interop.md 1.3): required env, TLS mode precedence, flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.manager.settings import (
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    JWT_SECRET_ENV,
    MASTER_KEY_ENV,
    TLS_MODE_ENV,
    StartupError,
    TlsMode,
    resolve_settings,
)

JWT = "ab" * 32
MASTER = "CD" * 32  # upper case is hex too
GOOD = {JWT_SECRET_ENV: JWT, MASTER_KEY_ENV: MASTER}


def test_defaults() -> None:
    settings = resolve_settings(GOOD)
    assert settings.data_dir == DEFAULT_DATA_DIR == Path("/var/lib/mediaplane/manager")
    assert (settings.listen_addr, settings.port) == ("0.0.0.0", DEFAULT_PORT) == ("0.0.0.0", 8443)
    assert settings.tls_mode is TlsMode.DIRECT
    assert settings.tls_dir == DEFAULT_DATA_DIR / "tls"
    assert settings.database_url is None
    assert settings.jwt_secret.get_secret_value() == JWT
    assert settings.master_key.get_secret_value() == MASTER  # used as given: 7.7 hashes the text


def test_the_secrets_never_show_in_a_repr() -> None:
    settings = resolve_settings(GOOD, database_url="postgresql+psycopg://mgr:pw-SECRET@db/mgr")
    text = repr(settings) + str(settings)
    assert JWT not in text and MASTER not in text and "pw-SECRET" not in text


# (environment, --tls-mode) -> resolved mode; the flag wins and the variable is then not read.
TLS_MODE_CASES = [
    ({}, None, TlsMode.DIRECT),
    ({TLS_MODE_ENV: ""}, None, TlsMode.DIRECT),
    ({TLS_MODE_ENV: "direct"}, None, TlsMode.DIRECT),
    ({TLS_MODE_ENV: "behind_proxy"}, None, TlsMode.BEHIND_PROXY),
    ({TLS_MODE_ENV: "behind_proxy"}, TlsMode.DIRECT, TlsMode.DIRECT),
    ({TLS_MODE_ENV: "direct"}, TlsMode.BEHIND_PROXY, TlsMode.BEHIND_PROXY),
    ({TLS_MODE_ENV: "bogus"}, TlsMode.BEHIND_PROXY, TlsMode.BEHIND_PROXY),
    ({}, TlsMode.BEHIND_PROXY, TlsMode.BEHIND_PROXY),
]


@pytest.mark.parametrize(("env", "flag", "expected"), TLS_MODE_CASES)
def test_tls_mode_precedence(env: dict[str, str], flag: TlsMode | None, expected: TlsMode) -> None:
    assert resolve_settings({**GOOD, **env}, tls_mode=flag).tls_mode is expected


@pytest.mark.parametrize("value", ["bogus", "DIRECT", "behind-proxy", " direct"])
def test_a_bad_tls_mode_variable_is_exit_2(value: str) -> None:
    with pytest.raises(StartupError) as caught:
        resolve_settings({**GOOD, TLS_MODE_ENV: value})
    assert caught.value.exit_code == 2
    assert caught.value.message == "MEDIAPLANE_TLS_MODE must be 'direct' or 'behind_proxy'"


@pytest.mark.parametrize("name", [JWT_SECRET_ENV, MASTER_KEY_ENV])
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "is not set"),
        ("", "is malformed"),
        ("a" * 63, "is malformed"),
        ("a" * 65, "is malformed"),
        ("g" * 64, "is malformed"),
        ("a" * 63 + "\n", "is malformed"),
        (" " + "a" * 64, "is malformed"),
        ("é" * 64, "is malformed"),
    ],
)
def test_a_missing_or_malformed_secret_names_the_variable_only(name: str, value: str | None, expected: str) -> None:
    env = dict(GOOD)
    if value is None:
        del env[name]
    else:
        env[name] = value
    with pytest.raises(StartupError) as caught:
        resolve_settings(env)
    message = caught.value.message
    assert caught.value.exit_code == 2
    assert message == f"{name} {expected}: it must hold exactly 64 hex characters"
    for secret in (value, JWT, MASTER):
        if secret and secret.strip():
            assert secret.strip() not in message


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "::", "::1", "fd00::2"])
def test_listen_addresses(address: str) -> None:
    assert resolve_settings(GOOD, listen_addr=address).listen_addr == address


@pytest.mark.parametrize(
    ("kwargs", "flag"), [({"listen_addr": "localhost"}, "--listen-addr"), ({"port": -1}, "--port")]
)
def test_bad_flags_are_exit_2(kwargs: dict[str, object], flag: str) -> None:
    with pytest.raises(StartupError) as caught:
        resolve_settings(GOOD, **kwargs)  # type: ignore[arg-type]
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith(flag)
