"""Media content analysis: elementary-stream header parsers and the per-flow analyser."""

from .analyser import MediaAnalyser

__all__ = ["MediaAnalyser"]
