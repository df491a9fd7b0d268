"""The manager's TLS certificate in ``direct`` mode (interop.md 1.3, 7.4).

``DATA_DIR/tls/cert.pem`` and ``key.pem`` (0600) are served as they are. When ``cert.pem`` is
missing, a self-signed pair is generated at start: CN = the hostname, SANs = the hostname,
``localhost`` and the host's IP addresses (interop.md 1.3), ECDSA P-256 / SHA-256, valid
825 days (Apple platforms refuse TLS server certificates valid for longer). Both files are
written atomically, the key first and at 0600, so an interrupted write leaves at worst an
orphan key, which the next start replaces.

Rules at start, in :func:`ensure_certificate`:

- ``cert.pem`` missing: generate a pair (an orphan ``key.pem`` is replaced).
- ``cert.pem`` present, ``key.pem`` missing, either unreadable, not PEM, or not matching:
  :class:`StartupError` naming the file (exit 2). Nothing is overwritten: the pair may be
  the operator's (``POST /settings/tls/upload``, interop.md 7.4).
- A self-signed certificate that has expired is replaced by a new one (logged): no client can
  use it any more, and a box must not stop serving after 825 days.

"Self-signed" (``/health``'s ``self_signed_cert``, ``GET /settings/tls``'s ``self_signed``)
means issuer == subject *and* the signature verifies with the certificate's own key.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from appliance import errors
from appliance.config.atomic import atomic_write, remove_stale_temp_files
from appliance.tls_cert import SELF_SIGNED_VALIDITY, generate_self_signed
from services.manager.local_addresses import IpAddress
from services.manager.settings import StartupError

__all__ = [
    "CERT_FILE_NAME",
    "KEY_FILE_NAME",
    "SELF_SIGNED_VALIDITY",
    "ServedCertificate",
    "check_pair",
    "ensure_certificate",
    "generate_self_signed",
    "is_self_signed",
]

CERT_FILE_NAME: Final = "cert.pem"
KEY_FILE_NAME: Final = "key.pem"

_log = logging.getLogger("mediaplane.manager")


@dataclass(frozen=True, slots=True)
class ServedCertificate:
    """The pair ``direct`` mode serves."""

    cert_path: Path
    key_path: Path
    certificate: x509.Certificate
    """The leaf (the first certificate of ``cert.pem``)."""
    self_signed: bool
    generated: bool
    """True when this start wrote the pair."""


def is_self_signed(certificate: x509.Certificate) -> bool:
    """Issuer == subject and the signature verifies with the certificate's own public key."""
    if certificate.issuer != certificate.subject:
        return False
    try:
        certificate.verify_directly_issued_by(certificate)
    except (ValueError, TypeError, InvalidSignature):
        return False  # TypeError: a key type cryptography cannot verify with
    return True


def check_pair(cert_pem: bytes, key_pem: bytes) -> x509.Certificate:
    """The leaf certificate of ``cert_pem`` once both parse and the key matches it.

    Raises InvalidInput (what ``POST /settings/tls/upload`` answers with 400, interop.md
    7.4); the message never quotes the PEM.
    """
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise errors.InvalidInput("the certificate is not a PEM X.509 certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # TypeError: an encrypted key (no password can be given to the server).
        raise errors.InvalidInput("the key is not an unencrypted PEM private key") from None
    leaf = chain[0]
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != leaf.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ):
        raise errors.InvalidInput("the key does not match the certificate")
    return leaf


def ensure_certificate(
    tls_dir: Path, *, hostname: str, addresses: Iterable[IpAddress], now: dt.datetime
) -> ServedCertificate:
    """The pair to serve from ``tls_dir``, generating a self-signed one when there is none.

    Blocking; called once at start, before anything listens. Raises StartupError (exit 2)
    for a pair that cannot be served, PersistFailed (exit 1) when writing a new one fails.
    """
    cert_path, key_path = tls_dir / CERT_FILE_NAME, tls_dir / KEY_FILE_NAME
    _ensure_private_dir(tls_dir)
    remove_stale_temp_files(tls_dir, (CERT_FILE_NAME, KEY_FILE_NAME))
    if not cert_path.exists():
        if key_path.exists():
            _log.warning("%s has no %s beside it: replacing both with a new self-signed pair", key_path, cert_path)
        return _generate(cert_path, key_path, hostname, addresses, now)
    certificate = _load_pair(cert_path, key_path)
    self_signed = is_self_signed(certificate)
    if self_signed and certificate.not_valid_after_utc <= now:
        _log.warning(
            "the self-signed certificate %s expired on %s: replacing it", cert_path, certificate.not_valid_after_utc
        )
        return _generate(cert_path, key_path, hostname, addresses, now)
    if certificate.not_valid_after_utc <= now:
        _log.warning(
            "the certificate %s expired on %s: clients will refuse it", cert_path, certificate.not_valid_after_utc
        )
    _warn_if_key_exposed(key_path)
    _log.info("serving the %scertificate %s", "self-signed " if self_signed else "", cert_path)
    return ServedCertificate(cert_path, key_path, certificate, self_signed=self_signed, generated=False)


def _generate(
    cert_path: Path, key_path: Path, hostname: str, addresses: Iterable[IpAddress], now: dt.datetime
) -> ServedCertificate:
    addresses = list(addresses)
    cert_pem, key_pem = generate_self_signed(hostname, addresses, now)
    atomic_write(key_path, key_pem, 0o600)  # the key first: see the module docstring
    atomic_write(cert_path, cert_pem, 0o644)
    certificate = x509.load_pem_x509_certificate(cert_pem)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    _log.info(
        "generated a self-signed certificate %s for %s (SANs: %s), valid until %s",
        cert_path,
        certificate.subject.rfc4514_string(),
        ", ".join(str(name.value) for name in names),
        certificate.not_valid_after_utc.date(),
    )
    return ServedCertificate(cert_path, key_path, certificate, self_signed=True, generated=True)


def _load_pair(cert_path: Path, key_path: Path) -> x509.Certificate:
    try:
        cert_pem = cert_path.read_bytes()
    except OSError as exc:
        raise StartupError(f"cannot read {cert_path}: {exc.strerror}") from exc
    try:
        key_pem = key_path.read_bytes()
    except FileNotFoundError:
        raise StartupError(
            f"{cert_path} has no {key_path} beside it: restore the key, or move both away to have a "
            "self-signed pair generated"
        ) from None
    except OSError as exc:
        raise StartupError(f"cannot read {key_path}: {exc.strerror}") from exc
    try:
        return check_pair(cert_pem, key_pem)
    except errors.InvalidInput as exc:
        raise StartupError(f"cannot serve {cert_path} with {key_path}: {exc.message}") from None


def _ensure_private_dir(directory: Path) -> None:
    if directory.is_dir():
        return
    try:
        directory.mkdir(mode=0o700, parents=True)
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
    except OSError as exc:
        raise StartupError(f"cannot create {directory}: {exc.strerror}") from exc


def _warn_if_key_exposed(key_path: Path) -> None:
    try:
        mode = stat.S_IMODE(key_path.stat().st_mode)
    except OSError:
        return  # it was just read; a race with an operator is not worth a failure
    if mode & 0o077:
        _log.warning("%s is readable by other users (mode %04o): it should be 0600", key_path, mode)
