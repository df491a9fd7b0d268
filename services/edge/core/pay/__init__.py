"""RTP packetisers (sans-IO): access units -> RTP payloads and packets.

The sender side of ``core.depay``: H.264 (RFC 6184 packetization-mode 1) and HEVC (RFC 7798)
video, for the kinds that send RTP made from TS (the WebRTC outputs; the tests' RTSP camera
streams). See ``video.py``.
"""

from .video import RtpVideoPacketizer, video_payloads

__all__ = ["RtpVideoPacketizer", "video_payloads"]
