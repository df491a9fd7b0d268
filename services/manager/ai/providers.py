"""The three AI providers' HTTP calls (interop.md 7.6), on httpx's AsyncClient under trio.

| Provider  | Request                                              | Reply text                           |
|-----------|------------------------------------------------------|--------------------------------------|
| openai    | POST {base}/v1/chat/completions, Bearer              | choices[0].message.content           |
| anthropic | POST {base}/v1/messages, x-api-key + version header  | content[0].text                      |
| gemini    | POST {base}/v1beta/models/{model}:generateContent,   | candidates[0].content.parts[0].text  |
|           | x-goog-api-key (never a query parameter)             |                                      |

``{base}`` comes from ``MEDIAPLANE_{OPENAI,ANTHROPIC,GEMINI}_BASE_URL`` (read at each call),
else the public endpoint. The whole exchange is bounded by :data:`PROVIDER_TIMEOUT_S`.

Every failure is :class:`ProviderFailed` with ``"<provider> request failed: <reason>"``. The
reason is built from this module's constants and the HTTP status only: never the provider's
body (providers echo parts of a rejected key) nor an httpx exception text, so it can never
carry the key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import httpx
import trio
from pydantic import SecretStr

from services.manager.store import AiProvider

__all__ = [
    "ANTHROPIC_VERSION",
    "BASE_URL_ENV",
    "DEFAULT_BASE_URLS",
    "DEFAULT_MODELS",
    "MAX_REPLY_BYTES",
    "PROVIDER_TIMEOUT_S",
    "ProviderFailed",
    "ProviderRequest",
    "base_url",
    "build_request",
    "call_provider",
    "reply_text",
]

PROVIDER_TIMEOUT_S: Final = 60.0
"""interop.md 7.6: a provider that does not answer within 60 s has failed."""
MAX_REPLY_BYTES: Final = 4 * 1024 * 1024
ANTHROPIC_VERSION: Final = "2023-06-01"
TEMPERATURE: Final = 0.3

DEFAULT_MODELS: Final[Mapping[AiProvider, str]] = {
    AiProvider.OPENAI: "gpt-4.1",
    AiProvider.ANTHROPIC: "claude-sonnet-4-6-20260318",
    AiProvider.GEMINI: "gemini-2.0-flash",
}
DEFAULT_BASE_URLS: Final[Mapping[AiProvider, str]] = {
    AiProvider.OPENAI: "https://api.openai.com",
    AiProvider.ANTHROPIC: "https://api.anthropic.com",
    AiProvider.GEMINI: "https://generativelanguage.googleapis.com",
}
BASE_URL_ENV: Final[Mapping[AiProvider, str]] = {
    AiProvider.OPENAI: "MEDIAPLANE_OPENAI_BASE_URL",
    AiProvider.ANTHROPIC: "MEDIAPLANE_ANTHROPIC_BASE_URL",
    AiProvider.GEMINI: "MEDIAPLANE_GEMINI_BASE_URL",
}


class ProviderFailed(Exception):
    """The provider answered non-2xx, too late, or unreadably. ``str()`` is the whole error text."""

    def __init__(self, provider: AiProvider, reason: str) -> None:
        super().__init__(f"{provider.value} request failed: {reason}")
        self.provider = provider
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderRequest:
    """One call: who, with which key and model, which prompts, and Anthropic's ``max_tokens``."""

    provider: AiProvider
    api_key: SecretStr
    system: str
    user: str
    model: str | None = None  # None: the provider's default model
    max_tokens: int = 4096  # Anthropic only: 4096 for generate-config, 2048 for analyze and query
    env: Mapping[str, str] | None = field(default=None, repr=False)  # None: os.environ

    @property
    def resolved_model(self) -> str:
        return self.model or DEFAULT_MODELS[self.provider]


def base_url(provider: AiProvider, env: Mapping[str, str] | None = None) -> str:
    """The provider's base URL, without a trailing slash."""
    source = os.environ if env is None else env
    configured = source.get(BASE_URL_ENV[provider], "").strip()
    return (configured or DEFAULT_BASE_URLS[provider]).rstrip("/")


def build_request(request: ProviderRequest) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The URL, headers and JSON body of the call (interop.md 7.6's table)."""
    base = base_url(request.provider, request.env)
    key = request.api_key.get_secret_value()
    model = request.resolved_model
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    body: dict[str, Any]
    if request.provider is AiProvider.OPENAI:
        url = f"{base}/v1/chat/completions"
        headers["Authorization"] = f"Bearer {key}"
        body = {
            "model": model,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": request.user},
            ],
            "temperature": TEMPERATURE,
        }
    elif request.provider is AiProvider.ANTHROPIC:
        url = f"{base}/v1/messages"
        headers["x-api-key"] = key
        headers["anthropic-version"] = ANTHROPIC_VERSION
        body = {
            "model": model,
            "max_tokens": request.max_tokens,
            "system": request.system,
            "messages": [{"role": "user", "content": request.user}],
        }
    else:
        url = f"{base}/v1beta/models/{quote(model, safe='')}:generateContent"
        headers["x-goog-api-key"] = key
        body = {
            "system_instruction": {"parts": [{"text": request.system}]},
            "contents": [{"role": "user", "parts": [{"text": request.user}]}],
            "generationConfig": {"temperature": TEMPERATURE},
        }
    return url, headers, body


def _step(value: Any, key: str | int) -> Any:
    if isinstance(key, int):
        if isinstance(value, list) and len(value) > key:
            return value[key]
        raise LookupError
    if isinstance(value, dict) and key in value:
        return value[key]
    raise LookupError


_REPLY_PATHS: Final[Mapping[AiProvider, tuple[str | int, ...]]] = {
    AiProvider.OPENAI: ("choices", 0, "message", "content"),
    AiProvider.ANTHROPIC: ("content", 0, "text"),
    AiProvider.GEMINI: ("candidates", 0, "content", "parts", 0, "text"),
}


def reply_text(provider: AiProvider, reply: Any) -> str:
    """The reply text at the provider's path; ProviderFailed when it is not there or not text."""
    value = reply
    try:
        for key in _REPLY_PATHS[provider]:
            value = _step(value, key)
    except LookupError:
        raise ProviderFailed(provider, "the reply has no text where expected") from None
    if not isinstance(value, str):
        raise ProviderFailed(provider, "the reply text is not a string")
    return value


async def call_provider(
    request: ProviderRequest,
    *,
    timeout_s: float = PROVIDER_TIMEOUT_S,
    transport: httpx.AsyncBaseTransport | None = None,
) -> str:
    """The provider's reply text. Raises ProviderFailed (never with the key in its text)."""
    provider = request.provider
    url, headers, body = build_request(request)
    content = bytearray()
    with trio.move_on_after(timeout_s) as scope:
        try:
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(timeout_s), follow_redirects=False, transport=transport
            ) as client:
                async with client.stream("POST", url, headers=headers, json=body) as response:
                    status = response.status_code
                    if not 200 <= status < 300:
                        raise ProviderFailed(provider, f"HTTP {status}")
                    async for chunk in response.aiter_bytes():
                        content += chunk
                        if len(content) > MAX_REPLY_BYTES:
                            raise ProviderFailed(provider, "the reply is too large")
        except httpx.TimeoutException:
            raise ProviderFailed(provider, f"no answer within {timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            # The class name only: an httpx message can quote the URL or a header.
            raise ProviderFailed(provider, f"the connection failed ({type(exc).__name__})") from None
    if scope.cancelled_caught:
        raise ProviderFailed(provider, f"no answer within {timeout_s:g} s")
    try:
        parsed = json.loads(bytes(content))
    except (ValueError, RecursionError):
        raise ProviderFailed(provider, "the reply is not JSON") from None
    return reply_text(provider, parsed)
