"""MPEG-2 transport stream cores: packets, PSI tables and the TR 101 290 analyser."""

from .packet import NULL_PID, PAT_PID, TS_PACKET_SIZE
from .psi import EsInfo, Pmt, SectionAssembler, crc32_mpeg2, parse_pat, parse_pmt, section_crc_ok
from .tr101290 import ProgramsChanged, Tr101290Analyzer

__all__ = [
    "NULL_PID",
    "PAT_PID",
    "TS_PACKET_SIZE",
    "EsInfo",
    "Pmt",
    "ProgramsChanged",
    "SectionAssembler",
    "Tr101290Analyzer",
    "crc32_mpeg2",
    "parse_pat",
    "parse_pmt",
    "section_crc_ok",
]
