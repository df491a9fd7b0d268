"""NMOS resource ids (interop.md 5 "IDs"): the node id is the config's ``node_id``; every other id
is ``uuid5(node_uuid, name)`` of a fixed name, so ids survive restarts and config rewrites."""

from __future__ import annotations

import uuid

__all__ = ["device_id", "flow_id", "receiver_id", "sender_id", "source_id"]


def _named(node_id: uuid.UUID, name: str) -> str:
    return str(uuid.uuid5(node_id, name))  # uuid5 encodes the name as UTF-8


def device_id(node_id: uuid.UUID) -> str:
    return _named(node_id, "device:default")


def source_id(node_id: uuid.UUID, flow: str) -> str:
    return _named(node_id, f"source:{flow}")


def flow_id(node_id: uuid.UUID, flow: str) -> str:
    return _named(node_id, f"flow:{flow}")


def sender_id(node_id: uuid.UUID, flow: str, output: str) -> str:
    return _named(node_id, f"sender:{flow}:{output}")


def receiver_id(node_id: uuid.UUID, flow: str) -> str:
    return _named(node_id, f"receiver:{flow}")
