"""In-memory byte pipes between an RtmpClientConnection and an RtmpServerConnection (no sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.edge.core.rtmp import (
    Event,
    PublishRequested,
    RtmpClientConnection,
    RtmpServerConnection,
)


@dataclass
class Pipe:
    """Shuttles bytes both ways until neither side has anything to send (bounded by ``max_rounds``).

    Every byte that crossed is kept (``client_to_server``/``server_to_client``) for replays and fuzzing.
    """

    client: RtmpClientConnection
    server: RtmpServerConnection
    accept: bool = True  # answer PublishRequested with accept_publish (else leave it to the test)
    client_events: list[Event] = field(default_factory=list)
    server_events: list[Event] = field(default_factory=list)
    client_to_server: bytearray = field(default_factory=bytearray)
    server_to_client: bytearray = field(default_factory=bytearray)

    def pump(self, max_rounds: int = 50) -> None:
        for _ in range(max_rounds):
            upstream = self.client.data_to_send()
            downstream = self.server.data_to_send()
            if not upstream and not downstream:
                return
            if upstream:
                self.client_to_server += upstream
                for event in self.server.receive_data(upstream):
                    self.server_events.append(event)
                    if self.accept and isinstance(event, PublishRequested):
                        self.server.accept_publish(event.stream_id)
            if downstream:
                self.server_to_client += downstream
                self.client_events.extend(self.client.receive_data(downstream))
        raise AssertionError("the connections kept talking past max_rounds")

    def take_server_events(self) -> list[Event]:
        events, self.server_events = self.server_events, []
        return events

    def take_client_events(self) -> list[Event]:
        events, self.client_events = self.client_events, []
        return events


def publishing_pair(
    stream_key: str = "key", fourcc_list: tuple[str, ...] = (), **server_options: int
) -> tuple[Pipe, list[Event], list[Event]]:
    """A client publishing ``stream_key`` to app ``live``, accepted; answers the pipe and the setup events."""
    client = RtmpClientConnection(app="live", tc_url="rtmp://127.0.0.1/live", fourcc_list=fourcc_list)
    server = RtmpServerConnection(**server_options)
    pipe = Pipe(client, server)
    client.publish(stream_key)
    pipe.pump()
    return pipe, pipe.take_client_events(), pipe.take_server_events()
