"""The certificate an RTMPS input serves (interop 2.3): the pair of ``server.tls`` when the edge
has one, else a self-signed pair generated at first use and kept beside the config
(``rtmps-cert.pem``, ``rtmps-key.pem``; the key 0600, both written atomically), so publishers
that pin it keep working across restarts.

The engine calls :func:`rtmps_files` when it starts an RTMPS flow and hands the two paths to
the worker (``start_flow``'s ``rtmp_tls``), which loads them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import socket
from pathlib import Path
from typing import Final

from appliance.config.atomic import atomic_write
from appliance.models.config import AppConfig
from appliance.tls_cert import generate_self_signed

__all__ = ["CERT_FILE_NAME", "KEY_FILE_NAME", "rtmps_files"]

CERT_FILE_NAME: Final = "rtmps-cert.pem"
KEY_FILE_NAME: Final = "rtmps-key.pem"
_LOOPBACK: Final = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
_log = logging.getLogger("mediaplane.edge")


def rtmps_files(config: AppConfig, config_dir: Path, now: dt.datetime | None = None) -> dict[str, str]:
    """``{"cert_path", "key_path"}`` of the pair RTMPS serves, generating it when needed.

    Blocking (file IO, and key generation once); raises OSError when the pair cannot be written.
    """
    if config.server.tls is not None:
        return {"cert_path": config.server.tls.cert_path, "key_path": config.server.tls.key_path}
    cert_path, key_path = config_dir / CERT_FILE_NAME, config_dir / KEY_FILE_NAME
    if not (cert_path.is_file() and key_path.is_file()):
        cert_pem, key_pem = generate_self_signed(socket.gethostname(), _LOOPBACK, now or dt.datetime.now(dt.UTC))
        atomic_write(key_path, key_pem, 0o600)  # the key first: a cert without its key is never left
        atomic_write(cert_path, cert_pem, 0o644)
        _log.info("generated a self-signed RTMPS certificate %s", cert_path)
    return {"cert_path": str(cert_path), "key_path": str(key_path)}
