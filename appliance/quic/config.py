"""QUIC configurations of interop.md 8.1, for both ends of a relay or direct-mode connection."""

from __future__ import annotations

import datetime as dt
import ssl
from typing import Final

from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from appliance.relayproto.messages import IDLE_TIMEOUT_S, MAX_UDP_PAYLOAD_BYTES
from appliance.tls_cert import generate_self_signed

__all__ = ["MAX_DATAGRAM_FRAME_BYTES", "client_configuration", "server_configuration"]

MAX_DATAGRAM_FRAME_BYTES: Final = 65536
"""The DATAGRAM frame size we accept (RFC 9221 max_datagram_frame_size); a packet is ≤ 1452."""


def _common(alpn: str, *, is_client: bool) -> QuicConfiguration:
    return QuicConfiguration(
        alpn_protocols=[alpn],
        is_client=is_client,
        idle_timeout=IDLE_TIMEOUT_S,
        max_datagram_size=MAX_UDP_PAYLOAD_BYTES,
        max_datagram_frame_size=MAX_DATAGRAM_FRAME_BYTES,
        # Cubic holds a higher rate than Reno over the short, clean paths a relay usually has.
        congestion_control_algorithm="cubic",
    )


def server_configuration(alpn: str, cert_pem: bytes | None = None, key_pem: bytes | None = None) -> QuicConfiguration:
    """A listener for ``alpn``; without a pair, a self-signed certificate made now (interop.md 1.2).

    Any other ALPN fails the handshake (interop.md 8.1): aioquic's TLS refuses a ClientHello
    without a common protocol."""
    configuration = _common(alpn, is_client=False)
    if cert_pem is None or key_pem is None:
        cert_pem, key_pem = generate_self_signed("localhost", [], dt.datetime.now(dt.UTC))
    chain = x509.load_pem_x509_certificates(cert_pem)
    configuration.certificate = chain[0]
    configuration.certificate_chain = chain[1:]
    configuration.private_key = load_pem_private_key(key_pem, password=None)
    return configuration


def client_configuration(alpn: str) -> QuicConfiguration:
    """A dialler for ``alpn``. Certificates are not verified (interop.md 8.1): payloads are
    protected end to end (section 10) and legs by bind tokens or the direct-mode PSK."""
    configuration = _common(alpn, is_client=True)
    configuration.verify_mode = ssl.CERT_NONE
    return configuration
