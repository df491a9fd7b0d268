"""The vendored AMWA schemas (``schemas/``, draft-04, relative ``$ref``s) as validators.

``validator("is-05-v1.1", "sender-stage-schema.json")`` answers a ``jsonschema`` validator whose
``$ref``s resolve inside that version's directory. The runtime uses it for IS-05 PATCH bodies;
the tests use it for every NMOS response body.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Final

from jsonschema import Draft4Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

__all__ = ["IS04", "IS05", "SCHEMA_DIR", "problems", "validator"]

SCHEMA_DIR: Final = Path(__file__).with_name("schemas")
IS04: Final = "is-04-v1.3"
IS05: Final = "is-05-v1.1"
_BASE: Final = "https://schemas.mediaplane.invalid/"


@functools.cache
def _registry(version: str) -> Registry:
    resources = []
    for path in sorted((SCHEMA_DIR / version).glob("*.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resource = Resource.from_contents(contents, default_specification=DRAFT4)
        resources.append((f"{_BASE}{version}/{path.name}", resource))
    return Registry().with_resources(resources)


@functools.cache
def validator(version: str, name: str) -> Draft4Validator:
    """A validator for ``schemas/<version>/<name>`` (cached), its ``$ref``s resolved in the registry."""
    return Draft4Validator({"$ref": f"{_BASE}{version}/{name}"}, registry=_registry(version))


def problems(version: str, name: str, document: Any) -> list[str]:
    """What is wrong with ``document`` against the schema, as texts without the input's values."""
    return [
        f"{'/'.join(str(part) for part in error.absolute_path) or '(body)'}: {error.validator} failed"
        for error in validator(version, name).iter_errors(document)
    ]
