"""Property tests: random bytes, and random mutations of a recorded valid session, fed to both
connections raise nothing but ProtocolError and never hold more input than the caps allow."""

from __future__ import annotations

from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.edge.core.rtmp import (
    AudioCodec,
    AudioTag,
    FrameType,
    PacketKind,
    ProtocolError,
    PublishRequested,
    RtmpClientConnection,
    RtmpServerConnection,
    VideoCodec,
    VideoTag,
    amf0,
)
from services.edge.core.rtmp.chunk import ChunkReader, ChunkWriter, encode_basic_header
from services.edge.core.rtmp.connection import HANDSHAKE_SIZE
from services.edge.core.rtmp.flv import parse_audio_tag, parse_video_tag

from .session import publishing_pair

MESSAGE_CAP = 8192  # small caps so "never past the caps" means something at these input sizes
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def new_client() -> RtmpClientConnection:
    client = RtmpClientConnection(
        app="live", tc_url="rtmp://127.0.0.1/live", fourcc_list=("hvc1",), max_message_size=MESSAGE_CAP
    )
    client.publish("key")
    client.data_to_send()
    return client


def feed(connection: RtmpServerConnection | RtmpClientConnection, pieces: list[bytes]) -> None:
    """Feed pieces; only ProtocolError may escape, buffers stay within the caps."""
    for piece in pieces:
        try:
            events = connection.receive_data(piece)
        except ProtocolError:
            assert connection.closed
            return
        for event in events:
            if isinstance(event, PublishRequested) and isinstance(connection, RtmpServerConnection):
                connection.accept_publish(event.stream_id)
        connection.data_to_send()
        assert connection.buffered_input_bytes <= connection.max_buffered_input_bytes <= 2 * MESSAGE_CAP + 18


@cache
def recorded_session() -> tuple[bytes, bytes]:
    """Both directions of a full session: connect, publish, AVC + HEVC + AAC media, metadata, unpublish."""
    pipe, _, _ = publishing_pair(fourcc_list=("hvc1",))
    client = pipe.client
    client.send_metadata({"width": 320.0, "encoder": "x"}, 0)
    client.send_video(0, VideoTag(VideoCodec.AVC, FrameType.KEY, PacketKind.SEQUENCE_HEADER, b"\x01\x64\x00\x0d"))
    client.send_audio(0, AudioTag(AudioCodec.AAC, PacketKind.SEQUENCE_HEADER, b"\x12\x10"))
    for index in range(6):
        ts = (1 << 32) - 80 + 40 * index
        client.send_video(ts, VideoTag(VideoCodec.AVC, FrameType.INTER, PacketKind.FRAME, bytes(300 + index), 40))
        client.send_video(ts, VideoTag(VideoCodec.HEVC, FrameType.KEY, PacketKind.FRAME, bytes(5000), 80, True))
        client.send_audio(ts, AudioTag(AudioCodec.AAC, PacketKind.FRAME, bytes(200)))
    client.unpublish()
    pipe.pump()
    return bytes(pipe.client_to_server), bytes(pipe.server_to_client)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if b > a]


mutations = st.lists(
    st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(min_value=0), st.integers(0, 255)),
    min_size=1,
    max_size=8,
)


def mutate(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, value in edits:
        pos = where % (len(out) + 1)
        if kind == "insert":
            out[pos:pos] = bytes([value])
        elif kind == "set" and pos < len(out):
            out[pos] = value
        elif kind == "delete":
            del out[pos : pos + 1 + value % 16]
    return bytes(out)


def handshake_prefix_for_server() -> bytes:
    return b"\x03" + bytes(2 * HANDSHAKE_SIZE)


def handshake_prefix_for_client() -> bytes:
    return b"\x03" + bytes(2 * HANDSHAKE_SIZE)


@FAST
@given(st.binary(max_size=5000), st.lists(st.integers(min_value=0), max_size=6), st.booleans())
def test_random_bytes(data: bytes, cuts: list[int], after_handshake: bool) -> None:
    server_input = (handshake_prefix_for_server() if after_handshake else b"") + data
    client_input = (handshake_prefix_for_client() if after_handshake else b"") + data
    feed(RtmpServerConnection(max_message_size=MESSAGE_CAP), split(server_input, cuts))
    feed(new_client(), split(client_input, cuts))


@FAST
@given(mutations, st.lists(st.integers(min_value=0), max_size=10))
def test_mutated_session_to_the_server(edits: list[tuple[str, int, int]], cuts: list[int]) -> None:
    upstream, _ = recorded_session()
    feed(RtmpServerConnection(max_message_size=MESSAGE_CAP), split(mutate(upstream, edits), cuts))


@FAST
@given(mutations, st.lists(st.integers(min_value=0), max_size=10))
def test_mutated_session_to_the_client(edits: list[tuple[str, int, int]], cuts: list[int]) -> None:
    _, downstream = recorded_session()
    feed(new_client(), split(mutate(downstream, edits), cuts))


def test_unmutated_session_replays_cleanly() -> None:
    upstream, downstream = recorded_session()
    server = RtmpServerConnection()
    events = []
    for event in server.receive_data(upstream):
        events.append(type(event).__name__)
        if isinstance(event, PublishRequested):
            server.accept_publish(event.stream_id)
    assert events.count("VideoData") == 13 and events.count("AudioData") == 7 and events[-1] == "StreamEnded"
    new_client().receive_data(downstream)


@FAST
@given(st.binary(max_size=600))
def test_parsers_raise_only_protocol_errors(data: bytes) -> None:
    for parse in (parse_video_tag, parse_audio_tag, amf0.decode_all):
        try:
            parse(data)
        except ProtocolError:
            pass
    reader = ChunkReader(max_message_size=4096)
    try:
        reader.feed(data)
    except ProtocolError:
        pass
    assert reader.buffered_bytes <= 2 * 4096 + 18


@FAST
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=20,
    )
)
def test_amf0_round_trip(value: amf0.AmfValue) -> None:
    assert amf0.decode(amf0.encode(value))[0] == value


@FAST
@given(
    st.lists(
        st.tuples(st.integers(3, 400), st.integers(0, MESSAGE_CAP + 10), st.integers(0, 128), st.integers(0, 255)),
        max_size=200,
    )
)
def test_many_partial_messages_stay_within_the_caps(chunks: list[tuple[int, int, int, int]]) -> None:
    """Valid chunk headers that open messages on many chunk streams and never finish them."""
    data = bytearray(handshake_prefix_for_server())
    for cs_id, length, body, type_id in chunks:
        data += ChunkWriter().write(cs_id, type_id, 1, 0, bytes(length))[
            : len(encode_basic_header(0, cs_id)) + 11 + body
        ]
    feed(RtmpServerConnection(max_message_size=MESSAGE_CAP), split(bytes(data), [4096 * i for i in range(1, 400)]))
