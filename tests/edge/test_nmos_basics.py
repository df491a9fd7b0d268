"""NMOS basics: ids (interop.md 5), TAI versions, and the vendored AMWA schemas."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from services.edge.nmos import ids, schemas, tai

NODE = uuid.UUID("0f8e5c1a-3b7d-4c2e-9a61-5d4b3c2a1f00")
EXAMPLES = Path(__file__).resolve().parents[3] / "shared" / "nmos"


def test_ids_are_uuid5_of_the_interop_names() -> None:
    assert ids.device_id(NODE) == str(uuid.uuid5(NODE, "device:default"))
    assert ids.source_id(NODE, "cam1") == str(uuid.uuid5(NODE, "source:cam1"))
    assert ids.flow_id(NODE, "cam1") == str(uuid.uuid5(NODE, "flow:cam1"))
    assert ids.sender_id(NODE, "cam1", "out-a") == str(uuid.uuid5(NODE, "sender:cam1:out-a"))
    assert ids.receiver_id(NODE, "cam1") == str(uuid.uuid5(NODE, "receiver:cam1"))
    assert ids.source_id(NODE, "caméra") == str(uuid.uuid5(NODE, "source:caméra"))  # UTF-8 names


def test_tai_is_utc_plus_37_s_and_round_trips() -> None:
    utc = 1_700_000_000_123_456_789
    assert tai.format_tai(tai.tai_ns(utc)) == "1700000037:123456789"
    assert tai.parse_tai("1700000037:123456789") == tai.tai_ns(utc)
    assert tai.format_tai(5) == "0:5"
    for bad in ("1:1000000000", "-1:0", "1.5:0", "1:", "abc"):
        with pytest.raises(ValueError):
            tai.parse_tai(bad)


@pytest.mark.skipif(not EXAMPLES.exists(), reason="the AMWA examples in ../shared/nmos are not beside this clone")
@pytest.mark.parametrize(
    ("version", "example", "schema"),
    [
        ("is-04-v1.3.x", "nodeapi-self-get-200.json", "node.json"),
        ("is-04-v1.3.x", "nodeapi-senders-get-200.json", "senders.json"),
        ("is-04-v1.3.x", "nodeapi-receivers-get-200.json", "receivers.json"),
    ],
)
def test_the_vendored_schemas_accept_the_amwa_examples(version: str, example: str, schema: str) -> None:
    document = json.loads((EXAMPLES / version / "examples" / example).read_text())
    assert schemas.problems(schemas.IS04, schema, document) == []


def test_a_bad_body_is_described_without_its_values() -> None:
    found = schemas.problems(schemas.IS05, "sender-stage-schema.json", {"master_enable": "secret-value"})
    assert found and all("secret-value" not in text for text in found)
