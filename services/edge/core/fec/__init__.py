"""SMPTE ST 2022-1 FEC (Pro-MPEG CoP#3 r2): header codec, encoder, decoder. Sans-IO cores.

See ``docs/fec.md`` for the wire format and the recovery limits.
"""

from services.edge.core.fec.decoder import FecDecoder, FecDecoderCounters
from services.edge.core.fec.encoder import FecEncoder, FecEncoderCounters
from services.edge.core.fec.header import FecPacket, build_fec_header, parse_fec
from services.edge.core.fec.reorder import PutResult, ReorderBuffer

__all__ = [
    "FecDecoder",
    "FecDecoderCounters",
    "FecEncoder",
    "FecEncoderCounters",
    "FecPacket",
    "PutResult",
    "ReorderBuffer",
    "build_fec_header",
    "parse_fec",
]
