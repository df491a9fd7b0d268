"""QUIC under trio: aioquic's sans-IO connections (with the limits of interop.md 8.1) driven
by one UDP socket per :class:`~appliance.quic.endpoint.QuicEndpoint`."""

from appliance.quic.config import client_configuration, server_configuration
from appliance.quic.connection import ManagedConnection
from appliance.quic.endpoint import ConnectionHandler, QuicEndpoint, open_udp_socket

__all__ = [
    "ConnectionHandler",
    "ManagedConnection",
    "QuicEndpoint",
    "client_configuration",
    "open_udp_socket",
    "server_configuration",
]
