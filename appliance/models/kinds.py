"""The kind registry: what each input and output ``type`` is, declared once.

A kind's declaration is its config model (``appliance.models.config``) plus one
``KindInfo`` here: the stats label, the NMOS transport URN (interop.md 5), the event
category (interop.md 11), the CLI's URL scheme and query keys, the addresses it
listens on (for the clash check), and what it supports. Everything that used to list
the kinds by hand reads this table: validation and the 400 for an unsupported kind
(with the engine's driver registry, ``services.edge.engine.kinds``), the stats labels,
the error envelope's union tags, NMOS and the ``mp`` URL shorthands. The CLI imports
this module, so it holds no server code (the drivers live in the engine).

Adding a kind: its config model in ``config.py`` (and in the ``InputConfig`` /
``OutputConfig`` union), one ``KindInfo`` line below, and its driver module under
``services/edge/engine/kinds/`` with one line in that registry (docs/edge.md, "Adding a kind").
"""

from __future__ import annotations

import builtins
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from appliance.models.config import (
    FlowConfig,
    HlsOutput,
    RtmpInput,
    RtmpOutput,
    RtpInput,
    RtpOutput,
    RtspInput,
    SrtEndpoint,
    SrtInput,
    SrtOutput,
    UdpInput,
    UdpOutput,
    WebrtcInput,
    WebrtcOutput,
    WhepInput,
    split_host_port,
)
from appliance.models.events import EventCategory

NMOS_RTP: Final = "urn:x-nmos:transport:rtp"
NMOS_WEBSOCKET: Final = "urn:x-nmos:transport:websocket"
IS05_TRANSPORTS: Final = frozenset({NMOS_RTP, "urn:x-nmos:transport:dash", NMOS_WEBSOCKET, "urn:x-nmos:transport:mqtt"})
"""The transports IS-05 v1.1 can connect (its transporttype-response-schema enum)."""


def vendor_transport(kind: str) -> str:
    """The IS-04 transport URN of a kind NMOS has no transport for (``urn:x-mediaplane:...``).

    IS-04 v1.3 (sender.json) allows a URN outside ``urn:x-nmos:``. Raw UDP, SRT, RTMP, RTSP and
    HLS are not RTP: as ``urn:x-nmos:transport:rtp`` they would owe an RTP/AVP SDP and free
    destination addresses (AMWA IS-05-01 test_25, IS-05-02 test_07..11), so they carry their own
    URN and, IS-05 v1.1 knowing none of them, are announced through IS-04 only.
    """
    return f"urn:x-mediaplane:transport:{kind}"


FEC_COLUMN_PORT_OFFSET: Final = 2  # SMPTE 2022-1 §7: column FEC on media port + 2
FEC_ROW_PORT_OFFSET: Final = 4  # SMPTE 2022-1 §7: row FEC on media port + 4

# CLI query value kinds (cli/urls.py converts a query value to one of these).
Q_INT: Final = "int"
Q_FLOAT: Final = "float"
Q_BOOL: Final = "bool"
Q_STR: Final = "str"
Q_FEC: Final = "fec"
QueryKeys = Mapping[str, tuple[str, str]]
"""URL query key -> (config field, value kind)."""


# --------------------------------------------------------------------------- listening addresses


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """One socket address a kind binds to receive (or accept) on."""

    protocol: Literal["udp", "tcp"]
    host: str  # an IP literal, without brackets
    port: int
    role: str  # "input", "2022-7 leg", "column FEC", "row FEC", "SRT listener"...
    # A listener several flows may share (one socket, connections routed by what they ask for):
    # the listener's identity (``rtmp`` / ``rtmps``: one socket cannot speak both) and this
    # flow's route on it (``(app, stream_key)``, a None key taking any key). None: not shareable.
    share_group: str | None = None
    route: tuple[str, str | None] | None = None

    @property
    def multicast(self) -> bool:
        return ipaddress.ip_address(self.host).is_multicast

    @property
    def wildcard(self) -> bool:
        return ipaddress.ip_address(self.host).is_unspecified

    def clashes_with(self, other: ListenAddress) -> bool:
        """Whether two binds would take each other's datagrams or connections.

        Same protocol and port, and: the same host; or one side the wildcard of its family
        (``0.0.0.0`` takes every IPv4 address, ``::`` every address, dual-stack), unless
        both sides are multicast groups. Two sockets on one multicast group and port each
        get a copy of every datagram (``SO_REUSEADDR``, ip(7)), which is what multicast is
        for, so that is no clash; a wildcard unicast bind on the group's port would take
        the group's datagrams too, so that is one.
        """
        if self.protocol != other.protocol or self.port != other.port:
            return False
        if self.multicast and other.multicast:
            return False
        if self.host == other.host:
            if self.share_group is not None and self.share_group == other.share_group:
                return self._routes_overlap(other)  # one shared listener: only the routes must differ
            return True
        mine, theirs = ipaddress.ip_address(self.host), ipaddress.ip_address(other.host)
        for wild, addr in ((mine, theirs), (theirs, mine)):
            if wild.is_unspecified and (wild.version == 6 or wild.version == addr.version):
                return True
        return False

    def _routes_overlap(self, other: ListenAddress) -> bool:
        """Whether a connection could match both routes: the same app, and the same key or
        either key None (any key)."""
        if self.route is None or other.route is None:
            return True
        (app, key), (other_app, other_key) = self.route, other.route
        return app == other_app and (key is None or other_key is None or key == other_key)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.protocol} {host}:{self.port}"


def _addr(text: str, role: str, protocol: Literal["udp", "tcp"] = "udp") -> ListenAddress:
    host, port = split_host_port(text)
    return ListenAddress(protocol, host, port, role)


def _rtp_input_addresses(config: Any) -> list[ListenAddress]:
    assert isinstance(config, RtpInput)
    found = [_addr(config.bind_addr, "input")]
    if config.redundancy is not None:
        found.append(_addr(config.redundancy.bind_addr, "2022-7 leg"))
    if config.fec_decode is not None:
        main = found[0]
        for offset, role in ((FEC_COLUMN_PORT_OFFSET, "column FEC"), (FEC_ROW_PORT_OFFSET, "row FEC")):
            if main.port + offset <= 65535:
                found.append(ListenAddress("udp", main.host, main.port + offset, role))
    return found


def _udp_input_addresses(config: Any) -> list[ListenAddress]:
    assert isinstance(config, UdpInput)
    return [_addr(config.bind_addr, "input")]


def _srt_addresses(config: Any) -> list[ListenAddress]:
    """A listener or rendezvous leg binds ``local_addr``; a caller binds it only when a port is named."""
    assert isinstance(config, SrtEndpoint)
    legs = [config] if config.redundancy is None else [config, config.redundancy]
    found = []
    for index, leg in enumerate(legs):
        address = _addr(leg.local_addr, "SRT" if index == 0 else "SRT second leg")
        if address.port != 0:
            found.append(address)
    return found


def _rtmp_listener(config: Any) -> list[ListenAddress]:
    """An RTMP(S) input's listener: flows on the same ``listen_addr`` share one socket (interop
    2.3) when they speak the same protocol and their ``(app, stream_key)`` routes cannot both
    match a publisher."""
    assert isinstance(config, RtmpInput)
    host, port = split_host_port(config.listen_addr)
    group = "rtmps" if config.tls else "rtmp"
    return [ListenAddress("tcp", host, port, "RTMP listener", group, (config.app, config.stream_key))]


def _bound_output_addresses(config: Any) -> list[ListenAddress]:
    """An RTP/UDP output bound to a fixed local port holds it (port 0 is ephemeral)."""
    found = []
    legs = [config, *([config.redundancy] if getattr(config, "redundancy", None) is not None else [])]
    for leg in legs:
        if leg.bind_addr is not None:
            address = _addr(leg.bind_addr, "output bind")
            if address.port != 0:
                found.append(address)
    return found


def _nothing(config: Any) -> list[ListenAddress]:
    return []


# --------------------------------------------------------------------------- the registry


_SRT_QUERY: Final[QueryKeys] = {
    "mode": ("mode", Q_STR),
    "latency": ("latency_ms", Q_INT),
    "latency_ms": ("latency_ms", Q_INT),
    "rcvlatency": ("recv_latency_ms", Q_INT),
    "recv_latency_ms": ("recv_latency_ms", Q_INT),
    "peerlatency": ("peer_latency_ms", Q_INT),
    "peer_latency_ms": ("peer_latency_ms", Q_INT),
    "passphrase": ("passphrase", Q_STR),
    "pbkeylen": ("aes_key_len", Q_INT),
    "aes_key_len": ("aes_key_len", Q_INT),
    "crypto_mode": ("crypto_mode", Q_STR),
    "streamid": ("stream_id", Q_STR),
    "stream_id": ("stream_id", Q_STR),
    "packet_filter": ("packet_filter", Q_STR),
    "local_addr": ("local_addr", Q_STR),
    "peer_idle_timeout_secs": ("peer_idle_timeout_secs", Q_INT),
    "connect_timeout_secs": ("connect_timeout_secs", Q_INT),
    "payload_size": ("payload_size", Q_INT),
    "maxbw": ("max_bw", Q_INT),
    "max_bw": ("max_bw", Q_INT),
    "enforced_encryption": ("enforced_encryption", Q_BOOL),
}
_UDP_OUTPUT_QUERY: Final[QueryKeys] = {
    "name": ("name", Q_STR),
    "bind_addr": ("bind_addr", Q_STR),
    "interface_addr": ("interface_addr", Q_STR),
    "dscp": ("dscp", Q_INT),
}


@dataclass(frozen=True)
class KindInfo:
    """One input or output kind, declared once (see the module docstring)."""

    type: str
    direction: Literal["input", "output"]
    model: builtins.type[Any]
    description: str
    label: str  # ``input_type`` / ``output_type`` in the stats (interop.md 11)
    nmos_transport: str  # interop.md 5
    event_category: EventCategory  # interop.md 11
    listen_addresses: Callable[[Any], list[ListenAddress]] = _nothing
    url_scheme: str | None = None  # ``mp flow create --input rtp://...`` (None: no shorthand)
    url_query: QueryKeys = field(default_factory=dict)
    url_tls_scheme: str | None = None  # the same kind over TLS (``rtmps://``: ``tls`` on an input)
    fec: bool = False  # SMPTE 2022-1 FEC (decode on an input, encode on an output)
    redundancy: bool = False  # a second leg (2022-7 for RTP, a second connection for SRT)
    hot_add: bool = True  # an output of this kind can be added to a running flow


INPUT_KINDS: Final[dict[str, KindInfo]] = {
    kind.type: kind
    for kind in (
        KindInfo(
            "rtp",
            "input",
            RtpInput,
            "RTP/UDP carrying MPEG-TS (unicast or multicast)",
            "rtp",
            NMOS_RTP,
            EventCategory.FLOW,
            _rtp_input_addresses,
            "rtp",
            {
                "interface_addr": ("interface_addr", Q_STR),
                "fec": ("fec_decode", Q_FEC),
                "fec_decode": ("fec_decode", Q_FEC),
                "tr07_mode": ("tr07_mode", Q_BOOL),
                "max_bitrate_mbps": ("max_bitrate_mbps", Q_FLOAT),
            },
            fec=True,
            redundancy=True,
        ),
        KindInfo(
            "udp",
            "input",
            UdpInput,
            "raw MPEG-TS over UDP",
            "udp",
            vendor_transport("udp"),
            EventCategory.FLOW,
            _udp_input_addresses,
            "udp",
            {"interface_addr": ("interface_addr", Q_STR)},
        ),
        KindInfo(
            "srt",
            "input",
            SrtInput,
            "SRT",
            "srt",
            vendor_transport("srt"),
            EventCategory.SRT,
            _srt_addresses,
            "srt",
            _SRT_QUERY,
            redundancy=True,
        ),
        KindInfo(
            "rtmp",
            "input",
            RtmpInput,
            "RTMP(S) publish",
            "rtmp",
            vendor_transport("rtmp"),
            EventCategory.RTMP,
            _rtmp_listener,
            "rtmp",
            {"max_publishers": ("max_publishers", Q_INT)},
            url_tls_scheme="rtmps",
        ),
        KindInfo(
            "rtsp",
            "input",
            RtspInput,
            "RTSP camera pull",
            "rtsp",
            vendor_transport("rtsp"),
            EventCategory.RTSP,
            url_scheme="rtsp",
            url_query={
                "transport": ("transport", Q_STR),
                "timeout_secs": ("timeout_secs", Q_INT),
                "reconnect_delay_secs": ("reconnect_delay_secs", Q_INT),
            },
            url_tls_scheme="rtsps",
        ),
        KindInfo("webrtc", "input", WebrtcInput, "WHIP server", "webrtc", NMOS_WEBSOCKET, EventCategory.WEBRTC),
        KindInfo("whep", "input", WhepInput, "WHEP client", "whep", NMOS_WEBSOCKET, EventCategory.WEBRTC),
    )
}

OUTPUT_KINDS: Final[dict[str, KindInfo]] = {
    kind.type: kind
    for kind in (
        KindInfo(
            "rtp",
            "output",
            RtpOutput,
            "RTP/UDP (RTP made for a raw-TS input)",
            "udp",
            NMOS_RTP,
            EventCategory.FLOW,
            _bound_output_addresses,
            "rtp",
            {**_UDP_OUTPUT_QUERY, "fec": ("fec_encode", Q_FEC), "fec_encode": ("fec_encode", Q_FEC)},
            fec=True,
            redundancy=True,
        ),
        KindInfo(
            "udp",
            "output",
            UdpOutput,
            "raw MPEG-TS over UDP, 1316-byte datagrams",
            "udp",
            vendor_transport("udp"),
            EventCategory.FLOW,
            _bound_output_addresses,
            "udp",
            _UDP_OUTPUT_QUERY,
        ),
        KindInfo(
            "srt",
            "output",
            SrtOutput,
            "SRT (caller, listener with viewers, rendezvous)",
            "srt",
            vendor_transport("srt"),
            EventCategory.SRT,
            _srt_addresses,
            "srt",
            {**_SRT_QUERY, "name": ("name", Q_STR)},
            redundancy=True,
        ),
        KindInfo(
            "rtmp",
            "output",
            RtmpOutput,
            "RTMP(S) push",
            "rtmp",
            vendor_transport("rtmp"),
            EventCategory.RTMP,
            url_scheme="rtmp",
            url_query={
                "reconnect_delay_secs": ("reconnect_delay_secs", Q_INT),
                "max_reconnect_attempts": ("max_reconnect_attempts", Q_INT),
                "name": ("name", Q_STR),
            },
            url_tls_scheme="rtmps",
        ),
        KindInfo("hls", "output", HlsOutput, "HLS upload", "hls", vendor_transport("hls"), EventCategory.HLS),
        KindInfo(
            "webrtc",
            "output",
            WebrtcOutput,
            "WHIP client / WHEP server",
            "webrtc",
            NMOS_WEBSOCKET,
            EventCategory.WEBRTC,
        ),
    )
}

UNION_TAGS: Final = frozenset(INPUT_KINDS) | frozenset(OUTPUT_KINDS)
"""The discriminator values pydantic puts into an error location (``input.rtp.bind_addr``)."""


def input_kind(type_: str) -> KindInfo:
    """The input kind of ``type_`` (KeyError for a type no model declares)."""
    return INPUT_KINDS[type_]


def output_kind(type_: str) -> KindInfo:
    """The output kind of ``type_``."""
    return OUTPUT_KINDS[type_]


def output_type_label(type_: str) -> str:
    """``output_type`` in the stats: rtp and udp outputs both report ``udp`` (interop.md 11)."""
    kind = OUTPUT_KINDS.get(type_)
    return kind.label if kind is not None else type_


# --------------------------------------------------------------------------- the clash check


@dataclass(frozen=True, slots=True)
class Clash:
    """``flow_id``'s ``address`` is already held by ``owner`` (a flow id)."""

    flow_id: str
    address: ListenAddress
    owner: str
    owner_address: ListenAddress

    def message(self) -> str:
        """User-facing: names the flow that holds the address, never echoes the refused value."""
        return (
            f"the {self.address.role} address is already used by flow '{self.owner}' "
            f"({self.owner_address.role}); each flow needs its own listening addresses (multicast groups excepted)"
        )


def flow_addresses(flow: FlowConfig) -> list[ListenAddress]:
    """Every address ``flow`` listens on: its input's and its outputs'."""
    found = list(INPUT_KINDS[flow.input.type].listen_addresses(flow.input))
    for output in flow.outputs:
        for address in OUTPUT_KINDS[output.type].listen_addresses(output):
            found.append(ListenAddress(address.protocol, address.host, address.port, f"output '{output.id}'"))
    return found


def find_clash(flows: Iterable[FlowConfig], changed: Iterable[str] | None = None) -> Clash | None:
    """The first pair of configured flows (or two legs of one flow) that would bind over each other.

    Every configured flow counts, enabled or not: a disabled flow binds when started.
    ``changed`` (flow ids) names the flows being created or replaced: a clash is reported
    from their side, so the message names the flow that already held the address.
    Work is per port (a dict), not per pair, so a 1,024-flow config is checked in
    milliseconds.
    """
    flows = list(flows)
    changed_ids = set(changed) if changed is not None else set()
    # Unchanged flows first: they are the owners of what they hold.
    ordered = sorted(flows, key=lambda f: f.id in changed_ids)
    held: dict[tuple[str, int], list[tuple[str, ListenAddress]]] = {}
    for flow in ordered:
        mine: list[ListenAddress] = []
        for address in flow_addresses(flow):
            key = (address.protocol, address.port)
            for owner, other in held.get(key, ()):
                if address.clashes_with(other):
                    return Clash(flow.id, address, owner, other)
            for other in mine:
                if address.port == other.port and address.clashes_with(other):
                    return Clash(flow.id, address, flow.id, other)
            mine.append(address)
        for address in mine:
            held.setdefault((address.protocol, address.port), []).append((flow.id, address))
    return None
