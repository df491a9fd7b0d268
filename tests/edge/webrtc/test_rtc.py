"""The webrtc worker's aiortc glue (``services/edge/webrtc/rtc.py``): codecs, ICE, the taps."""

from __future__ import annotations

import asyncio
import ipaddress
from fractions import Fraction

import pytest
from aiortc.mediastreams import MediaStreamError

from services.edge.webrtc import rtc

HOST_LINE = "a=candidate:1 1 udp 2130706431 192.0.2.2 40000 typ host"
SDP = "\r\n".join(
    [
        "v=0",
        "m=video 9 UDP/TLS/RTP/SAVPF 97",
        HOST_LINE,
        "a=candidate:2 1 udp 2130706431 127.0.0.1 40001 typ host",
        "a=candidate:3 1 udp 2130706431 fd00::2 40002 typ host",
        "",
    ]
)


def test_public_ip_adds_a_host_candidate_beside_each_ipv4_one() -> None:
    assert rtc.add_public_candidates(SDP, None) == SDP
    out = rtc.add_public_candidates(SDP, "203.0.113.7").split("\r\n")
    added = [line for line in out if "203.0.113.7" in line]
    assert added == ["a=candidate:1p 1 udp 2130706175 203.0.113.7 40000 typ host"]
    assert out.index(added[0]) == out.index(HOST_LINE) + 1  # beside the one it mirrors


def test_host_addresses_put_loopback_first_and_leave_link_local_out() -> None:
    addresses = rtc.host_addresses(True, True)
    assert addresses[0] in ("127.0.0.1", "::1")
    assert "127.0.0.1" in addresses
    assert not any(ipaddress.ip_address(a).is_link_local for a in addresses)
    assert all(ipaddress.ip_address(a).version == 4 for a in rtc.host_addresses(True, False))


def test_no_stun_server_unless_one_is_configured() -> None:
    assert rtc.rtc_configuration(None).iceServers == []  # aiortc's default would ask Google's
    servers = rtc.rtc_configuration("stun:stun.example.net:3478").iceServers
    assert servers is not None and [s.urls for s in servers] == ["stun:stun.example.net:3478"]


@pytest.mark.parametrize(("profile_idc", "first"), [(100, "640034"), (77, "4d0034"), (66, "42e01f"), (None, "640034")])
def test_the_streams_own_profile_is_answered_first(profile_idc: int | None, first: str) -> None:
    rtc.install_codecs()
    preferences = rtc.video_preferences(profile_idc)
    h264 = [c.parameters["profile-level-id"] for c in preferences if c.mimeType == "video/H264"]
    assert h264[0] == first and sorted(h264) == sorted(["640034", "4d0034", "42e01f", "42001f"])
    assert all(c.parameters.get("packetization-mode") in (None, "1") for c in preferences)
    assert preferences[-1].mimeType == "video/rtx"


def test_the_frame_tap_replaces_decoding() -> None:
    frames: list[tuple[bytes, int]] = []
    tap = rtc._FrameTap(lambda data, ts: frames.append((data, ts)))

    class Frame:
        data, timestamp = b"\x00\x00\x00\x01\x65", 3000

    tap.put(("codec", Frame()))
    tap.put(None)  # the receiver stopping: its idle decoder thread gets the end marker
    assert frames == [(b"\x00\x00\x00\x01\x65", 3000)]
    assert tap.get(timeout=1) is None


def test_a_unit_track_starts_at_a_keyframe_and_skips_to_one_when_behind() -> None:
    async def run() -> None:
        track = rtc.UnitTrack("video")

        def unit(n: int) -> object:
            return rtc.make_packet(bytes([n]), n * 3000, rtc.VIDEO_TIME_BASE)

        track.push(unit(0), keyframe=False)  # before the first keyframe: not sent
        track.push(unit(1), keyframe=True)
        track.push(unit(2), keyframe=False)
        first = await track.recv()
        assert bytes(first) == b"\x01" and first.time_base == Fraction(1, 90_000)
        assert bytes(await track.recv()) == b"\x02"
        for n in range(rtc.UNIT_QUEUE):
            track.push(unit(3 + n % 200), keyframe=False)
        track.push(unit(250), keyframe=False)  # the queue is full: dropped, and resume at a keyframe
        assert track.dropped == rtc.UNIT_QUEUE
        track.push(unit(251), keyframe=False)
        track.push(unit(252), keyframe=True)
        assert bytes(await track.recv()) == bytes([252])
        track.stop()
        with pytest.raises(MediaStreamError):
            await track.recv()

    asyncio.run(run())
