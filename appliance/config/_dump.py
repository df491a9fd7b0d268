"""Internal: turning models into JSON-ready data, with secrets revealed or refused.

pydantic 2.14 dumps a ``SecretStr`` as ``**********`` in JSON mode, which would write a
mask into a file or a response. So both helpers dump in Python mode (``SecretStr`` kept
as an object) and decide explicitly: the secrets-file writer reveals, everything else
refuses (a ``SecretStr`` reaching a public dump is a bug in the exclude lists).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic_core import to_jsonable_python

from appliance.errors import Internal

# pydantic's include/exclude mapping type (IncEx), kept loose on purpose.
Exclude = dict[str, Any]


def revealed_json(model: BaseModel) -> Any:
    """``model`` as JSON-ready data with every ``SecretStr`` replaced by its value.

    Only for the content of secrets.json (and in-memory merging); never for a response,
    a log line or config.json.
    """
    return to_jsonable_python(_walk(model.model_dump(mode="python"), reveal=True))


def public_json(model: BaseModel, exclude: Exclude | None = None) -> Any:
    """``model`` as JSON-ready data, minus ``exclude``; raises Internal if a secret is left."""
    return to_jsonable_python(_walk(model.model_dump(mode="python", exclude=exclude), reveal=False))


def _walk(value: Any, *, reveal: bool) -> Any:
    if isinstance(value, SecretStr):
        if not reveal:
            raise Internal("a secret field reached a public dump")  # a bug: fix the exclude list
        return value.get_secret_value()
    if isinstance(value, dict):
        return {key: _walk(item, reveal=reveal) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_walk(item, reveal=reveal) for item in value]
    return value
