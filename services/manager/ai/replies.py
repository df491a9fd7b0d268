"""Turning a provider's reply text into generate-config's ``config`` (interop.md 7.6).

The text is trimmed and a surrounding Markdown code fence (```` ``` ```` or ```` ```json ````)
is removed. Then, in order:

1. JSON with an ``action`` key is used as it is;
2. JSON with ``id`` and ``input`` (a bare FlowConfig) is wrapped as ``create_flow``;
3. any other JSON passes through unchanged;
4. text that is not JSON becomes ``{action: "info", message: <text>}``.

Nothing here applies an action: the UI does that through the normal REST routes.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["GENERATED_FLOW_MESSAGE", "parse_reply", "strip_code_fence"]

GENERATED_FLOW_MESSAGE: Final = "Generated flow configuration"
_FENCE: Final = re.compile(r"\A```[A-Za-z0-9_+-]*[ \t]*\r?\n(?P<body>.*?)\r?\n?```\Z", re.DOTALL)


def strip_code_fence(text: str) -> str:
    """``text`` trimmed, without a Markdown code fence around all of it."""
    trimmed = text.strip()
    found = _FENCE.match(trimmed)
    return found.group("body").strip() if found else trimmed


def parse_reply(text: str) -> Any:
    """The ``config`` of a generate-config answer, by the four rules of interop.md 7.6."""
    body = strip_code_fence(text)
    try:
        parsed = json.loads(body)
    except ValueError:  # JSONDecodeError, and over-deep nesting
        return {"action": "info", "message": body}
    except RecursionError:
        return {"action": "info", "message": body}
    if isinstance(parsed, dict):
        if "action" in parsed:
            return parsed
        if "id" in parsed and "input" in parsed:
            return {"action": "create_flow", "flow": parsed, "message": GENERATED_FLOW_MESSAGE}
    return parsed
