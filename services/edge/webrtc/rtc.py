"""What the webrtc worker changes in, and adds to, aiortc (pinned 1.16.0: the hooks below read
its private names, which ``tests/edge/webrtc`` pins down).

- **Codecs.** Video is H.264 only (no transcoding: the access units of the flow's TS go out as
  they are, and what a publisher sends is muxed as it is). Besides aiortc's two Baseline
  entries, Main and High profiles are offered (RFC 6184 §8.1 ``profile-level-id``): aiortc's
  negotiation matches on the profile, so a browser that asks for High (the profile most
  encoders produce) gets High, with ``level-asymmetry-allowed=1`` for the level.
- **ICE.** No STUN server unless the flow names one (aiortc would otherwise ask Google's), and the
  host candidates include loopback, so a peer on the same box connects over 127.0.0.1
  (interop.md 4); ``public_ip`` adds a host candidate of that address on the same port (a
  1:1 NAT that forwards the port).
- **Receiving without decoding.** :func:`tap_encoded_frames` takes the receiver's assembled
  access units (after aiortc's NACK/RTX, reordering and PLI handling) instead of its decoder:
  the video is never decoded here.
- **Sending without encoding.** :class:`UnitTrack` hands aiortc ``av.Packet`` objects, which its
  sender packetises (``Encoder.pack``) instead of encoding.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import queue
import re
from collections import deque
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final

import aioice.ice
import av
import ifaddr
from aiortc import RTCConfiguration, RTCIceServer, RTCRtpReceiver
from aiortc.codecs import CODECS
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtcpFeedback, RTCRtpCodecCapability, RTCRtpCodecParameters

_log = logging.getLogger("mediaplane.webrtc")

VIDEO_TIME_BASE: Final = Fraction(1, 90_000)  # RFC 6184 §8.2.1: H.264 RTP clock
AUDIO_TIME_BASE: Final = Fraction(1, 48_000)  # RFC 7587 §4.1: Opus RTP clock, always 48 kHz
# RFC 6184 profile_idc -> the profile-level-id we offer for it (level 5.2: the level is asymmetric).
H264_PROFILES: Final = {
    100: "640034",  # High
    77: "4d0034",  # Main
    66: "42e01f",  # Constrained Baseline
}
_BASELINE: Final = "42001f"
UNIT_QUEUE: Final = 120  # units a viewer may fall behind (4 s of 30 fps video) before it skips


def install_codecs() -> None:
    """Make aiortc's video codec table H.264 only: High, Main, Constrained Baseline, Baseline,
    each packetization-mode 1 with its RTX (RFC 4588). Idempotent."""
    video: list[RTCRtpCodecParameters] = []
    payload_type = 97
    for profile_level_id in (*H264_PROFILES.values(), _BASELINE):
        video.append(
            RTCRtpCodecParameters(
                mimeType="video/H264",
                clockRate=90_000,
                payloadType=payload_type,
                rtcpFeedback=[
                    RTCRtcpFeedback(type="nack"),
                    RTCRtcpFeedback(type="nack", parameter="pli"),
                    RTCRtcpFeedback(type="goog-remb"),
                ],
                parameters={
                    "level-asymmetry-allowed": "1",
                    "packetization-mode": "1",
                    "profile-level-id": profile_level_id,
                },
            )
        )
        video.append(
            RTCRtpCodecParameters(
                mimeType="video/rtx", clockRate=90_000, payloadType=payload_type + 1, parameters={"apt": payload_type}
            )
        )
        payload_type += 2
    CODECS["video"][:] = video
    CODECS["audio"][:] = [c for c in CODECS["audio"] if c.mimeType.lower() == "audio/opus"]


def video_preferences(profile_idc: int | None) -> list[RTCRtpCodecCapability]:
    """The H.264 entries in the order to answer with: the stream's own profile first (a sender
    uses the first codec of the answer), then the others, each with RTX."""
    first = H264_PROFILES.get(profile_idc or 100, H264_PROFILES[100])
    order = [first, *[p for p in (*H264_PROFILES.values(), _BASELINE) if p != first]]
    capabilities = RTCRtpReceiver.getCapabilities("video")
    assert capabilities is not None
    by_profile = {c.parameters.get("profile-level-id"): c for c in capabilities.codecs if c.mimeType == "video/H264"}
    rtx = [c for c in capabilities.codecs if c.mimeType == "video/rtx"]
    return [by_profile[p] for p in order if p in by_profile] + rtx


def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    """aioice's host addresses, loopback included (interop.md 4); IPv6 link-local excluded."""
    addresses: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                if use_ipv4:
                    addresses.append(ip.ip)
            elif use_ipv6 and ip.ip[2] == 0 and not ipaddress.ip_address(ip.ip[0]).is_link_local:
                addresses.append(ip.ip[0])
    # Loopback first: a peer on this box pairs over it (interop.md 4); a peer elsewhere gets no
    # answer on it and pairs over another address.
    return sorted(addresses, key=lambda a: not ipaddress.ip_address(a).is_loopback)


def install_ice() -> None:
    """Loopback host candidates (see ``host_addresses``)."""
    aioice.ice.get_host_addresses = host_addresses


def rtc_configuration(stun_server: str | None) -> RTCConfiguration:
    """No ICE server unless ``stun_server`` (``stun:host:port``) is set: aiortc's default would
    contact Google's STUN server."""
    return RTCConfiguration(iceServers=[RTCIceServer(stun_server)] if stun_server else [])


_CANDIDATE = re.compile(r"^a=candidate:(\S+) (\d) (udp|UDP) (\d+) (\S+) (\d+) typ host(.*)$")


def add_public_candidates(sdp: str, public_ip: str | None) -> str:
    """Add, beside each IPv4 non-loopback host candidate, one for ``public_ip`` on the same port
    (a lower priority): a peer behind the internet reaches the box through a 1:1 NAT that
    forwards the port (interop.md 4)."""
    if not public_ip:
        return sdp
    out: list[str] = []
    for line in sdp.split("\r\n"):
        out.append(line)
        match = _CANDIDATE.match(line)
        if match is None:
            continue
        foundation, component, _proto, priority, host, port, rest = match.groups()
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            continue
        if address.version != 4 or address.is_loopback:
            continue
        out.append(
            f"a=candidate:{foundation}p {component} udp {max(1, int(priority) - 256)} {public_ip} {port} typ host{rest}"
        )
    return "\r\n".join(out)


def remote_address(pc: Any) -> str | None:
    """The remote address of the selected ICE pair (``host:port``), or None before one is chosen."""
    try:
        for transceiver in pc.getTransceivers():
            ice = transceiver.receiver.transport.transport
            pair = ice._connection._nominated.get(1)
            if pair is not None:
                host, port = pair.remote_addr[:2]
                return f"{host}:{port}"
    except AttributeError:
        return None
    return None


# --------------------------------------------------------------------------- receive side
class _FrameTap:
    """Stands in for an ``RTCRtpReceiver``'s decoder queue (a ``queue.Queue`` it ``put``s
    assembled frames on, read by its decoder thread): frames go to ``on_frame`` on the event
    loop; only the end marker (None) reaches the idle decoder thread, which then exits."""

    def __init__(self, on_frame: Callable[[bytes, int], None]) -> None:
        self._on_frame = on_frame
        self._thread_queue: queue.Queue[Any] = queue.Queue()

    def put(self, item: Any) -> None:
        if item is None:
            self._thread_queue.put(None)
            return
        _codec, frame = item
        try:
            self._on_frame(frame.data, frame.timestamp)
        except Exception:  # the receive path must not die of a bad frame
            _log.exception("video frame handler failed")

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self._thread_queue.get(*args, **kwargs)


def tap_encoded_frames(receiver: RTCRtpReceiver, on_frame: Callable[[bytes, int], None]) -> None:
    """Deliver ``receiver``'s assembled access units (Annex B, and the RTP timestamp aiortc
    unwrapped from 0 at the first packet) to ``on_frame`` instead of decoding them. Must be called
    before the receiver starts (``setRemoteDescription`` creates it; it starts on connect)."""
    receiver._RTCRtpReceiver__decoder_queue = _FrameTap(on_frame)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- send side
class UnitTrack(MediaStreamTrack):
    """A track of ready-coded units (``av.Packet``: H.264 access units at 90 kHz, or Opus packets at
    48 kHz) that aiortc's sender packetises without encoding.

    A video track starts at a keyframe. If the sender falls ``UNIT_QUEUE`` units behind, what is
    queued is dropped and video resumes at the next keyframe (a damaged picture is worse than a
    short freeze), counted in ``dropped``.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self._queue: deque[av.Packet[Any]] = deque()
        self._ready = asyncio.Event()
        self._need_keyframe = kind == "video"
        self.dropped = 0
        self.sent_units = 0

    def push(self, packet: av.Packet[Any], keyframe: bool) -> None:
        """Queue one unit (never waits)."""
        if self.readyState != "live":
            return
        if self._need_keyframe:
            if not keyframe:
                return
            self._need_keyframe = False
        if len(self._queue) >= UNIT_QUEUE:
            self.dropped += len(self._queue)
            self._queue.clear()
            if self.kind == "video":
                self._need_keyframe = not keyframe
                if not keyframe:
                    return
        self._queue.append(packet)
        self._ready.set()

    async def recv(self) -> av.Packet[Any]:  # type: ignore[override,unused-ignore]
        while not self._queue:
            if self.readyState != "live":
                raise MediaStreamError
            self._ready.clear()
            await self._ready.wait()
        self.sent_units += 1
        return self._queue.popleft()

    def stop(self) -> None:
        super().stop()
        self._ready.set()


def make_packet(data: bytes, pts: int, time_base: Fraction) -> av.Packet[Any]:
    """An ``av.Packet`` of ``data`` at ``pts`` (what ``UnitTrack`` carries)."""
    packet = av.Packet(data)
    packet.pts = pts
    packet.time_base = time_base
    return packet


__all__ = [
    "AUDIO_TIME_BASE",
    "VIDEO_TIME_BASE",
    "UnitTrack",
    "add_public_candidates",
    "host_addresses",
    "install_codecs",
    "install_ice",
    "make_packet",
    "remote_address",
    "rtc_configuration",
    "tap_encoded_frames",
    "video_preferences",
]
