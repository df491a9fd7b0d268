"""Certificates for the manager's TLS tests, built here rather than by the code under test."""

from __future__ import annotations

import datetime as dt
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def build(
    subject: str,
    issuer: str,
    public_key: ec.EllipticCurvePublicKey,
    signing_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    hostname: str | None = None,
    ip: str | None = None,
    not_after: dt.datetime | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    valid_until = not_after or now + dt.timedelta(days=30)
    # Before both: an already expired certificate (not_after in the past) still needs its
    # validity to start before it ends, whatever today's date.
    valid_from = min(now, valid_until) - dt.timedelta(days=1)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from)
        .not_valid_after(valid_until)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    sans: list[x509.GeneralName] = []
    if hostname:
        sans.append(x509.DNSName(hostname))
    if ip:
        sans.append(x509.IPAddress(ipaddress.ip_address(ip)))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def ca_signed_pair(*, hostname: str, ip: str) -> tuple[bytes, bytes, bytes]:
    """``(ca_pem, cert_pem, key_pem)``: a leaf for ``hostname``/``ip`` signed by a fresh CA."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build("Test CA", "Test CA", ca_key.public_key(), ca_key, ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = build(hostname, "Test CA", leaf_key.public_key(), ca_key, hostname=hostname, ip=ip)
    return cert_pem(ca), cert_pem(leaf), key_pem(leaf_key)
