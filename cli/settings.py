"""Where `mp` finds its endpoint and credentials: one resolver, one precedence.

Each setting comes from the first of: the command-line flag, the environment
(`MEDIAPLANE_URL`, `MEDIAPLANE_TOKEN`, `MEDIAPLANE_CLIENT_ID`,
`MEDIAPLANE_CLIENT_SECRET`, `MEDIAPLANE_TIMEOUT`, `MEDIAPLANE_PROFILE`), the
profile file `${XDG_CONFIG_HOME:-~/.config}/mp/config.toml`, then the default
(`http://127.0.0.1:8080`, no credentials, 10 s). An empty environment variable
counts as unset.

Credentials are chosen as a unit, so a lower level never mixes into a higher
one: the highest level that names a token or a client id wins, and within one
level a token beats client credentials. With neither, the token cached by
`mp auth login` for that URL is used, if any (see `cli.auth`).

Interop: shared/docs/interop.md section 1.4.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from cli.errors import UsageError

DEFAULT_URL: Final = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_S: Final = 10.0
PROFILE_KEYS: Final = frozenset({"url", "token", "client_id", "client_secret", "timeout"})

# The levels, highest first. A credential's level decides which source wins.
_LEVELS: Final = ("flag", "env", "profile")
_ENV: Final = {
    "url": "MEDIAPLANE_URL",
    "token": "MEDIAPLANE_TOKEN",
    "client_id": "MEDIAPLANE_CLIENT_ID",
    "client_secret": "MEDIAPLANE_CLIENT_SECRET",
    "timeout": "MEDIAPLANE_TIMEOUT",
}


@dataclass(frozen=True, slots=True)
class Flags:
    """The global options as typed on the command line (None when not given)."""

    url: str | None = None
    token: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    profile: str | None = None
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """The resolved endpoint and credentials of one `mp` run."""

    url: str
    timeout_s: float
    token: str | None
    client_id: str | None
    client_secret: str | None
    config_dir: Path
    profile: str | None
    url_source: str
    """Which level gave the URL: flag, env, profile or default."""
    credential_source: str | None
    """Which level gave the credentials: flag, env, profile, or None (cache or no auth)."""

    def __repr__(self) -> str:  # never show a secret in a traceback or a log line
        return f"Settings(url={self.url!r}, profile={self.profile!r}, credentials={self.credential_source!r})"


def config_dir(env: Mapping[str, str]) -> Path:
    """`${XDG_CONFIG_HOME:-~/.config}/mp`."""
    base = env.get("XDG_CONFIG_HOME") or ""
    if not base:
        home = env.get("HOME") or str(Path.home())
        base = os.path.join(home, ".config")
    return Path(base) / "mp"


# `word:` not followed by a digit: a scheme without `//` (`htp:/bad`), never `host:port`.
_SCHEME_WITHOUT_SLASHES: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:(?![0-9])")


def normalise_url(url: str) -> str:
    """`10.0.0.5:8080` -> `http://10.0.0.5:8080`; no trailing slash; http or https only.

    A URL that names no usable edge is a usage error (exit 2, nothing is sent):
    another scheme, no host, or a port that is not 1-65535.
    """
    url = url.strip()
    given = url
    if "://" not in url:
        if _SCHEME_WITHOUT_SLASHES.match(url):
            raise UsageError(f"the edge URL {given!r} is not http://HOST[:PORT]", hint="e.g. http://10.0.0.5:8080")
        url = "http://" + url
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise UsageError(f"the edge URL must start with http:// or https://, not {scheme}://")
    rest = url.split("://", 1)[1].rstrip("/")
    parts = urlsplit(f"{scheme}://{rest}")
    if not rest or not parts.hostname:
        raise UsageError("the edge URL has no host")
    try:
        port = parts.port
    except ValueError:  # not a number, or above 65535
        port = 0
    if (port is not None and not 1 <= port <= 65535) or parts.netloc.endswith(":"):
        raise UsageError(f"the edge URL {given!r}: the port must be 1-65535")
    return f"{scheme}://{rest}"


def load_profile(path: Path, name: str | None, *, explicit: bool) -> dict[str, object]:
    """The named section of the profile file (`default` when no name is given).

    A missing file or section is an error only when the profile was asked for by name.
    """
    if not path.exists():
        if explicit:
            raise UsageError(f"profile {name!r} not found: {path} does not exist", hint="see: mp --help")
        return {}
    import tomllib

    try:
        with path.open("rb") as fh:
            document = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    section_name = name or "default"
    section = document.get(section_name)
    if section is None:
        if explicit:
            known = ", ".join(sorted(k for k, v in document.items() if isinstance(v, dict))) or "none"
            raise UsageError(f"profile {section_name!r} not found in {path}", hint=f"profiles: {known}")
        return {}
    if not isinstance(section, dict):
        raise UsageError(f"{path}: [{section_name}] must be a table")
    unknown = sorted(set(section) - PROFILE_KEYS)
    if unknown:
        raise UsageError(
            f"{path}: [{section_name}] has an unknown key {unknown[0]!r}",
            hint="keys: " + ", ".join(sorted(PROFILE_KEYS)),
        )
    for key in ("url", "token", "client_id", "client_secret"):
        if key in section and not isinstance(section[key], str):
            raise UsageError(f"{path}: [{section_name}] {key} must be a string")
    if "timeout" in section and not isinstance(section["timeout"], int | float):
        raise UsageError(f"{path}: [{section_name}] timeout must be a number of seconds")
    return dict(section)


def resolve(flags: Flags, env: Mapping[str, str], *, profile_path: Path | None = None) -> Settings:
    """Resolve the endpoint and credentials (see the module docstring for the order)."""
    cfg_dir = config_dir(env)
    path = profile_path if profile_path is not None else cfg_dir / "config.toml"
    profile_name = flags.profile or env.get("MEDIAPLANE_PROFILE") or None
    profile = load_profile(path, profile_name, explicit=profile_name is not None)

    def pick(key: str, flag_value: object) -> tuple[object, str | None]:
        if flag_value is not None and flag_value != "":
            return flag_value, "flag"
        env_value = env.get(_ENV[key]) or None
        if env_value is not None:
            return env_value, "env"
        if profile.get(key) not in (None, ""):
            return profile[key], "profile"
        return None, None

    url_value, url_source = pick("url", flags.url)
    url = normalise_url(str(url_value)) if url_value is not None else DEFAULT_URL

    timeout_value, _ = pick("timeout", flags.timeout_s)
    try:
        timeout_s = float(timeout_value) if timeout_value is not None else DEFAULT_TIMEOUT_S  # type: ignore[arg-type]
    except ValueError:
        raise UsageError(f"the timeout must be a number of seconds, not {timeout_value!r}") from None
    if timeout_s <= 0:
        raise UsageError("the timeout must be more than 0 seconds")

    token, token_level = pick("token", flags.token)
    client_id, id_level = pick("client_id", flags.client_id)
    client_secret, secret_level = pick("client_secret", flags.client_secret)

    def rank(level: str | None) -> int:
        return _LEVELS.index(level) if level is not None else len(_LEVELS)

    cred_rank = min(rank(id_level), rank(secret_level))
    credential_source: str | None = None
    if token is not None and rank(token_level) <= cred_rank:
        client_id = client_secret = None
        credential_source = token_level
    elif id_level is not None or secret_level is not None:
        token = None
        credential_source = _LEVELS[cred_rank]
    return Settings(
        url=url,
        timeout_s=timeout_s,
        token=str(token) if token is not None else None,
        client_id=str(client_id) if client_id is not None else None,
        client_secret=str(client_secret) if client_secret is not None else None,
        config_dir=cfg_dir,
        profile=profile_name,
        url_source=url_source or "default",
        credential_source=credential_source,
    )
