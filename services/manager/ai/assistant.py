"""What the AI routes ask (interop.md 7.6): keys per user and provider, and the three requests.

Keys are stored encrypted with the manager's :class:`~services.manager.secrets.SecretBox`
(interop.md 7.7) and decrypted only to build one provider call; they never reach a response,
a log line or an error text. Context comes from the store (nodes, cached configs) and the node
hub (who is online, latest stats and health), limited to the nodes the caller may see
(``allowed_node_ids``; None means all).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

from pydantic import SecretStr

from appliance import errors
from services.manager.auth import visible_node_ids
from services.manager.hub import NodeHub
from services.manager.secrets import SecretBox
from services.manager.store import AiKeyRecord, AiProvider, NodeRecord, Store, UserRecord

from . import prompts
from .providers import ProviderFailed, ProviderRequest, call_provider
from .replies import parse_reply

__all__ = [
    "GENERATE_MAX_TOKENS",
    "SHORT_MAX_TOKENS",
    "AiAnswer",
    "AiAssistant",
    "GeneratedConfig",
    "NoApiKey",
    "no_key_message",
]

log = logging.getLogger(__name__)

GENERATE_MAX_TOKENS: Final = 4096
SHORT_MAX_TOKENS: Final = 2048
"""Anthropic's ``max_tokens`` for analyze and query (interop.md 7.6)."""


def no_key_message(provider: AiProvider) -> str:
    """interop.md 7.6's exact text for a provider without a stored key."""
    return f"No {provider.value} API key configured. Add one under AI Keys."


class NoApiKey(errors.InvalidInput):
    """The caller stored no key for the provider: 400 ``{success:false, error}``."""

    def __init__(self, provider: AiProvider) -> None:
        super().__init__(no_key_message(provider))
        self.provider = provider


@dataclass(frozen=True, slots=True)
class GeneratedConfig:
    """generate-config's success: the parsed ``config`` and the reply text as received."""

    config: Any
    raw_response: str


@dataclass(frozen=True, slots=True)
class AiAnswer:
    """analyze's and query's success: the reply text."""

    response: str


def _may_see(user: UserRecord, node_id: UUID) -> bool:
    visible = visible_node_ids(user)  # the one node-access rule (services/manager/auth.py)
    return visible is None or node_id in visible


class AiAssistant:
    """One per manager process; stateless beyond what it is given."""

    def __init__(self, store: Store, box: SecretBox, hub: NodeHub | None) -> None:
        self._store = store
        self._box = box
        self._hub = hub

    # ------------------------------------------------------------------ keys
    async def put_key(
        self, user_id: UUID, provider: AiProvider, api_key: SecretStr, model_preference: str | None
    ) -> AiKeyRecord:
        ciphertext = self._box.encrypt(api_key.get_secret_value())
        return await self._store.put_ai_key(user_id, provider, ciphertext, model_preference=model_preference)

    async def list_keys(self, user_id: UUID) -> list[AiKeyRecord]:
        return await self._store.list_ai_keys(user_id)

    async def delete_key(self, user_id: UUID, provider: AiProvider) -> None:
        """Raises ``AiKeyNotFound`` (404)."""
        await self._store.delete_ai_key(user_id, provider)

    # ------------------------------------------------------------------ context
    async def _visible_nodes(self, user: UserRecord) -> list[NodeRecord]:
        return [node for node in await self._store.list_nodes() if _may_see(user, node.id)]

    def _online(self, node_id: UUID) -> bool:
        return self._hub is not None and self._hub.is_connected(node_id)

    def _status(self, node: NodeRecord) -> str:
        live = self._hub.live_status(node.id) if self._hub is not None else None
        return (live or node.status).value

    async def current_flows(self, user: UserRecord, node_id: UUID | None, existing_flows: Sequence[Any]) -> list[Any]:
        """The online node's cached flows, else ``existing_flows`` (interop.md 7.6 part 3)."""
        if node_id is not None and _may_see(user, node_id) and self._online(node_id):
            cached = await self._store.get_cached_config(node_id)
            if cached is not None:
                try:
                    config = json.loads(cached.config_json)
                except ValueError:
                    config = None
                flows = config.get("flows") if isinstance(config, dict) else None
                if isinstance(flows, list):
                    return flows
        return list(existing_flows)

    def node_summaries(self, nodes: Sequence[NodeRecord]) -> list[dict[str, Any]]:
        """``[{id, name, device_type, status}]`` (interop.md 7.6 part 4)."""
        return [
            {"id": str(node.id), "name": node.name, "device_type": node.device_type.value, "status": self._status(node)}
            for node in nodes
        ]

    def _stats_context(self, nodes: Sequence[NodeRecord]) -> list[dict[str, Any]]:
        context = []
        for summary, node in zip(self.node_summaries(nodes), nodes, strict=True):
            stats = self._hub.latest_stats(node.id) if self._hub is not None else None
            context.append({**summary, "stats": stats})
        return context

    def _health_context(self, nodes: Sequence[NodeRecord]) -> list[dict[str, Any]]:
        context = []
        for summary, node in zip(self.node_summaries(nodes), nodes, strict=True):
            health = self._hub.latest_health(node.id) if self._hub is not None else None
            context.append(
                {
                    **summary,
                    "last_seen_at": node.last_seen_at.isoformat() if node.last_seen_at else None,
                    "health": health if health is not None else node.last_health,
                }
            )
        return context

    # ------------------------------------------------------------------ requests
    async def _call(self, user: UserRecord, provider: AiProvider, system: str, text: str, max_tokens: int) -> str:
        record = await self._store.get_ai_key(user.id, provider)
        if record is None:
            raise NoApiKey(provider)
        request = ProviderRequest(
            provider=provider,
            api_key=SecretStr(self._box.decrypt(record.api_key_ciphertext)),
            model=record.model_preference or None,
            system=system,
            user=text,
            max_tokens=max_tokens,
        )
        try:
            return await call_provider(request)
        except ProviderFailed as exc:
            log.warning("AI request for user %s failed: %s", user.id, exc)
            raise

    async def generate_config(
        self,
        user: UserRecord,
        prompt: str,
        provider: AiProvider,
        node_id: UUID | None,
        existing_flows: Sequence[Any],
    ) -> GeneratedConfig:
        """Raises NoApiKey or ProviderFailed."""
        nodes = await self._visible_nodes(user)
        flows = await self.current_flows(user, node_id, existing_flows)
        system = prompts.generate_config_system_prompt(flows, self.node_summaries(nodes))
        raw = await self._call(user, provider, system, prompt, GENERATE_MAX_TOKENS)
        return GeneratedConfig(parse_reply(raw), raw)

    async def analyze(self, user: UserRecord, description: str, provider: AiProvider) -> AiAnswer:
        """Raises NoApiKey or ProviderFailed."""
        nodes = await self._visible_nodes(user)
        system = prompts.analyze_system_prompt(self._stats_context(nodes))
        return AiAnswer(await self._call(user, provider, system, description, SHORT_MAX_TOKENS))

    async def query(self, user: UserRecord, query: str, provider: AiProvider) -> AiAnswer:
        """Raises NoApiKey or ProviderFailed."""
        nodes = await self._visible_nodes(user)
        system = prompts.query_system_prompt(self._health_context(nodes))
        return AiAnswer(await self._call(user, provider, system, query, SHORT_MAX_TOKENS))
