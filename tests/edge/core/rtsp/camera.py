"""A scripted camera for RtspClient tests: parses what the client sends, answers with canned bytes."""

from __future__ import annotations

from services.edge.core.rtsp import (
    Described,
    InterleavedFrame,
    RtspClient,
    RtspEvent,
    RtspReader,
    RtspRequest,
    RtspResponse,
    Track,
)

URL = "rtsp://192.168.1.64:554/Streaming/Channels/101"

SDP = (
    "v=0\r\n"
    "o=- 1 1 IN IP4 192.168.1.64\r\n"
    "s=Media Presentation\r\n"
    "t=0 0\r\n"
    "a=control:*\r\n"
    "m=video 0 RTP/AVP 96\r\n"
    "a=rtpmap:96 H264/90000\r\n"
    "a=fmtp:96 packetization-mode=1;profile-level-id=640028;"
    "sprop-parameter-sets=Z2QAKKzZQHgCJ+WEAAADAAQAAAMAyDxgxlg=,aOvjyyLA\r\n"
    "a=control:trackID=1\r\n"
    "m=audio 0 RTP/AVP 97\r\n"
    "a=rtpmap:97 mpeg4-generic/48000/2\r\n"
    "a=fmtp:97 streamtype=5; profile-level-id=15; mode=AAC-hbr; config=1190; "
    "sizeLength=13; indexLength=3; indexDeltaLength=3;\r\n"
    "a=control:trackID=2\r\n"
)


def response(
    cseq: int | None,
    status: int = 200,
    reason: str = "OK",
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
) -> bytes:
    lines = [f"RTSP/1.0 {status} {reason}".rstrip()]
    if cseq is not None:
        lines.append(f"CSeq: {cseq}")
    lines += [f"{k}: {v}" for k, v in headers or []]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def frame(channel: int, data: bytes) -> bytes:
    return b"$" + bytes([channel]) + len(data).to_bytes(2, "big") + data


class Camera:
    """Reads the client's requests and feeds it answers."""

    def __init__(self, client: RtspClient) -> None:
        self.client = client
        self.reader = RtspReader()
        self.sent: list[RtspRequest | RtspResponse | InterleavedFrame] = []

    def take(self) -> list[RtspRequest | RtspResponse | InterleavedFrame]:
        """Everything the client queued since the last call."""
        messages = self.reader.feed(self.client.data_to_send())
        self.sent += messages
        return messages

    def requests(self) -> list[RtspRequest]:
        return [m for m in self.take() if isinstance(m, RtspRequest)]

    def request(self) -> RtspRequest:
        """The one request the client queued (asserts there is exactly one)."""
        requests = self.requests()
        assert len(requests) == 1, requests
        return requests[0]

    def answer(
        self,
        request: RtspRequest,
        status: int = 200,
        reason: str = "OK",
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
        *,
        before: bytes = b"",
        after: bytes = b"",
        bytewise: bool = False,
    ) -> list[RtspEvent]:
        data = before + response(request.cseq, status, reason, headers, body) + after
        if bytewise:
            return [e for i in range(len(data)) for e in self.client.receive_data(data[i : i + 1])]
        return self.client.receive_data(data)

    def describe(self, sdp: str = SDP, headers: list[tuple[str, str]] | None = None) -> Described:
        """Answer OPTIONS (Public with GET_PARAMETER) and DESCRIBE; return the Described event."""
        options = self.request()
        assert options.method == "OPTIONS"
        public = [("Public", "OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN, GET_PARAMETER")]
        assert self.answer(options, headers=public) == []
        describe = self.request()
        assert describe.method == "DESCRIBE"
        extra = headers if headers is not None else [("Content-Base", URL + "/"), ("Content-Type", "application/sdp")]
        (event,) = self.answer(describe, headers=extra, body=sdp.encode())
        assert isinstance(event, Described), event
        return event


def new_client(url: str = URL, **kwargs: object) -> tuple[RtspClient, Camera]:
    client = RtspClient(url, cnonce=lambda: "0a4f113b", **kwargs)  # type: ignore[arg-type]
    client.start()
    return client, Camera(client)


def video_audio(event: Described) -> list[Track]:
    return list(event.tracks)
