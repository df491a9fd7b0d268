"""The edge application configuration: one pydantic model per concept.

These classes validate ``config.json``, every request body that carries a flow,
an output or a whole configuration, what ``mp flow create -f`` checks locally,
and the manager's relayed commands. Field names, defaults and ranges follow
``shared/docs/interop.md`` section 2. Unknown keys are errors (``extra="forbid"``).

Infrastructure secrets (``server.auth``, ``server.tls``, the manager's node
secret and registration token, tunnel keys) are ``SecretStr`` so that a stray
``repr`` or log line shows ``**********``; only the secrets-file writer reveals
them. Flow parameters such as an SRT passphrase are user parameters, plain
strings, and are returned by ``GET /api/v1/config`` (interop.md 2.7).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
import uuid
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_HEX64_RE = re.compile(r"^[0-9a-fA-F]{64}$")


# --------------------------------------------------------------------------- addresses


def split_host_port(text: str, *, allow_port0: bool = True) -> tuple[str, int]:
    """Split ``<ip>:<port>`` or ``[<ipv6>]:<port>`` into host and port.

    Raises ValueError with a message that names the expected form; the port range
    named is 1-65535 when ``allow_port0`` is false, else 0-65535.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("expected <ip>:<port>")
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError("expected [<ipv6>]:<port>")
        host, port_text = text[1:end], text[end + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError("expected <ip>:<port>")
        if ":" in host:
            raise ValueError("an IPv6 address must be written in brackets: [<ipv6>]:<port>")
    if not port_text.isdigit():
        raise ValueError("the port must be a number")
    port = int(port_text)
    lowest = 0 if allow_port0 else 1
    if not lowest <= port <= 65535:
        raise ValueError(f"the port must be {lowest}-65535")
    return host, port


def _check_ip(text: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise ValueError("expected an IP address literal") from None
    return text


def _socket_addr(allow_port0: bool, allow_hostname: bool = False) -> Any:
    def check(text: str) -> str:
        host, _ = split_host_port(text, allow_port0=allow_port0)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not allow_hostname or not _HOSTNAME_RE.match(host):
                raise ValueError("expected an IP address literal and a port") from None
        return text

    return AfterValidator(check)


IpAddr = Annotated[str, AfterValidator(_check_ip)]
SocketAddr = Annotated[str, Field(max_length=300), _socket_addr(allow_port0=False)]
"""``<ip>:<port>`` with a port of 1-65535."""
BindAddr = Annotated[str, Field(max_length=300), _socket_addr(allow_port0=True)]
"""``<ip>:<port>`` where port 0 (ephemeral) is allowed (an output's ``bind_addr``)."""
HostPort = Annotated[str, Field(max_length=300), _socket_addr(allow_port0=False, allow_hostname=True)]
"""``<host>:<port>``; a hostname is allowed (``relay_addr``, ``peer_addr``)."""


def _not_only_dots(text: str) -> str:
    # "." and ".." are path segments: a client that normalises the URL acts on another resource.
    if not text.strip("."):
        raise ValueError("must not be made of dots only")
    return text


FlowId = Annotated[
    str,
    Field(pattern=ID_PATTERN, description="1-64 chars of [A-Za-z0-9_.-], not only dots."),
    AfterValidator(_not_only_dots),
]
Label = Annotated[str, Field(min_length=1, max_length=256)]
UserSecret = Annotated[str, Field(max_length=4096)]


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


def _url(*schemes: str) -> Any:
    def check(text: str) -> str:
        if not any(text.startswith(f"{s}://") for s in schemes):
            raise ValueError("the URL must start with " + " or ".join(f"{s}://" for s in schemes))
        return text

    return AfterValidator(check)


class StrictModel(BaseModel):
    """Base for every config model: unknown keys are rejected, and types are not coerced.

    Strict mode: a JSON string or a bool is refused where an int is wanted (``"46"``,
    ``true``), a string or a number where a bool is wanted; an int still fills a float
    field (not a bool). UUID fields say ``strict=False`` so that their JSON strings parse.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True)


class FecParams(StrictModel):
    """SMPTE ST 2022-1 matrix: L columns and D rows (interop.md 2.2, 12)."""

    columns: int = Field(ge=1, le=20, description="L, 1-20.")
    rows: int = Field(ge=4, le=20, description="D, 4-20.")


# --------------------------------------------------------------------------- SRT field set


class SrtLeg(StrictModel):
    """The SRT field set of interop.md 2.4 (one connection)."""

    mode: Literal["caller", "listener", "rendezvous"]
    local_addr: BindAddr
    remote_addr: HostPort | None = None
    latency_ms: int = Field(default=120, ge=0, le=60000)
    recv_latency_ms: int | None = Field(default=None, ge=0, le=60000)
    peer_latency_ms: int | None = Field(default=None, ge=0, le=60000)
    peer_idle_timeout_secs: int = Field(default=30, ge=1, le=3600)
    passphrase: str | None = Field(default=None, min_length=10, max_length=79)
    aes_key_len: Literal[16, 24, 32] | None = None
    crypto_mode: Literal["aes-ctr", "aes-gcm"] = "aes-ctr"
    stream_id: str | None = Field(default=None, max_length=512)
    packet_filter: str | None = Field(default=None, max_length=512)
    max_rexmit_bw: int | None = Field(default=None, ge=-1)
    max_bw: int | None = Field(default=None, ge=-1)
    input_bw: int | None = Field(default=None, ge=0)
    overhead_bw: int | None = Field(default=None, ge=5, le=100)
    enforced_encryption: bool | None = None
    tlpkt_drop: bool | None = None
    connect_timeout_secs: int | None = Field(default=None, ge=1, le=300)
    flight_flag_size: int | None = Field(default=None, ge=32)
    send_buffer_size: int | None = Field(default=None, ge=32)
    recv_buffer_size: int | None = Field(default=None, ge=32)
    ip_tos: int | None = Field(default=None, ge=0, le=255)
    ip_ttl: int | None = Field(default=None, ge=1, le=255)
    retransmit_algo: Literal["default", "reduced"] | None = None
    send_drop_delay: int | None = Field(default=None, ge=-1)
    loss_max_ttl: int | None = Field(default=None, ge=0)
    km_refresh_rate: int | None = Field(default=None, gt=0)
    km_pre_announce: int | None = Field(default=None, gt=0)
    payload_size: int | None = Field(default=None, ge=188, le=1456)
    mss: int | None = Field(default=None, ge=76, le=1500)

    @field_validator("packet_filter")
    @classmethod
    def _check_packet_filter(cls, value: str | None) -> str | None:
        if value is None:
            return value
        for part in value.split(","):
            key, _, number = part.partition(":")
            if key in ("cols", "rows"):
                if not number.lstrip("-").isdigit() or not 1 <= int(number) <= 256:
                    raise ValueError(f"packet_filter {key} must be 1-256")
        return value

    @model_validator(mode="after")
    def _check_leg(self) -> SrtLeg:
        if self.mode in ("caller", "rendezvous") and self.remote_addr is None:
            raise ValueError(f"remote_addr is required in {self.mode} mode")
        if self.mode != "caller" and split_host_port(self.local_addr)[1] == 0:
            raise ValueError("local_addr port 0 is allowed only in caller mode")
        if self.crypto_mode == "aes-gcm" and self.aes_key_len == 24:
            raise ValueError("aes-gcm does not take aes_key_len 24")
        return self

    @property
    def effective_key_len(self) -> int | None:
        """The AES key length in bytes: 16 when a passphrase is set and none is named."""
        if self.passphrase is None:
            return None
        return self.aes_key_len or 16


class SrtEndpoint(SrtLeg):
    """An SRT input or output: one leg, plus an optional redundant second leg."""

    redundancy: SrtLeg | None = None


# --------------------------------------------------------------------------- inputs


class RtpInputLeg(StrictModel):
    """The SMPTE 2022-7 second leg of an RTP input."""

    bind_addr: SocketAddr
    interface_addr: IpAddr | None = None


class RtpInput(StrictModel):
    """RTP/UDP input. A multicast ``bind_addr`` joins the group on ``interface_addr``."""

    type: Literal["rtp"] = "rtp"
    bind_addr: SocketAddr
    interface_addr: IpAddr | None = None
    fec_decode: FecParams | None = None
    tr07_mode: bool = False
    allowed_sources: list[IpAddr] | None = Field(default=None, max_length=64)
    allowed_payload_types: list[Annotated[int, Field(ge=0, le=127)]] | None = Field(default=None, max_length=128)
    max_bitrate_mbps: float | None = Field(default=None, gt=0, le=10000)
    redundancy: RtpInputLeg | None = None


class UdpInput(StrictModel):
    """Raw MPEG-TS over UDP, no RTP header."""

    type: Literal["udp"] = "udp"
    bind_addr: SocketAddr
    interface_addr: IpAddr | None = None


class SrtInput(SrtEndpoint):
    """SRT input (interop.md 2.4)."""

    type: Literal["srt"] = "srt"


class RtmpInput(StrictModel):
    type: Literal["rtmp"] = "rtmp"
    listen_addr: SocketAddr
    app: str = Field(default="live", min_length=1, max_length=256)
    stream_key: UserSecret | None = None
    max_publishers: int = Field(default=1, ge=1, le=16)
    tls: bool = False  # RTMPS only, with the edge's certificate (interop 2.3)


class RtspInput(StrictModel):
    type: Literal["rtsp"] = "rtsp"
    rtsp_url: Annotated[str, Field(max_length=2048), _url("rtsp", "rtsps")]
    username: UserSecret | None = None
    password: UserSecret | None = None
    transport: Literal["tcp", "udp"] = "tcp"
    timeout_secs: int = Field(default=10, ge=1, le=300)
    reconnect_delay_secs: int = Field(default=5, ge=1, le=3600)


def _check_stun(text: str) -> str:
    if not text.startswith("stun:"):
        raise ValueError("expected stun:<host>:<port>")
    host, _, port = text[len("stun:") :].rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("expected stun:<host>:<port>")
    return text


class WebrtcInput(StrictModel):
    """WHIP server input."""

    type: Literal["webrtc"] = "webrtc"
    bearer_token: UserSecret | None = None
    video_only: bool = False
    public_ip: IpAddr | None = None
    stun_server: Annotated[str, Field(max_length=2048), AfterValidator(_check_stun)] | None = None


class WhepInput(StrictModel):
    """WHEP client input."""

    type: Literal["whep"] = "whep"
    whep_url: Annotated[str, Field(max_length=2048), _url("http", "https")]
    bearer_token: UserSecret | None = None
    video_only: bool = False


InputConfig = Annotated[
    RtpInput | UdpInput | SrtInput | RtmpInput | RtspInput | WebrtcInput | WhepInput,
    Field(discriminator="type"),
]


# --------------------------------------------------------------------------- outputs


class OutputBase(StrictModel):
    id: FlowId
    name: Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_not_blank)]


class RtpOutputLeg(StrictModel):
    """The SMPTE 2022-7 second destination of an RTP output."""

    dest_addr: SocketAddr
    bind_addr: BindAddr | None = None
    interface_addr: IpAddr | None = None
    dscp: int | None = Field(default=None, ge=0, le=63)


class RtpOutput(OutputBase):
    """RTP/UDP output: the RTP packets are forwarded (or made, for a raw TS input)."""

    type: Literal["rtp"] = "rtp"
    dest_addr: SocketAddr
    bind_addr: BindAddr | None = None
    interface_addr: IpAddr | None = None
    fec_encode: FecParams | None = None
    dscp: int = Field(default=46, ge=0, le=63)
    redundancy: RtpOutputLeg | None = None


class UdpOutput(OutputBase):
    """Raw TS over UDP: RTP stripped, TS re-packed into 7 x 188 = 1316-byte datagrams."""

    type: Literal["udp"] = "udp"
    dest_addr: SocketAddr
    bind_addr: BindAddr | None = None
    interface_addr: IpAddr | None = None
    dscp: int = Field(default=46, ge=0, le=63)


class SrtOutput(OutputBase, SrtEndpoint):
    type: Literal["srt"] = "srt"


class RtmpOutput(OutputBase):
    type: Literal["rtmp"] = "rtmp"
    dest_url: Annotated[str, Field(max_length=2048), _url("rtmp", "rtmps")]
    stream_key: UserSecret
    reconnect_delay_secs: int = Field(default=5, ge=1, le=3600)
    max_reconnect_attempts: int | None = Field(default=None, ge=0)


class HlsOutput(OutputBase):
    type: Literal["hls"] = "hls"
    ingest_url: Annotated[str, Field(max_length=2048), _url("http", "https")]
    segment_duration_secs: float = Field(default=2.0, ge=0.5, le=10)
    auth_token: UserSecret | None = None
    max_segments: int = Field(default=5, ge=1, le=100)


class WebrtcOutput(OutputBase):
    type: Literal["webrtc"] = "webrtc"
    mode: Literal["whip_client", "whep_server"] = "whip_client"
    whip_url: Annotated[str, Field(max_length=2048), _url("http", "https")] | None = None
    bearer_token: UserSecret | None = None
    max_viewers: int | None = Field(default=None, ge=1)
    public_ip: IpAddr | None = None
    video_only: bool = False

    @model_validator(mode="after")
    def _whip_url_needed(self) -> WebrtcOutput:
        if self.mode == "whip_client" and self.whip_url is None:
            raise ValueError("whip_url is required in whip_client mode")
        return self


OutputConfig = Annotated[
    RtpOutput | UdpOutput | SrtOutput | RtmpOutput | HlsOutput | WebrtcOutput,
    Field(discriminator="type"),
]


# --------------------------------------------------------------------------- flows


class FlowConfig(StrictModel):
    """One flow: one input fanned out to outputs (interop.md 2.2)."""

    id: FlowId
    name: Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_not_blank)]
    enabled: bool = True
    media_analysis: bool = True
    input: InputConfig
    outputs: list[OutputConfig] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _unique_output_ids(self) -> FlowConfig:
        seen: set[str] = set()
        for output in self.outputs:
            if output.id in seen:
                raise ValueError(f"duplicate output id {output.id!r}")
            seen.add(output.id)
        return self

    def output(self, output_id: str) -> OutputConfig | None:
        """The output with this id, or None."""
        return next((o for o in self.outputs if o.id == output_id), None)


# --------------------------------------------------------------------------- server, manager, tunnels


class AuthClient(StrictModel):
    client_id: Annotated[str, Field(pattern=ID_PATTERN), AfterValidator(_not_only_dots)]
    client_secret: SecretStr = Field(min_length=16, max_length=256)
    role: Literal["admin", "monitor"]


class ServerAuth(StrictModel):
    """``server.auth`` (interop.md 2.1). The whole object is an infrastructure secret."""

    enabled: bool = False
    jwt_secret: SecretStr | None = Field(default=None, min_length=32, max_length=256)
    token_lifetime_secs: int = Field(default=3600, ge=60, le=86400)
    clients: list[AuthClient] = Field(default_factory=list, max_length=256)
    public_metrics: bool = True
    token_rate_limit_per_minute: int = Field(default=10, ge=0, le=100000)

    @model_validator(mode="after")
    def _unique_clients(self) -> ServerAuth:
        ids = [c.client_id for c in self.clients]
        if len(ids) != len(set(ids)):
            raise ValueError("client_id values must be unique")
        return self

    def client(self, client_id: str) -> AuthClient | None:
        return next((c for c in self.clients if c.client_id == client_id), None)


class TlsConfig(StrictModel):
    cert_path: str = Field(min_length=1, max_length=4096)
    key_path: str = Field(min_length=1, max_length=4096)


class ServerConfig(StrictModel):
    listen_addr: IpAddr = "0.0.0.0"
    listen_port: int = Field(default=8080, ge=1, le=65535)
    tls: TlsConfig | None = None
    auth: ServerAuth | None = None


class MonitorConfig(StrictModel):
    listen_addr: IpAddr = "0.0.0.0"
    listen_port: int = Field(default=9090, ge=1, le=65535)


def _check_registry_url(text: str) -> str:
    if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", text):
        raise ValueError("expected an http:// or https:// URL")
    return text


class NmosConfig(StrictModel):
    """NMOS registration (issue 17). The Node and Connection APIs are served whatever this says;
    ``enabled`` turns registration (or, without a registry, the ``_nmos-node._tcp`` advertisement)
    on. ``registry_url``: a Registration API base (``http://host:port``) used before any found by
    DNS-SD. ``label``: the node's label (default: ``device_name``, else the hostname)."""

    enabled: bool = True
    registry_url: Annotated[str, AfterValidator(_check_registry_url)] | None = Field(default=None, max_length=2048)
    label: str | None = Field(default=None, min_length=1, max_length=256)


def _check_fingerprint(text: str) -> str:
    if not re.fullmatch(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){31}", text):
        raise ValueError("expected SHA-256 as 32 colon-separated hex pairs")
    return text


def _check_wss(text: str) -> str:
    if not text.startswith("wss://"):
        raise ValueError("TLS is required: the manager URL must start with wss://")
    return text


def _check_url_characters(text: str) -> str:
    if any(char.isspace() or unicodedata.category(char) == "Cc" for char in text):
        raise ValueError("the manager URL must not contain whitespace or control characters")
    return text


ManagerUrl = Annotated[str, Field(max_length=2048), AfterValidator(_check_wss), AfterValidator(_check_url_characters)]


class ManagerConfig(StrictModel):
    enabled: bool = False
    url: ManagerUrl | None = None
    accept_self_signed_cert: bool = False
    cert_fingerprint: Annotated[str, AfterValidator(_check_fingerprint)] | None = None
    registration_token: SecretStr | None = Field(default=None, max_length=4096)
    node_id: uuid.UUID | None = Field(default=None, strict=False)
    node_secret: SecretStr | None = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _url_when_enabled(self) -> ManagerConfig:
        if self.enabled and self.url is None:
            raise ValueError("url is required when the manager link is enabled")
        return self


def _check_hex64(value: SecretStr | None) -> SecretStr | None:
    if value is not None and not _HEX64_RE.match(value.get_secret_value()):
        raise ValueError("expected 64 hex characters")
    return value


Hex64Secret = Annotated[SecretStr, AfterValidator(_check_hex64)]


class TunnelConfig(StrictModel):
    """An IP tunnel (interop.md 2.6)."""

    id: uuid.UUID = Field(strict=False)
    name: Label
    enabled: bool = True
    protocol: Literal["tcp", "udp"]
    mode: Literal["relay", "direct"]
    direction: Literal["egress", "ingress"]
    local_addr: SocketAddr
    transport: Literal["quic", "udp"] = "quic"
    relay_addr: HostPort | None = None
    tunnel_encryption_key: Hex64Secret | None = None
    tunnel_bind_secret: Hex64Secret | None = None
    peer_addr: HostPort | None = None
    direct_listen_addr: SocketAddr | None = None
    tunnel_psk: SecretStr | None = Field(default=None, min_length=1, max_length=4096)
    tls_cert_pem: SecretStr | None = Field(default=None, max_length=65536)
    tls_key_pem: SecretStr | None = Field(default=None, max_length=65536)

    @model_validator(mode="after")
    def _check_mode(self) -> TunnelConfig:
        if self.id.version != 4 or self.id.int == 0:
            raise ValueError("tunnel id must be a UUIDv4")
        if self.mode == "relay":
            if self.relay_addr is None:
                raise ValueError("relay_addr is required in relay mode")
            if self.tunnel_encryption_key is None:
                raise ValueError("tunnel_encryption_key is required in relay mode")
        else:
            if self.tunnel_psk is None:
                raise ValueError("tunnel_psk is required in direct mode")
        if self.transport == "udp" and (self.protocol != "udp" or self.mode != "relay"):
            raise ValueError("transport udp needs protocol udp and mode relay")
        return self


TUNNEL_SECRET_FIELDS = ("tunnel_encryption_key", "tunnel_bind_secret", "tunnel_psk", "tls_cert_pem", "tls_key_pem")


class AppConfig(StrictModel):
    """The whole edge configuration, secrets merged in (interop.md 2)."""

    version: Literal[1] = 1
    node_id: uuid.UUID | None = Field(default=None, strict=False)
    device_name: str | None = Field(default=None, max_length=256)
    setup_enabled: bool = True
    server: ServerConfig
    monitor: MonitorConfig | None = None
    manager: ManagerConfig | None = None
    nmos: NmosConfig | None = None
    flows: list[FlowConfig] = Field(default_factory=list, max_length=1024)
    tunnels: list[TunnelConfig] = Field(default_factory=list, max_length=1024)

    @field_validator("node_id")
    @classmethod
    def _node_id_version(cls, value: uuid.UUID | None) -> uuid.UUID | None:
        if value is not None and value.version not in (1, 2, 3, 4, 5):
            raise ValueError("node_id must be a v1-v5 UUID")
        return value

    @model_validator(mode="after")
    def _unique_ids(self) -> AppConfig:
        flow_ids = [f.id for f in self.flows]
        duplicates = sorted({i for i in flow_ids if flow_ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate flow id {duplicates[0]!r}")
        tunnel_ids = [t.id for t in self.tunnels]
        if len(tunnel_ids) != len(set(tunnel_ids)):
            raise ValueError("duplicate tunnel id")
        return self

    def flow(self, flow_id: str) -> FlowConfig | None:
        """The flow with this id, or None."""
        return next((f for f in self.flows if f.id == flow_id), None)

    @property
    def auth(self) -> ServerAuth | None:
        """The auth settings when auth is enabled, else None."""
        auth = self.server.auth
        return auth if auth is not None and auth.enabled else None


def default_config() -> AppConfig:
    """The configuration written on first start (interop.md 1.1)."""
    return AppConfig(server=ServerConfig())
