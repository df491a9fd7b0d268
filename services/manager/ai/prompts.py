"""The system prompts of the AI routes (interop.md 7.6).

generate-config's system prompt has five parts, in this order:

1. the assistant role;
2. the FlowConfig schema and the rules of interop.md section 2 (``aes_key_len``, not
   ``key_length``; a passphrase of 10-79 chars; ports 9000-9999 suggested; latency 120-500 ms);
3. the current flows (the online node's cached config, else the request's ``existing_flows``);
4. the available nodes, ``[{id, name, device_type, status}]``;
5. the instruction to answer with exactly one JSON action envelope.

Context is serialised as compact JSON. Analyze asks for ``{findings[], suggestions[]}`` with
the node stats as context; query is a terse assistant with the nodes and their health.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

__all__ = [
    "ACTIONS_PART",
    "ANALYZE_ROLE",
    "QUERY_ROLE",
    "ROLE_PART",
    "SCHEMA_PART",
    "analyze_system_prompt",
    "generate_config_parts",
    "generate_config_system_prompt",
    "query_system_prompt",
]

ROLE_PART: Final = (
    "You are the Mediaplane flow assistant. You help broadcast engineers configure media "
    "transport flows (SRT, RTP, UDP, RTMP, RTSP, WebRTC, WHEP, HLS) and tunnels on Mediaplane edge nodes."
)

SCHEMA_PART: Final = """FlowConfig schema (JSON):
{"id": string (1-64 chars of [A-Za-z0-9_.-], unique among flows), "name": string (1-256 chars),
 "enabled": bool (default true), "media_analysis": bool (default true),
 "input": one object selected by "type", "outputs": [output objects]}
Input types: "rtp" {bind_addr, interface_addr?, fec_decode? {columns 1-20, rows 4-20}, tr07_mode?,
 allowed_sources?, allowed_payload_types?, max_bitrate_mbps?, redundancy? {bind_addr, interface_addr?}};
 "udp" {bind_addr, interface_addr?}; "srt" {SRT fields}; "rtmp" {listen_addr, app ("live"), stream_key?,
 max_publishers (1-16), tls (false)}; "rtsp" {rtsp_url, username?, password?, transport ("tcp"|"udp"),
 timeout_secs, reconnect_delay_secs}; "webrtc" {bearer_token?, video_only, public_ip?, stun_server?};
 "whep" {whep_url, bearer_token?, video_only}.
Output types (each with "type", "id" and "name"; the output id follows the flow-id rule, unique in the flow):
 "rtp" {dest_addr, bind_addr?, interface_addr?, fec_encode?, dscp (46), redundancy?};
 "udp" {dest_addr, bind_addr?, interface_addr?, dscp (46)}; "srt" {SRT fields};
 "rtmp" {dest_url, stream_key, reconnect_delay_secs, max_reconnect_attempts?};
 "hls" {ingest_url, segment_duration_secs (0.5-10), auth_token?, max_segments (1-100)};
 "webrtc" {mode ("whip_client"|"whep_server"), whip_url?, bearer_token?, max_viewers?, public_ip?, video_only}.
SRT fields: mode ("caller"|"listener"|"rendezvous"), local_addr (always required), remote_addr (required
 for caller and rendezvous), latency_ms, passphrase?, aes_key_len? (16|24|32), crypto_mode ("aes-ctr"|"aes-gcm"),
 stream_id?, redundancy?.
Tunnels: {id (UUIDv4), name, enabled, protocol ("tcp"|"udp"), mode ("relay"|"direct"),
 direction ("egress"|"ingress"), local_addr, relay_addr? (relay mode), peer_addr?, direct_listen_addr?}.
Rules:
- Addresses are "<ip>:<port>" (IPv6 in brackets); ports 1-65535.
- The SRT key length field is "aes_key_len", never "key_length".
- An SRT passphrase is 10-79 characters.
- Suggest ports in the range 9000-9999.
- Suggest an SRT latency between 120 and 500 ms."""

ACTIONS_PART: Final = """Answer with exactly one JSON action envelope and nothing else (no prose, no Markdown).
Every envelope carries a "message" for the user. Allowed actions:
- {"action": "create_flow", "flow": <FlowConfig>, "message": ...}
- {"action": "update_flow", "flow": <the complete FlowConfig, same id>, "message": ...}
- {"action": "delete_flow", "flow_id": ..., "message": ...}
- {"action": "add_output", "flow_id": ..., "output": <output>, "message": ...}
- {"action": "remove_output", "flow_id": ..., "output_id": ..., "message": ...}
- {"action": "start_flow" | "stop_flow" | "restart_flow", "flow_id": ..., "message": ...}
- {"action": "create_tunnel", "tunnel": <tunnel>, "message": ...}
- {"action": "delete_tunnel", "tunnel_id": ..., "message": ...}
- {"action": "info", "message": ...}
- {"action": "multiple", "actions": [<envelopes>], "message": ...}"""

ANALYZE_ROLE: Final = (
    "You are the Mediaplane monitoring analyst. Look for anomalies in the node statistics below "
    "(packet loss, retransmissions, bitrate drops, TR-101290 errors, offline or degraded nodes). "
    'Answer with exactly one JSON object {"findings": [string], "suggestions": [string]} and nothing else.'
)

QUERY_ROLE: Final = (
    "You are a terse assistant for the Mediaplane fleet manager. Answer the operator's question "
    "about the nodes below briefly and factually; say so when the data does not tell."
)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def generate_config_parts(current_flows: Sequence[Any], nodes: Sequence[Any]) -> tuple[str, str, str, str, str]:
    """The five parts of generate-config's system prompt, in order."""
    return (
        ROLE_PART,
        SCHEMA_PART,
        f"Current flows:\n{_json(list(current_flows))}",
        f"Available nodes:\n{_json(list(nodes))}",
        ACTIONS_PART,
    )


def generate_config_system_prompt(current_flows: Sequence[Any], nodes: Sequence[Any]) -> str:
    """The system prompt of ``POST /ai/generate-config``: the five parts, blank-line separated."""
    return "\n\n".join(generate_config_parts(current_flows, nodes))


def analyze_system_prompt(node_stats: Sequence[Any]) -> str:
    """The system prompt of ``POST /ai/analyze``: JSON findings and suggestions over the stats."""
    return f"{ANALYZE_ROLE}\n\nNode statistics:\n{_json(list(node_stats))}"


def query_system_prompt(nodes: Sequence[Any]) -> str:
    """The system prompt of ``POST /ai/query``: a terse assistant, the nodes and their health."""
    return f"{QUERY_ROLE}\n\nNodes and their health:\n{_json(list(nodes))}"
