"""generate-config's reply parsing (interop.md 7.6 rules 1-4, code fences) and its system prompt."""

from __future__ import annotations

import json

import pytest

from services.manager.ai import parse_reply, strip_code_fence
from services.manager.ai.prompts import (
    ACTIONS_PART,
    ROLE_PART,
    SCHEMA_PART,
    analyze_system_prompt,
    generate_config_parts,
    generate_config_system_prompt,
    query_system_prompt,
)
from services.manager.ai.replies import GENERATED_FLOW_MESSAGE

FLOW = {"id": "cam-1", "name": "Camera 1", "input": {"type": "udp", "bind_addr": "0.0.0.0:9000"}, "outputs": []}


# --- rule 1: an action envelope is used as it is ---------------------------------------------


def test_an_action_envelope_is_used_as_it_is() -> None:
    envelope = {"action": "delete_flow", "flow_id": "cam-1", "message": "Deleting", "extra": [1, 2]}
    assert parse_reply(json.dumps(envelope)) == envelope


def test_an_envelope_with_id_and_input_and_action_keeps_its_action() -> None:
    envelope = {"action": "update_flow", "id": "x", "input": {}, "flow": FLOW, "message": "m"}
    assert parse_reply(json.dumps(envelope)) == envelope


# --- rule 2: a bare FlowConfig becomes create_flow ------------------------------------------


def test_a_bare_flow_config_becomes_create_flow() -> None:
    assert parse_reply(json.dumps(FLOW)) == {"action": "create_flow", "flow": FLOW, "message": GENERATED_FLOW_MESSAGE}
    assert GENERATED_FLOW_MESSAGE == "Generated flow configuration"


def test_id_without_input_is_not_a_flow() -> None:
    assert parse_reply('{"id": "x", "name": "y"}') == {"id": "x", "name": "y"}


# --- rule 3: other JSON passes through --------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{"findings": [], "suggestions": ["x"]}, [1, 2, 3], "a JSON string", 42, 1.5, True, None, {}],
)
def test_other_json_passes_through_unchanged(value: object) -> None:
    assert parse_reply(json.dumps(value)) == value


# --- rule 4: text that is not JSON becomes info ---------------------------------------------


@pytest.mark.parametrize("text", ["Sure! I can help with that.", "{not json", "", "[1, 2", "   spaced out   ", "NaNo"])
def test_text_that_is_not_json_becomes_info(text: str) -> None:
    assert parse_reply(text) == {"action": "info", "message": text.strip()}


def test_deeply_nested_json_does_not_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    result = parse_reply(deep)
    assert isinstance(result, list | dict)


# --- trimming and code fences ----------------------------------------------------------------


@pytest.mark.parametrize(
    "wrapped",
    [
        '```json\n{"action": "info", "message": "hi"}\n```',
        '```\n{"action": "info", "message": "hi"}\n```',
        '  \n```JSON  \r\n{"action": "info", "message": "hi"}\r\n```\n\n',
        '```json\n{"action": "info", "message": "hi"}```',
        '\n\t{"action": "info", "message": "hi"}  \n',
    ],
)
def test_whitespace_and_a_surrounding_fence_are_removed(wrapped: str) -> None:
    assert parse_reply(wrapped) == {"action": "info", "message": "hi"}


def test_a_fenced_bare_flow_becomes_create_flow() -> None:
    assert parse_reply(f"```json\n{json.dumps(FLOW, indent=2)}\n```")["flow"] == FLOW


def test_a_fence_inside_prose_is_not_stripped() -> None:
    text = 'Here you go:\n```json\n{"action": "info", "message": "hi"}\n```'
    assert parse_reply(text) == {"action": "info", "message": text}


def test_fenced_prose_becomes_info_without_the_fence() -> None:
    assert parse_reply("```\nJust text\n```") == {"action": "info", "message": "Just text"}
    assert strip_code_fence("```text\nline 1\nline 2\n```") == "line 1\nline 2"


# --- prompts ---------------------------------------------------------------------------------


def test_generate_config_prompt_has_five_parts_in_order() -> None:
    flows = [FLOW]
    nodes = [{"id": "6f1c", "name": "ob-truck", "device_type": "edge", "status": "online"}]
    parts = generate_config_parts(flows, nodes)
    assert parts[0] == ROLE_PART and parts[1] == SCHEMA_PART and parts[4] == ACTIONS_PART
    assert json.loads(parts[2].split("\n", 1)[1]) == flows
    assert json.loads(parts[3].split("\n", 1)[1]) == nodes
    prompt = generate_config_system_prompt(flows, nodes)
    assert prompt == "\n\n".join(parts)
    positions = [prompt.index(part) for part in parts]
    assert positions == sorted(positions)


def test_the_schema_part_carries_the_section_2_rules() -> None:
    assert "aes_key_len" in SCHEMA_PART and 'never "key_length"' in SCHEMA_PART
    assert "10-79" in SCHEMA_PART
    assert "9000-9999" in SCHEMA_PART
    assert "120 and 500 ms" in SCHEMA_PART
    for action in (
        "create_flow",
        "update_flow",
        "delete_flow",
        "add_output",
        "remove_output",
        "start_flow",
        "stop_flow",
        "restart_flow",
        "create_tunnel",
        "delete_tunnel",
        "info",
        "multiple",
    ):
        assert f'"{action}"' in ACTIONS_PART
    assert "exactly one JSON action envelope" in ACTIONS_PART


def test_analyze_and_query_prompts_carry_their_context() -> None:
    stats = [{"id": "n1", "stats": {"bitrate": 5}}]
    analyze = analyze_system_prompt(stats)
    assert '{"findings": [string], "suggestions": [string]}' in analyze
    assert json.dumps(stats, separators=(",", ":")) in analyze
    health = [{"id": "n1", "health": {"ok": True}}]
    query = query_system_prompt(health)
    assert "terse" in query and json.dumps(health, separators=(",", ":")) in query
