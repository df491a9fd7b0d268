"""The one exception the RTMP core raises on peer input."""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer sent something this core cannot accept (malformed, out of bounds or out of order).

    Every failure caused by received bytes is this class or a subclass; the driver closes the
    connection when it sees one. After a ProtocolError the connection object stays failed.
    """


class AmfError(ProtocolError):
    """Malformed or over-limit AMF0 data."""


class FlvError(ProtocolError):
    """A malformed FLV audio/video tag body or FLV file."""
