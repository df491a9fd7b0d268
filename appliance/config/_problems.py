"""Internal: one description of "this file is bad", turned into an error kind by the caller.

The same problem is a ConfigFileError at start (exit status 2) and an InvalidInput or
Internal answer on ``POST /api/v1/config/reload``, so the readers raise FileProblem and
the public entry points translate it once (style.md H6).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from appliance.untrusted import error_message

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_ERRORS_SHOWN = 3


class FileProblem(Exception):
    """A config file cannot be used. ``detail`` is one line and never holds a file value.

    ``invalid`` is True when the file parsed but its content is not a valid configuration
    (HTTP 400 on reload), False when it cannot be read, decrypted or parsed (HTTP 500).
    """

    def __init__(self, path: Path, detail: str, *, invalid: bool) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail
        self.invalid = invalid


def json_path(loc: Sequence[int | str], data: Any) -> str:
    """The JSON path (``$.flows[0].input.bind_addr``) of a pydantic error location.

    pydantic puts the tag of a discriminated union into ``loc`` (``input``, ``rtp``,
    ``bind_addr``); the tag is not a key of the document, so it is dropped by walking
    ``loc`` alongside the data that was validated.
    """
    parts = ["$"]
    node: Any = data
    for element in loc:
        if isinstance(element, int) and isinstance(node, list):
            parts.append(f"[{element}]")
            node = node[element] if 0 <= element < len(node) else None
            continue
        key = str(element)
        if isinstance(node, dict):
            if key not in node and node.get("type") == key:
                continue  # the union tag pydantic adds, e.g. "rtp" inside an input
            parts.append(f".{key}" if _PLAIN_KEY.match(key) else f'["{key}"]')
            node = node.get(key)
        elif key == "[key]":
            continue  # pydantic's marker for "the dict key itself"
        else:
            parts.append(f".{key}" if _PLAIN_KEY.match(key) else f'["{key}"]')
            node = None
    return "".join(parts)


def describe_validation_error(exc: ValidationError, data: Any) -> str:
    """One line: ``<json path>: <message>`` for the first errors, without input values.

    Built from ``exc.errors(include_input=False)``, each message worded by
    ``appliance.untrusted.error_message`` (no rejected value, no rejected length). Never
    use ``str(exc)``: pydantic puts the offending input values, secrets included, into it
    (style.md section 3).
    """
    errors = exc.errors(include_input=False, include_url=False)
    shown = []
    for error in errors[:_MAX_ERRORS_SHOWN]:
        message = error_message(error).removeprefix("Value error, ")
        shown.append(f"{json_path(error['loc'], data)}: {message}")
    text = "; ".join(shown)
    if len(errors) > _MAX_ERRORS_SHOWN:
        text += f" (and {len(errors) - _MAX_ERRORS_SHOWN} more)"
    return text
