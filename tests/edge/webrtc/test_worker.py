"""The webrtc worker's two links, in-process on real sockets (``services/edge/webrtc/worker.py``):
a kind registers, offers find (or do not find) its registration, an aiortc publisher connects
and its media arrives as TS on the kind's port."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer

from services.edge.core.mux import TsDemuxer
from services.edge.engine.ipc import FrameDecoder, encode_message
from services.edge.webrtc.rtc import install_codecs, install_ice, video_preferences
from services.edge.webrtc.sessions import OfferRefused
from services.edge.webrtc.worker import Link, WebrtcWorker


async def control_worker() -> tuple[WebrtcWorker, socket.socket]:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=theirs)
    return WebrtcWorker(Link(reader, writer)), ours


KindLink = tuple[asyncio.StreamReader, asyncio.StreamWriter, list[Any]]


async def kind_link(path: str, register: dict[str, Any]) -> KindLink:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(encode_message(register))
    decoder, messages = FrameDecoder(), []
    while len(messages) < 2:  # registered, then the first status
        messages += decoder.feed(await asyncio.wait_for(reader.read(65536), 5))
    return reader, writer, messages


def test_offers_without_a_registration_are_refused() -> None:
    async def run() -> None:
        worker, _control = await control_worker()
        for role, status in (("whip", 409), ("whep", 409), ("watch", 409), ("nonsense", 400)):
            with pytest.raises(OfferRefused) as refused:
                await worker.handle({"op": "offer", "flow_id": "f", "role": role, "sdp": "v=0"})
            assert refused.value.status == status
        with pytest.raises(OfferRefused):
            await worker.handle({"op": "frobnicate"})

    asyncio.run(run())


def test_a_registered_whip_input_takes_a_publisher_and_sends_ts(tmp_path: Path) -> None:
    install_codecs()
    install_ice()

    async def run() -> None:
        worker, _control = await control_worker()
        path = str(tmp_path / "kinds.sock")
        server = await asyncio.start_unix_server(worker.on_kind, path=path)
        media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        media.bind(("127.0.0.1", 0))
        media.setblocking(False)
        register = {
            "op": "register",
            "role": "input",
            "flow_id": "f",
            "config": {"type": "webrtc", "video_only": False},
            "media_port": media.getsockname()[1],
        }
        _reader, writer, messages = await kind_link(path, register)
        assert messages[0] == {"op": "registered"} and messages[1]["state"] == "waiting"

        with pytest.raises(OfferRefused) as refused:
            await worker.handle({"op": "offer", "flow_id": "f", "role": "whip", "sdp": "hello"})
        assert refused.value.status == 400

        player = MediaPlayer("testsrc=size=320x180:rate=30", format="lavfi")
        publisher = RTCPeerConnection()
        transceiver = publisher.addTransceiver(player.video, direction="sendonly")
        transceiver.setCodecPreferences(video_preferences(66))
        await publisher.setLocalDescription(await publisher.createOffer())
        answer = await worker.handle(
            {"op": "offer", "flow_id": "f", "role": "whip", "sdp": publisher.localDescription.sdp}
        )
        assert answer["status"] == 201 and answer["etag"].startswith('"')
        assert "a=candidate:" in answer["sdp"] and "127.0.0.1" in answer["sdp"]  # loopback offered (interop 4)
        await publisher.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))

        demuxer, units = TsDemuxer(), []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not any(u.kind == "video" and u.keyframe for u in units) and loop.time() < deadline:
            try:
                units += demuxer.feed(await asyncio.wait_for(loop.sock_recv(media, 2048), 1))
            except TimeoutError:
                continue
        assert any(u.kind == "video" and u.keyframe and u.codec == "h264" for u in units)
        registration = worker.inputs["f"]
        assert [s.role for s in registration.sessions.values()] == ["publisher"]

        # The kind goes away (its flow stopped): the registration and its session end.
        writer.close()
        while "f" in worker.inputs and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert "f" not in worker.inputs and registration.sessions == {}
        await publisher.close()
        player.video.stop()
        server.close()
        media.close()

    asyncio.run(run())
