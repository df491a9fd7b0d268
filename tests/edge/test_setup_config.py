"""The wizard's checks (``services.edge.service.build_setup_config``, interop.md 3 and beyond).

Issue 15 item 3: the wizard used to save ``wss://``, ``wss://not a url`` and ``wss://:0/x``.
A manager URL must be ``wss://HOST[:PORT]/PATH`` with a host and a port 1-65535; a refused
URL is a 400 whose message never quotes it. ``cert_fingerprint`` (an extension of the body,
docs/edge.md) pins the manager's self-signed certificate without ``MEDIAPLANE_ALLOW_INSECURE``.
"""

from __future__ import annotations

from typing import Any

import pytest

from appliance import errors
from appliance.models.config import AppConfig
from services.edge.service import build_setup_config

GOOD_URL = "wss://mgr.example:8443/ws/node"
FINGERPRINT = ":".join(["AB"] * 16 + ["0f"] * 16)
FINGERPRINT_UPPER = FINGERPRINT.upper()


def current(**manager: Any) -> AppConfig:
    return AppConfig.model_validate(
        {
            "version": 1,
            "setup_enabled": True,
            "server": {"listen_addr": "0.0.0.0", "listen_port": 8080},
            "manager": {"enabled": False, "url": GOOD_URL, **manager} if manager else None,
        }
    )


def refused(body: dict[str, Any], config: AppConfig | None = None) -> str:
    with pytest.raises(errors.InvalidInput) as caught:
        build_setup_config(config or current(), body)
    return caught.value.message


# --------------------------------------------------------------------------- the manager URL


@pytest.mark.parametrize(
    "url",
    [
        "wss://",
        "wss://:0/x",
        "wss://:8443/ws/node",
        "wss://mgr.example:0/ws/node",
        "wss://mgr.example:65536/ws/node",
        "wss://mgr.example:99999/ws/node",
        "wss://mgr.example:port/ws/node",
        "wss://mgr.example:/ws/node",
        "wss:///ws/node",
        "wss://[::1/ws/node",
        "wss://bad_host!/ws/node",
        "wss://user:hunter2@mgr.example/ws/node",
    ],
)
def test_a_manager_url_without_a_host_or_a_valid_port_is_refused_without_echo(url: str) -> None:
    message = refused({"manager_url": url})
    assert message.startswith("Validation failed: manager.url: ")
    assert "host" in message and "1-65535" in message
    rest = url.removeprefix("wss://")
    if rest:
        assert rest not in message  # the rejected value is never quoted
    assert "hunter2" not in message


def test_a_url_with_a_space_is_refused_by_the_model_first() -> None:
    message = refused({"manager_url": "wss://not a url"})
    assert message.startswith("Validation failed: manager.url: ")
    assert "whitespace" in message and "not a url" not in message


@pytest.mark.parametrize(
    "url",
    [
        GOOD_URL,
        "wss://mgr.example/ws/node",
        "wss://mgr.example:1/ws/node",
        "wss://mgr.example:65535/ws/node",
        "wss://10.0.0.7:8443/ws/node",
        "wss://[fd00::7]:8443/ws/node",
        "wss://mgr-1.ob.example.:8443/ws/node?x=1",
        "wss://mgr.example:8443",
    ],
)
def test_a_url_with_a_host_and_a_valid_port_is_saved(url: str) -> None:
    config = build_setup_config(current(), {"manager_url": url})
    assert config.manager is not None and config.manager.url == url and config.manager.enabled


def test_the_contract_order_is_kept_for_the_earlier_checks() -> None:
    # interop.md 3: missing, then wss://, then lengths, then listen_*: all before the URL's host check.
    assert refused({}) == "manager_url is required"
    assert refused({"manager_url": "  "}) == "manager_url is required"
    assert "TLS is required" in refused({"manager_url": "https://mgr.example/ws/node"})
    assert "2048" in refused({"manager_url": "wss://" + "a" * 2100})
    assert refused({"manager_url": "wss://", "listen_port": 0}) == "listen_port must be 1-65535"
    assert refused({"manager_url": "wss://:0/x", "listen_addr": "nope"}) == "listen_addr must be an IP address literal"
    assert refused({"manager_url": GOOD_URL, "surprise": 1}) == "unknown key: surprise"


# --------------------------------------------------------------------------- cert_fingerprint (extension)


@pytest.mark.parametrize(
    "given",
    [
        FINGERPRINT,
        FINGERPRINT_UPPER,
        FINGERPRINT.replace(":", ""),
        f"  {FINGERPRINT}  ",
        f"sha256 Fingerprint={FINGERPRINT}",
        f"SHA256 Fingerprint={FINGERPRINT}\n",
    ],
)
def test_a_fingerprint_is_stored_in_the_form_the_link_checks(given: str) -> None:
    config = build_setup_config(
        current(), {"manager_url": GOOD_URL, "accept_self_signed_cert": True, "cert_fingerprint": given}
    )
    assert config.manager is not None
    assert config.manager.cert_fingerprint == FINGERPRINT_UPPER
    assert config.manager.accept_self_signed_cert is True


@pytest.mark.parametrize("bad", ["12:34", "zz" * 32, FINGERPRINT + ":00", "x", 42, True, ["AB"]])
def test_a_bad_fingerprint_is_refused_without_echo(bad: object) -> None:
    message = refused({"manager_url": GOOD_URL, "cert_fingerprint": bad})
    assert message.startswith("cert_fingerprint must be the SHA-256")
    if isinstance(bad, str) and len(bad) > 1:
        assert bad not in message


def test_a_fingerprint_absent_is_kept_and_null_or_empty_clears_it() -> None:
    pinned = current(cert_fingerprint=FINGERPRINT_UPPER)
    kept = build_setup_config(pinned, {"manager_url": GOOD_URL})
    assert kept.manager is not None and kept.manager.cert_fingerprint == FINGERPRINT_UPPER  # interop.md 3
    for cleared in (None, "", "   "):
        config = build_setup_config(pinned, {"manager_url": GOOD_URL, "cert_fingerprint": cleared})
        assert config.manager is not None and config.manager.cert_fingerprint is None
