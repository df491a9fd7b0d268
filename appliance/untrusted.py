"""Reading untrusted input: JSON with a nesting limit, and error texts that never echo it.

Every JSON document the appliance takes from outside (request bodies, the token
request, ``config.json``, the plaintext of ``secrets.json``) is parsed by
:func:`load_json`, and every pydantic error shown to a user or written to a log is
worded by :func:`error_message`.

Why a nesting limit: Python's ``json`` module recurses once per level, so ``[`` x 1000
raises RecursionError, and a document a few hundred levels deep still exhausts the stack
later (``copy.deepcopy``, validation). No Mediaplane document needs more than a handful of
levels (a whole ``config.json`` is 6 deep), so anything deeper than :data:`MAX_JSON_DEPTH`
is refused with one message before it reaches a model.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic_core import ErrorDetails

__all__ = ["MAX_JSON_DEPTH", "JsonTooDeep", "error_message", "load_json"]

MAX_JSON_DEPTH: Final = 64
"""The deepest JSON document accepted: ``[]`` and ``{}`` are 1 level, ``{"a": []}`` is 2."""


class JsonTooDeep(ValueError):
    """The document nests arrays and objects deeper than :data:`MAX_JSON_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")


def load_json(raw: bytes | str) -> Any:
    """``json.loads(raw)``, refusing documents nested deeper than :data:`MAX_JSON_DEPTH`.

    Raises JsonTooDeep, or what ``json.loads`` raises (JSONDecodeError, UnicodeDecodeError;
    all ValueErrors, whose messages carry a position, never the document). Never raises
    RecursionError.
    """
    # Each level opens with "[" or "{" (whatever the encoding json.loads detects, these bytes
    # appear for the characters), so a document with few of them cannot be too deep.
    opened = raw.count("[") + raw.count("{") if isinstance(raw, str) else raw.count(b"[") + raw.count(b"{")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise JsonTooDeep() from None
    if opened > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise JsonTooDeep()
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels (no recursion)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def error_message(error: ErrorDetails) -> str:
    """The message of one pydantic error without the rejected value or its length.

    pydantic words a few errors with the input: a length error says "..., not 300" (for a
    SecretStr, the length of a rejected secret), a bad union tag and a bad UUID quote it.
    Those are reworded from the error's context (the limits, the expected tags); every
    other message is pydantic's own, which never holds the input. ``error`` must come from
    ``exc.errors(include_context=True)`` (the default) for the limits to be shown.
    """
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in ("too_long", "too_short"):
        # pydantic's wording ("Value" is a SecretStr, counted in characters) without ", not N".
        field_type = ctx.get("field_type", "Value")
        bound, limit = ("at most", ctx.get("max_length")) if kind == "too_long" else ("at least", ctx.get("min_length"))
        if limit is None:
            return f"{field_type} has the wrong length"
        return f"{field_type} should have {bound} {limit} item{'' if limit == 1 else 's'}"
    if kind == "union_tag_invalid":
        return f"Input tag does not match any of the expected tags: {ctx.get('expected_tags', '?')}"
    if kind == "uuid_parsing":
        return "Input should be a valid UUID"
    return str(error.get("msg", "invalid"))
