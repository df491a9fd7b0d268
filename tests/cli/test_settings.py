"""The endpoint and credential resolver: flag, then env, then profile, then default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli.errors import UsageError
from cli.settings import DEFAULT_URL, Flags, config_dir, normalise_url, resolve

PROFILE = """
[default]
url = "http://profile-default:8080"
client_id = "prof-id"
client_secret = "prof-secret-0123456789"

[truck3]
url = "10.20.0.5:8080"
token = "prof-token"
timeout = 3

[bare]
"""


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    path = tmp_path / "mp" / "config.toml"
    path.parent.mkdir()
    path.write_text(PROFILE)
    return path


# (case, flags, env, use profile file?, expected (url, url_source, token, client_id, client_secret, cred source))
CASES = [
    ("nothing anywhere", Flags(), {}, False, (DEFAULT_URL, "default", None, None, None, None)),
    (
        "default profile",
        Flags(),
        {},
        True,
        ("http://profile-default:8080", "profile", None, "prof-id", "prof-secret-0123456789", "profile"),
    ),
    (
        "env beats profile",
        Flags(),
        {"MEDIAPLANE_URL": "http://env:1", "MEDIAPLANE_TOKEN": "env-token"},
        True,
        ("http://env:1", "env", "env-token", None, None, "env"),
    ),
    (
        "flag beats env",
        Flags(url="http://flag:2", token="flag-token"),
        {"MEDIAPLANE_URL": "http://env:1", "MEDIAPLANE_TOKEN": "env-token"},
        True,
        ("http://flag:2", "flag", "flag-token", None, None, "flag"),
    ),
    (
        "env client credentials beat a profile token",
        Flags(profile="truck3"),
        {"MEDIAPLANE_CLIENT_ID": "env-id", "MEDIAPLANE_CLIENT_SECRET": "env-secret"},
        True,
        ("http://10.20.0.5:8080", "profile", None, "env-id", "env-secret", "env"),
    ),
    (
        "a token beats client credentials at the same level",
        Flags(),
        {"MEDIAPLANE_TOKEN": "t", "MEDIAPLANE_CLIENT_ID": "i", "MEDIAPLANE_CLIENT_SECRET": "s"},
        False,
        (DEFAULT_URL, "default", "t", None, None, "env"),
    ),
    (
        "a flag client id beats an env token",
        Flags(client_id="flag-id"),
        {"MEDIAPLANE_TOKEN": "env-token"},
        False,
        (DEFAULT_URL, "default", None, "flag-id", None, "flag"),
    ),
    (
        "split credentials: id by flag, secret from env",
        Flags(client_id="flag-id"),
        {"MEDIAPLANE_CLIENT_SECRET": "env-secret"},
        False,
        (DEFAULT_URL, "default", None, "flag-id", "env-secret", "flag"),
    ),
    (
        "named profile by env",
        Flags(),
        {"MEDIAPLANE_PROFILE": "truck3"},
        True,
        ("http://10.20.0.5:8080", "profile", "prof-token", None, None, "profile"),
    ),
    (
        "named profile by flag beats env profile",
        Flags(profile="bare"),
        {"MEDIAPLANE_PROFILE": "truck3"},
        True,
        (DEFAULT_URL, "default", None, None, None, None),
    ),
    (
        "empty env values count as unset",
        Flags(),
        {"MEDIAPLANE_URL": "", "MEDIAPLANE_TOKEN": ""},
        True,
        ("http://profile-default:8080", "profile", None, "prof-id", "prof-secret-0123456789", "profile"),
    ),
    (
        "trailing slash and missing scheme",
        Flags(url="127.0.0.1:9000/"),
        {},
        False,
        ("http://127.0.0.1:9000", "flag", None, None, None, None),
    ),
]


@pytest.mark.parametrize(
    ("flags", "env", "with_profile", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_precedence(
    flags: Flags,
    env: dict[str, str],
    with_profile: bool,
    expected: tuple[object, ...],
    profile_path: Path,
    tmp_path: Path,
) -> None:
    path = profile_path if with_profile else tmp_path / "absent.toml"
    s = resolve(flags, env, profile_path=path)
    assert (s.url, s.url_source, s.token, s.client_id, s.client_secret, s.credential_source) == expected


def test_timeout_precedence(profile_path: Path) -> None:
    assert resolve(Flags(profile="truck3"), {}, profile_path=profile_path).timeout_s == 3
    assert resolve(Flags(profile="truck3"), {"MEDIAPLANE_TIMEOUT": "7"}, profile_path=profile_path).timeout_s == 7
    assert (
        resolve(
            Flags(profile="truck3", timeout_s=1.5), {"MEDIAPLANE_TIMEOUT": "7"}, profile_path=profile_path
        ).timeout_s
        == 1.5
    )
    assert resolve(Flags(), {}, profile_path=profile_path).timeout_s == 10


def test_the_profile_file_lives_under_xdg_config_home(tmp_path: Path) -> None:
    assert config_dir({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "mp"
    assert config_dir({"HOME": "/home/eng"}) == Path("/home/eng/.config/mp")
    (tmp_path / "mp").mkdir()
    (tmp_path / "mp" / "config.toml").write_text('[default]\nurl = "http://from-xdg:1"\n')
    assert resolve(Flags(), {"XDG_CONFIG_HOME": str(tmp_path)}).url == "http://from-xdg:1"


@pytest.mark.parametrize(
    ("flags", "env", "text", "message"),
    [
        (Flags(profile="nope"), {}, PROFILE, "profile 'nope' not found"),
        (Flags(profile="x"), {}, None, "does not exist"),
        (Flags(), {}, '[default]\nurll = "http://x:1"\n', "unknown key 'urll'"),
        (Flags(), {}, "[default\n", "cannot read"),
        (Flags(), {}, "[default]\nurl = 5\n", "url must be a string"),
        (Flags(url="ftp://x:1"), {}, None, "must start with http:// or https://"),
        (Flags(), {"MEDIAPLANE_TIMEOUT": "soon"}, None, "timeout must be a number"),
        (Flags(timeout_s=0), {}, None, "more than 0"),
    ],
)
def test_bad_settings_are_usage_errors(
    flags: Flags, env: dict[str, str], text: str | None, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "config.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UsageError, match=message) as info:
        resolve(flags, env, profile_path=path)
    assert info.value.exit_code == 2


def test_settings_repr_hides_secrets(profile_path: Path) -> None:
    s = resolve(
        Flags(token="very-secret-token"), {"MEDIAPLANE_CLIENT_SECRET": "shh-0123456789"}, profile_path=profile_path
    )
    assert "very-secret-token" not in repr(s)
    assert "shh" not in repr(s)


@pytest.mark.parametrize(
    ("given", "expected"),
    [("http://h:1", "http://h:1"), ("HTTPS://h:1/", "https://h:1"), ("h:8080", "http://h:8080"), (" h ", "http://h")],
)
def test_normalise_url(given: str, expected: str) -> None:
    assert normalise_url(given) == expected


def test_resolver_reads_the_real_environment_only_through_its_argument(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEDIAPLANE_URL", "http://leak:1")
    assert resolve(Flags(), {}, profile_path=tmp_path / "none.toml").url == DEFAULT_URL
    assert os.environ["MEDIAPLANE_URL"] == "http://leak:1"
