"""``/api/v1/ai/*`` (interop.md 7.6, 13): operator and above; keys are per user.

- ``POST /api/v1/ai/keys {provider, api_key (1-256), model_preference? (≤128)}``: upsert,
  encrypted at rest → 200 ``{success:true}``.
- ``GET /api/v1/ai/keys`` → ``[{id, provider, model_preference, configured:true, updated_at}]``.
- ``DELETE /api/v1/ai/keys {provider}`` → 200 ``{success:true}``, or 404.
- ``POST /api/v1/ai/generate-config {prompt (≤10 000), provider? ("openai"), node_id?,
  existing_flows?[]}`` → 200 ``{success:true, config, raw_response}``.
- ``POST /api/v1/ai/analyze {description, provider?}`` and ``POST /api/v1/ai/query {query,
  provider?}`` → 200 ``{success:true, response}``.

No key for the provider → 400 ``{success:false, error:"No <provider> API key configured. Add
one under AI Keys."}``; a provider failure → 200 ``{success:false, error:"<provider> request
failed: …"}``. The key never appears in an answer, an error or a log line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final, TypeVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictStr, TypeAdapter, field_validator
from quart import Blueprint, Response, current_app

from appliance.http.app import read_json_object, validate
from appliance.http.envelope import json_response
from services.manager.ai.assistant import AiAssistant, NoApiKey
from services.manager.ai.providers import ProviderFailed
from services.manager.api.auth_routes import current_principal, require, service
from services.manager.api.ws import HUB_KEY
from services.manager.hub import NodeHub
from services.manager.service import rfc3339
from services.manager.store import AiKeyRecord, AiProvider, Role

T = TypeVar("T")

__all__ = ["AnalyzeRequest", "GenerateConfigRequest", "KeyDelete", "KeyPut", "QueryRequest", "bp"]

bp = Blueprint("manager_ai", __name__)

MAX_PROMPT_CHARS: Final = 10_000


class KeyPut(BaseModel):
    """``POST /api/v1/ai/keys``."""

    model_config = ConfigDict(extra="forbid")

    provider: AiProvider
    api_key: SecretStr = Field(min_length=1, max_length=256)
    model_preference: StrictStr | None = Field(None, max_length=128)

    @field_validator("api_key", mode="before")
    @classmethod
    def _key_is_text(cls, value: object) -> object:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        return value


class KeyDelete(BaseModel):
    """``DELETE /api/v1/ai/keys``."""

    model_config = ConfigDict(extra="forbid")

    provider: AiProvider


class GenerateConfigRequest(BaseModel):
    """``POST /api/v1/ai/generate-config``."""

    model_config = ConfigDict(extra="forbid")

    prompt: StrictStr = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    provider: AiProvider = AiProvider.OPENAI
    node_id: UUID | None = None
    existing_flows: list[Any] | None = None


class AnalyzeRequest(BaseModel):
    """``POST /api/v1/ai/analyze``."""

    model_config = ConfigDict(extra="forbid")

    description: Annotated[StrictStr, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
    provider: AiProvider = AiProvider.OPENAI


class QueryRequest(BaseModel):
    """``POST /api/v1/ai/query``."""

    model_config = ConfigDict(extra="forbid")

    query: Annotated[StrictStr, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
    provider: AiProvider = AiProvider.OPENAI


_KEY_PUT: Final = TypeAdapter(KeyPut)
_KEY_DELETE: Final = TypeAdapter(KeyDelete)
_GENERATE: Final = TypeAdapter(GenerateConfigRequest)
_ANALYZE: Final = TypeAdapter(AnalyzeRequest)
_QUERY: Final = TypeAdapter(QueryRequest)


def _assistant() -> AiAssistant:
    hub = current_app.config.get(HUB_KEY)
    manager = service()
    return AiAssistant(manager.store, manager.secret_box, hub if isinstance(hub, NodeHub) else None)


def _key_view(record: AiKeyRecord) -> dict[str, Any]:
    return {
        "id": str(record.id),
        "provider": record.provider.value,
        "model_preference": record.model_preference,
        "configured": True,
        "updated_at": rfc3339(record.updated_at),
    }


def _no_key(exc: NoApiKey) -> Response:
    return json_response({"success": False, "error": exc.message}, 400)


def _failed(exc: ProviderFailed) -> Response:
    return json_response({"success": False, "error": str(exc)})


@bp.post("/api/v1/ai/keys")
@require(Role.OPERATOR)
async def put_key() -> Response:
    """Stores (or replaces) the caller's key for a provider."""
    body = validate(_KEY_PUT, await read_json_object())
    await _assistant().put_key(current_principal().user.id, body.provider, body.api_key, body.model_preference or None)
    return json_response({"success": True})


@bp.get("/api/v1/ai/keys")
@require(Role.OPERATOR)
async def list_keys() -> Response:
    """The caller's configured providers, never the keys."""
    return json_response([_key_view(record) for record in await _assistant().list_keys(current_principal().user.id)])


@bp.delete("/api/v1/ai/keys")
@require(Role.OPERATOR)
async def delete_key() -> Response:
    """Deletes the caller's key for a provider: 200, or 404 when none is stored."""
    body = validate(_KEY_DELETE, await read_json_object())
    await _assistant().delete_key(current_principal().user.id, body.provider)
    return json_response({"success": True})


@bp.post("/api/v1/ai/generate-config")
@require(Role.OPERATOR)
async def generate_config() -> Response:
    """Asks the provider for one action envelope; nothing is applied."""
    body = validate(_GENERATE, await read_json_object())
    call = _assistant().generate_config(
        current_principal().user, body.prompt, body.provider, body.node_id, body.existing_flows or []
    )
    return await _provider_answer(call, lambda result: {"config": result.config, "raw_response": result.raw_response})


@bp.post("/api/v1/ai/analyze")
@require(Role.OPERATOR)
async def analyze() -> Response:
    """Anomaly analysis over the visible nodes' latest stats."""
    body = validate(_ANALYZE, await read_json_object())
    call = _assistant().analyze(current_principal().user, body.description, body.provider)
    return await _provider_answer(call, lambda answer: {"response": answer.response})


@bp.post("/api/v1/ai/query")
@require(Role.OPERATOR)
async def query() -> Response:
    """A natural-language question about the visible nodes and their health."""
    body = validate(_QUERY, await read_json_object())
    call = _assistant().query(current_principal().user, body.query, body.provider)
    return await _provider_answer(call, lambda answer: {"response": answer.response})


async def _provider_answer(call: Awaitable[T], fields: Callable[[T], dict[str, Any]]) -> Response:
    """One provider round trip as the AI routes answer it: 200 with ``fields``, or the
    no-key / provider-failed answers (interop.md 7.6)."""
    try:
        result = await call
    except NoApiKey as exc:
        return _no_key(exc)
    except ProviderFailed as exc:
        return _failed(exc)
    return json_response({"success": True, **fields(result)})
