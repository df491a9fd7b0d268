"""The manager's service object: what the routes ask, and (later) what owns the store.

Today it holds the run's settings, the served certificate, the secrets-at-rest box and the
start time, and answers ``/health``. The store, the node hub and the dashboard stream attach
here as they are built, so routes keep to parse, authorise, call, answer (style.md H8).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from services.manager.secrets import SecretBox
from services.manager.settings import ManagerSettings, TlsMode
from services.manager.tls import ServedCertificate

__all__ = ["SERVICE_NAME", "ManagerHealth", "ManagerService"]

SERVICE_NAME: Literal["mediaplane-manager"] = "mediaplane-manager"


class ManagerHealth(BaseModel):
    """``GET /health`` (interop.md 1.3): exactly these four fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["ok"] = "ok"
    service: Literal["mediaplane-manager"] = SERVICE_NAME
    version: str
    self_signed_cert: bool
    """True when the certificate served is self-signed; False in ``behind_proxy`` mode,
    where the manager serves no certificate."""


class ManagerService:
    """One running manager. Built once at start; never does I/O in its constructor."""

    def __init__(
        self,
        settings: ManagerSettings,
        *,
        version: str,
        started_at: dt.datetime,
        certificate: ServedCertificate | None,
    ) -> None:
        self.settings = settings
        self.version = version
        self.started_at = started_at
        """Wall-clock UTC time the process started."""
        self.certificate = certificate
        """The pair served in ``direct`` mode; None in ``behind_proxy`` mode."""
        self.secret_box = SecretBox(settings.master_key)
        """Encrypts the secrets the store keeps (interop.md 7.7)."""

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def tls_mode(self) -> TlsMode:
        return self.settings.tls_mode

    @property
    def self_signed_cert(self) -> bool:
        return self.certificate is not None and self.certificate.self_signed

    def health(self) -> ManagerHealth:
        """The ``/health`` answer; it needs nothing that can fail."""
        return ManagerHealth(version=self.version, self_signed_cert=self.self_signed_cert)
