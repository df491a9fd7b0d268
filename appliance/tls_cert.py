"""Self-signed certificates for this host: the manager's ``direct`` mode (interop.md 1.3), the
relay's QUIC listener and the edge's direct-mode tunnel listener (interop.md 1.2, 2.6).

ECDSA P-256 / SHA-256, a leaf (not a CA), SANs = the hostname, ``localhost`` and the given
addresses, valid 825 days (Apple platforms refuse TLS server certificates valid for longer).
aioquic, like browsers, needs a SAN: a CN alone is not matched.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["SELF_SIGNED_VALIDITY", "generate_self_signed"]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
SELF_SIGNED_VALIDITY: Final = dt.timedelta(days=825)
# A client whose clock runs a little behind still accepts a certificate made just now.
_BACKDATE: Final = dt.timedelta(hours=1)
_MAX_CN_CHARS: Final = 64  # RFC 5280 ub-common-name; the SAN carries the full hostname


def generate_self_signed(hostname: str, addresses: Iterable[IpAddress], now: dt.datetime) -> tuple[bytes, bytes]:
    """A new self-signed ``(cert_pem, key_pem)`` for this host (interop.md 1.3).

    ``now`` is the wall-clock time (timezone-aware) the validity starts from.
    """
    dns_names = [name for name in dict.fromkeys([_dns_name(hostname), "localhost"]) if name]
    common_name = dns_names[0][:_MAX_CN_CHARS]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(address) for address in dict.fromkeys(addresses)]
    public_key = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + SELF_SIGNED_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        # A leaf, not a CA: trusting it (a client's CA file, the edge's pin) trusts this host only.
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def _dns_name(hostname: str) -> str | None:
    """``hostname`` as an ASCII DNS name (IDNA A-labels), or None when it cannot be one."""
    name = hostname.strip().rstrip(".").lower()
    if not name:
        return None
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        return None
