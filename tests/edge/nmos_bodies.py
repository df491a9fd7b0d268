"""Minimal IS-04 v1.3 resources valid against the AMWA schemas, for registration tests that do
not need the edge's own model."""

from __future__ import annotations

import uuid
from typing import Any

NODE = "3b6d4c2a-1f00-4e5d-9a61-5d4b3c2a1f00"
DEVICE = "4c2a1f00-3b6d-4e5d-9a61-5d4b3c2a1f01"


def _core(resource_id: str, version: str, label: str) -> dict[str, Any]:
    return {"id": resource_id, "version": version, "label": label, "description": label, "tags": {}}


def bodies(version: str = "1:0", flows: tuple[str, ...] = ("cam1",)) -> dict[str, dict[str, dict[str, Any]]]:
    node = {
        **_core(NODE, version, "node"),
        "href": "http://127.0.0.1:8080/",
        "hostname": "edge",
        "caps": {},
        "api": {
            "versions": ["v1.3"],
            "endpoints": [{"host": "127.0.0.1", "port": 8080, "protocol": "http", "authorization": False}],
        },
        "services": [],
        "clocks": [{"name": "clk0", "ref_type": "internal"}],
        "interfaces": [{"chassis_id": None, "port_id": "00-11-22-33-44-55", "name": "eth0"}],
    }
    device = {
        **_core(DEVICE, version, "device"),
        "type": "urn:x-nmos:device:generic",
        "node_id": NODE,
        "senders": [],
        "receivers": [],
        "controls": [],
    }
    out: dict[str, dict[str, dict[str, Any]]] = {
        "node": {NODE: node},
        "device": {DEVICE: device},
        "source": {},
        "flow": {},
        "sender": {},
        "receiver": {},
    }
    for name in flows:
        ids = {
            kind: str(uuid.uuid5(uuid.UUID(NODE), f"{kind}:{name}"))
            for kind in ("source", "flow", "sender", "receiver")
        }
        out["source"][ids["source"]] = {
            **_core(ids["source"], version, name),
            "format": "urn:x-nmos:format:mux",
            "caps": {},
            "device_id": DEVICE,
            "parents": [],
            "clock_name": None,
        }
        out["flow"][ids["flow"]] = {
            **_core(ids["flow"], version, name),
            "format": "urn:x-nmos:format:mux",
            "media_type": "video/MP2T",
            "source_id": ids["source"],
            "device_id": DEVICE,
            "parents": [],
        }
        out["sender"][ids["sender"]] = {
            **_core(ids["sender"], version, name),
            "flow_id": ids["flow"],
            "transport": "urn:x-nmos:transport:rtp",
            "device_id": DEVICE,
            "manifest_href": None,
            "interface_bindings": ["eth0"],
            "caps": {},
            "subscription": {"receiver_id": None, "active": False},
        }
        out["receiver"][ids["receiver"]] = {
            **_core(ids["receiver"], version, name),
            "format": "urn:x-nmos:format:mux",
            "caps": {"media_types": ["video/MP2T"]},
            "transport": "urn:x-nmos:transport:rtp",
            "device_id": DEVICE,
            "interface_bindings": ["eth0"],
            "subscription": {"sender_id": None, "active": False},
        }
    return out
