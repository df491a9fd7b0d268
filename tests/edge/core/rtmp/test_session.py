"""RtmpClientConnection <-> RtmpServerConnection through in-memory byte pipes: connect, publish,
media (H.264/AAC and Enhanced RTMP HEVC), timestamps across the 32-bit wrap, unpublish, reject."""

from __future__ import annotations

import itertools

import pytest

from services.edge.core.rtmp import (
    AmfValue,
    AudioCodec,
    AudioData,
    AudioTag,
    ClientConnected,
    Connected,
    ConnectionClosed,
    ErrorReceived,
    FrameType,
    Metadata,
    PacketKind,
    ProtocolError,
    PublishRequested,
    PublishStarted,
    RtmpClientConnection,
    RtmpServerConnection,
    StreamEnded,
    VideoCodec,
    VideoData,
    VideoTag,
    amf0,
)
from services.edge.core.rtmp.chunk import ChunkReader, ChunkWriter, MessageType
from services.edge.core.rtmp.connection import HANDSHAKE_SIZE

from .session import Pipe, publishing_pair

AVCC = bytes.fromhex("0164000dffe1001967640010acd9")
HVCC = bytes.fromhex("01016000000090000000000078f000fcfdf8f800000f03")
ASC = b"\x12\x10"
WRAP = 1 << 32


def test_connect_and_publish_events() -> None:
    pipe, client_events, server_events = publishing_pair("key?token=s3cret")
    assert server_events == [
        ClientConnected(
            "live",
            "rtmp://127.0.0.1/live",
            {
                "app": "live",
                "type": "nonprivate",
                "flashVer": "FMLE/3.0 (compatible; mediaplane)",
                "tcUrl": "rtmp://127.0.0.1/live",
            },
        ),
        PublishRequested("live", "key", 1, "live", "token=s3cret", "rtmp://127.0.0.1/live"),
    ]
    assert len(client_events) == 2
    connected, started = client_events
    assert isinstance(connected, Connected)
    assert connected.properties["fmsVer"] and connected.properties["capabilities"] == 31.0
    assert connected.information["code"] == "NetConnection.Connect.Success"
    assert started == PublishStarted(1, "key?token=s3cret")
    assert pipe.server.publishing_streams == {1: "key"}
    assert pipe.client.publishing


def test_h264_aac_media_across_the_32_bit_wrap() -> None:
    pipe, _, _ = publishing_pair()
    client = pipe.client
    start = WRAP - 200  # extended timestamps from the first message, wrapping after 5 frames
    client.send_metadata({"width": 320.0, "height": 240.0, "videocodecid": 7.0}, start)
    client.send_video(start, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, AVCC))
    client.send_audio(start, AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, ASC))
    sent_video: list[tuple[int, VideoTag]] = []
    for index in range(12):
        ts = start + 40 * index
        frame = VideoTag(
            VideoCodec.AVC,
            FrameType.KEY if index % 6 == 0 else FrameType.INTER,
            PacketKind.FRAME,
            bytes([index]) * (9000 if index % 6 == 0 else 700),  # keyframes span several 4096-octet chunks
            80 if index % 2 else -40,
        )
        client.send_video(ts, frame)
        client.send_audio(ts + 3, AudioTag(AudioCodec.AAC, PacketKind.FRAME, bytes([index]) * 300))
        sent_video.append((ts, frame))
    pipe.pump()
    events = pipe.take_server_events()
    assert events[0] == Metadata(1, start, "onMetaData", {"width": 320.0, "height": 240.0, "videocodecid": 7.0})
    assert events[1] == VideoData(1, start, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, AVCC))
    assert events[2] == AudioData(1, start, AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, ASC))
    video = [e for e in events[3:] if isinstance(e, VideoData)]
    audio = [e for e in events[3:] if isinstance(e, AudioData)]
    assert [(e.timestamp, e.tag) for e in video] == sent_video
    assert [e.timestamp for e in audio] == [start + 40 * i + 3 for i in range(12)]
    assert video[-1].timestamp > WRAP  # past the wrap, still increasing
    timestamps = [e.timestamp for e in video]
    assert timestamps == sorted(timestamps)

    client.unpublish()
    pipe.pump()
    # FCUnpublish ends the stream; the deleteStream after it does not repeat the event.
    assert pipe.take_server_events() == [StreamEnded(1, "key", "FCUnpublish")]
    assert pipe.server.publishing_streams == {}
    assert pipe.server.receive_data(b"") == [ConnectionClosed()]
    assert pipe.server.closed
    assert pipe.server.receive_data(b"late") == []


def test_enhanced_rtmp_hevc() -> None:
    pipe, client_events, server_events = publishing_pair(fourcc_list=("hvc1",))
    connected = server_events[0]
    assert isinstance(connected, ClientConnected) and connected.fourcc_list == ("hvc1",)
    assert connected.properties["fourCcList"] == ["hvc1"]
    client_connected = client_events[0]
    assert isinstance(client_connected, Connected) and client_connected.information["fourCcList"] == ["hvc1"]
    tags = [
        VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, HVCC, enhanced=True),
        VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.FRAME, b"\x00\x00\x00\x03\x26\x01\xaf", 80, enhanced=True),
        VideoTag(VideoCodec.HEVC, FrameType.INTER, PacketKind.FRAME, b"\x00\x00\x00\x03\x02\x01\xd0", 0, enhanced=True),
        VideoTag(
            VideoCodec.HEVC, FrameType.INTER, PacketKind.FRAME, b"\x00\x00\x00\x03\x02\x01\xd1", -40, enhanced=True
        ),
        VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.END_OF_SEQUENCE, b"", enhanced=True),
    ]
    for index, tag in enumerate(tags):
        pipe.client.send_video(WRAP - 80 + 40 * index, tag)
    pipe.pump()
    events = pipe.take_server_events()
    assert events == [VideoData(1, WRAP - 80 + 40 * i, tag) for i, tag in enumerate(tags)]
    pipe.client.unpublish()
    pipe.pump()
    assert pipe.take_server_events() == [StreamEnded(1, "key", "FCUnpublish")]


def test_delete_stream_alone_ends_the_stream() -> None:
    pipe, _, _ = publishing_pair()
    # What a client does that skips FCUnpublish: deleteStream only.
    pipe.client._send_command(3, 0, "deleteStream", 9.0, None, 1.0)
    pipe.pump()
    assert pipe.take_server_events() == [StreamEnded(1, "key", "deleteStream")]


def test_reject_publish() -> None:
    client = RtmpClientConnection(app="live", tc_url="rtmp://h/live")
    server = RtmpServerConnection()
    pipe = Pipe(client, server, accept=False)
    client.publish("wrong")
    pipe.pump()
    request = pipe.take_server_events()[-1]
    assert isinstance(request, PublishRequested) and request.stream_key == "wrong"
    server.reject_publish("unknown stream key")
    assert server.closed
    pipe.pump()
    events = pipe.take_client_events()
    assert events[-1] == ErrorReceived(
        "publish",
        "NetStream.Publish.BadName",
        "unknown stream key",
        {
            "level": "error",
            "code": "NetStream.Publish.BadName",
            "description": "unknown stream key",
            "details": "wrong",
        },
    )
    assert not client.publishing
    with pytest.raises(RuntimeError):
        client.send_video(0, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.FRAME, b""))


def test_acknowledgements_follow_the_window() -> None:
    # The server asks for a 5000-octet window; the client answers Set Peer Bandwidth with the same
    # Window Acknowledgement Size, so the server acknowledges every 5000 octets it receives.
    pipe, _, _ = publishing_pair(window_ack_size=5000)
    for index in range(10):
        pipe.client.send_video(40 * index, VideoTag(VideoCodec.AVC, FrameType.INTER, PacketKind.FRAME, bytes(2000)))
        pipe.pump()  # one receive_data per frame: at most one Acknowledgement per call
    tap = ChunkReader()
    messages = tap.feed(bytes(pipe.server_to_client[1 + 2 * HANDSHAKE_SIZE :]))
    acks = [int.from_bytes(m.payload, "big") for m in messages if m.type_id == MessageType.ACKNOWLEDGEMENT]
    assert len(acks) >= 3
    assert acks == sorted(acks) and all(b - a >= 5000 for a, b in itertools.pairwise(acks))
    server_sees = ChunkReader()
    control = server_sees.feed(bytes(pipe.client_to_server[1 + 2 * HANDSHAKE_SIZE :]))
    assert any(m.type_id == MessageType.WINDOW_ACK_SIZE and m.payload == (5000).to_bytes(4, "big") for m in control)


def test_ping_request_is_answered() -> None:
    pipe, _, _ = publishing_pair()
    ping = pipe.client._writer.write_control(MessageType.USER_CONTROL, b"\x00\x06" + (1234).to_bytes(4, "big"))
    pipe.server.receive_data(ping)
    answer = pipe.server.data_to_send()
    # fmt 2 on chunk stream 2 (its last message, StreamBegin, had the same type and length), PingResponse
    assert answer == b"\x82" + bytes(3) + b"\x00\x07" + (1234).to_bytes(4, "big")


def test_handshake_in_single_octets() -> None:
    client = RtmpClientConnection(app="live", tc_url="rtmp://h/live", handshake_random=bytes(1528))
    server = RtmpServerConnection()
    hello = client.data_to_send()
    assert hello[0] == 3 and len(hello) == 1 + HANDSHAKE_SIZE
    for i in range(len(hello)):
        assert server.receive_data(hello[i : i + 1]) == []
    answer = server.data_to_send()
    assert len(answer) == 1 + 2 * HANDSHAKE_SIZE and answer[1 + HANDSHAKE_SIZE :] == hello[1:]  # S2 echoes C1
    client.receive_data(answer)
    c2_and_connect = client.data_to_send()
    assert c2_and_connect[:HANDSHAKE_SIZE] == answer[1 : 1 + HANDSHAKE_SIZE]  # C2 echoes S1
    events = []
    for i in range(len(c2_and_connect)):
        events += server.receive_data(c2_and_connect[i : i + 1])
    assert [type(e) for e in events] == [ClientConnected]


@pytest.mark.parametrize("version", [0, 6, 0x16])
def test_wrong_version_is_a_protocol_error_and_sticks(version: int) -> None:
    server = RtmpServerConnection()
    with pytest.raises(ProtocolError, match="version"):
        server.receive_data(bytes([version]) + bytes(1536))
    assert server.closed
    with pytest.raises(ProtocolError):
        server.receive_data(b"\x03")


def test_commands_before_connect_and_publish_without_create_stream_fail() -> None:
    client = RtmpClientConnection(app="live", tc_url="rtmp://h/live")
    server = RtmpServerConnection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    client.data_to_send()  # C2 + connect: dropped, the server gets something else instead
    server.receive_data(bytes(HANDSHAKE_SIZE))
    with pytest.raises(ProtocolError, match="before connect"):
        server.receive_data(ChunkWriter().write(3, 20, 0, 0, b"\x02\x00\x0ccreateStream\x00" + bytes(8) + b"\x05"))


def test_aggregate_and_amf3_data_messages() -> None:
    pipe, _, _ = publishing_pair()
    # §7.1.6 aggregate: FLV-style sub-tags (type, size, timestamp, stream id, body, back pointer);
    # sub-tag times are offsets from the first one, placed at the message timestamp.
    video = b"\x27\x01\x00\x00\x00" + b"nal"
    audio = b"\xaf\x01" + b"raw"

    def sub_tag(tag_type: int, ts: int, body: bytes) -> bytes:
        head = bytes([tag_type]) + len(body).to_bytes(3, "big") + ts.to_bytes(3, "big") + bytes(4)
        return head + body + (11 + len(body)).to_bytes(4, "big")

    aggregate = sub_tag(9, 5000, video) + sub_tag(8, 5020, audio)
    data = b"\x00" + b"\x02\x00\x0aonCuePoint\x03\x00\x01t\x00" + bytes(8) + b"\x00\x00\x09"
    pipe.client._send(6, MessageType.AGGREGATE, 1, 100, aggregate)
    pipe.client._send(5, MessageType.DATA_AMF3, 1, 140, data)
    pipe.pump()
    events = pipe.take_server_events()
    assert events == [
        VideoData(1, 100, VideoTag(VideoCodec.AVC, FrameType.INTER, PacketKind.FRAME, b"nal")),
        AudioData(1, 120, AudioTag(AudioCodec.AAC, PacketKind.FRAME, b"raw")),
        Metadata(1, 140, "onCuePoint", {"t": 0.0}),
    ]


def test_message_over_the_cap_is_a_protocol_error() -> None:
    pipe, _, _ = publishing_pair(max_message_size=10_000)
    pipe.client.send_video(0, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.FRAME, bytes(9_995)))
    pipe.pump()
    assert len(pipe.take_server_events()) == 1
    pipe.client.send_video(40, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.FRAME, bytes(9_996)))
    with pytest.raises(ProtocolError, match="exceeds"):
        pipe.pump()
    assert pipe.server.closed


def test_media_on_streams_not_published_is_dropped() -> None:
    pipe, _, _ = publishing_pair()
    pipe.client._send(6, MessageType.VIDEO, 7, 0, b"\x17\x01\x00\x00\x00x")  # stream 7 was never created
    pipe.pump()
    assert pipe.take_server_events() == []


def test_a_dropped_connection_ends_its_streams() -> None:
    pipe, _, _ = publishing_pair()
    assert pipe.server.receive_data(b"") == [StreamEnded(1, "key", "closed"), ConnectionClosed()]
    assert pipe.server.publishing_streams == {}


def test_publish_after_connected_and_connect_error() -> None:
    client = RtmpClientConnection(app="live", tc_url="rtmp://h/live")
    server = RtmpServerConnection()
    pipe = Pipe(client, server)
    pipe.pump()
    assert [type(e) for e in pipe.take_client_events()] == [Connected]
    assert client.connected and client.stream_id is None
    client.publish("later")
    pipe.pump()
    assert pipe.take_client_events() == [PublishStarted(1, "later")]

    # A server that refuses connect with _error (§7.2.1.1).
    refused = RtmpClientConnection(app="nope", tc_url="rtmp://h/nope")
    hello = refused.data_to_send()
    writer = ChunkWriter()
    info = {"level": "error", "code": "NetConnection.Connect.Rejected", "description": "no such app"}
    answer = b"\x03" + bytes(HANDSHAKE_SIZE) + hello[1:] + writer.write(3, 20, 0, 0, _error_body(1.0, info))
    assert refused.receive_data(answer) == [
        ErrorReceived("connect", "NetConnection.Connect.Rejected", "no such app", info)
    ]
    assert not refused.connected


def _error_body(transaction: float, info: dict[str, AmfValue]) -> bytes:
    return amf0.encode_values("_error", transaction, None, info)
