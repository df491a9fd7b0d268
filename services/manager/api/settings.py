"""``/api/v1/settings`` and the TLS certificate (interop.md 7.4, 7.5, 13): admin and above.

- ``GET /api/v1/settings``: the flat object of every setting, defaults filled in.
- ``PUT /api/v1/settings {"settings": {key: value}}``: every key is checked before any is
  written (one transaction); an unknown key, a value out of range or of the wrong type, or
  ``null``, is 400 naming the key, never the value. 200 with the full object. Every setting
  is read from the store where it is used, so the change is live (the login limit applies
  to the next login).
- ``GET /api/v1/settings/tls``: ``{subject, issuer, self_signed, not_before, not_after,
  fingerprint_sha256}`` of the certificate served now (404 in ``behind_proxy`` mode, which
  serves none). ``fingerprint_sha256`` is the SHA-256 of the DER as colon-separated upper-case
  hex pairs, the form the edge's ``manager.cert_fingerprint`` takes (interop.md 2.1).
- ``POST /api/v1/settings/tls/upload {cert_pem, key_pem}``: each ≤64 KiB (413); both must
  parse and the key must match the certificate (400). The key is written first, at 0600,
  then the certificate, each atomically, into ``DATA_DIR/tls``; 200 ``{success:true,
  message}``. The running server keeps its certificate until it restarts. Every error of
  this route is ``{success:false, error}``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Final

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pydantic import BaseModel, ConfigDict, StrictStr, TypeAdapter
from quart import Blueprint, Response, current_app

from appliance import errors
from appliance.config.atomic import atomic_write
from appliance.http.app import read_json_object, validate
from appliance.http.envelope import fail, json_response, status_for
from services.manager.api.auth_routes import require, service
from services.manager.api.ws import HUB_KEY
from services.manager.service import rfc3339
from services.manager.store import Role
from services.manager.tls import CERT_FILE_NAME, KEY_FILE_NAME, check_pair, is_self_signed

__all__ = ["MAX_PEM_BYTES", "RESTART_MESSAGE", "bp", "certificate_info", "write_pair"]

bp = Blueprint("manager_settings", __name__)

MAX_PEM_BYTES: Final = 64 * 1024
RESTART_MESSAGE: Final = "Certificate and key saved; restart mp-manager to serve them"


class SettingsUpdate(BaseModel):
    """``PUT /api/v1/settings``: the keys to change, under ``settings``."""

    model_config = ConfigDict(extra="forbid")

    settings: dict[str, Any]


class TlsUpload(BaseModel):
    """``POST /api/v1/settings/tls/upload``."""

    model_config = ConfigDict(extra="forbid")

    cert_pem: StrictStr
    key_pem: StrictStr


_UPDATE: Final = TypeAdapter(SettingsUpdate)
_UPLOAD: Final = TypeAdapter(TlsUpload)


@bp.get("/api/v1/settings")
@require(Role.ADMIN)
async def get_settings() -> Response:
    """Every setting, defaults filled in."""
    return json_response(await service().runtime_settings())


@bp.put("/api/v1/settings")
@require(Role.ADMIN)
async def put_settings() -> Response:
    """Checks every key, writes them in one transaction, answers the full object."""
    body = validate(_UPDATE, await read_json_object())
    settings = await service().update_settings(body.settings)
    hub = current_app.config.get(HUB_KEY)
    if hub is not None:  # interop.md 7.5: every setting takes effect live, the hub's two included
        # (and on every instance of a fleet: the hub tells the others).
        await hub.settings_changed(
            keepalive_interval_s=settings.ws_keepalive_interval_secs,
            offline_threshold_s=settings.node_offline_threshold_secs,
        )
    return json_response(settings)


def certificate_info(certificate: x509.Certificate) -> dict[str, Any]:
    """``GET /settings/tls``'s answer for ``certificate``."""
    der = certificate.public_bytes(serialization.Encoding.DER)
    digest = hashlib.sha256(der).hexdigest().upper()
    return {
        "subject": certificate.subject.rfc4514_string(),
        "issuer": certificate.issuer.rfc4514_string(),
        "self_signed": is_self_signed(certificate),
        "not_before": rfc3339(certificate.not_valid_before_utc),
        "not_after": rfc3339(certificate.not_valid_after_utc),
        "fingerprint_sha256": ":".join(digest[i : i + 2] for i in range(0, len(digest), 2)),
    }


@bp.get("/api/v1/settings/tls")
@require(Role.ADMIN)
async def get_tls() -> Response:
    """The served certificate's subject, issuer, validity and fingerprint."""
    served = service().certificate
    if served is None:
        raise errors.NotFound("no certificate is served in behind_proxy mode")
    return json_response(certificate_info(served.certificate))


def write_pair(tls_dir: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """Writes the key (0600) then the certificate (0644), each atomically; blocking.

    PersistFailed (500) when a write fails; the old file of a failed write is intact.
    """
    if not tls_dir.is_dir():
        try:
            tls_dir.mkdir(mode=0o700, parents=True)
            os.chmod(tls_dir, 0o700)
        except OSError as exc:
            raise errors.PersistFailed(f"cannot create {tls_dir}: {exc.strerror}") from exc
    atomic_write(tls_dir / KEY_FILE_NAME, key_pem, 0o600)
    atomic_write(tls_dir / CERT_FILE_NAME, cert_pem, 0o644)


async def _upload() -> str:
    raw = await read_json_object()
    for name in ("cert_pem", "key_pem"):
        value = raw.get(name)
        if isinstance(value, str) and len(value.encode("utf-8")) > MAX_PEM_BYTES:
            raise errors.PayloadTooLarge(f"{name} is larger than {MAX_PEM_BYTES // 1024} KiB")
    body = validate(_UPLOAD, raw)
    cert_pem, key_pem = body.cert_pem.encode("utf-8"), body.key_pem.encode("utf-8")
    check_pair(cert_pem, key_pem)
    await trio.to_thread.run_sync(write_pair, service().settings.tls_dir, cert_pem, key_pem)
    return RESTART_MESSAGE


@bp.post("/api/v1/settings/tls/upload")
@require(Role.ADMIN)
async def upload_tls() -> Response:
    """Checks and saves a certificate and its key; served after a restart."""
    try:
        message = await _upload()
    except errors.ApplianceError as exc:
        return fail(exc.message, status_for(exc))
    return json_response({"success": True, "message": message})
