"""AI-assisted flow management, analysis and queries for the manager (interop.md 7.6).

- :mod:`.prompts` builds the system prompts (generate-config's five parts, analyze, query);
- :mod:`.replies` turns a provider's reply text into the ``config`` action envelope;
- :mod:`.providers` calls OpenAI, Anthropic or Gemini over httpx (async, under trio);
- :mod:`.assistant` ties them to the store (encrypted keys) and the node hub (context).
"""

from __future__ import annotations

from .providers import DEFAULT_MODELS, PROVIDER_TIMEOUT_S, ProviderFailed, ProviderRequest, call_provider
from .replies import parse_reply, strip_code_fence

__all__ = [
    "DEFAULT_MODELS",
    "PROVIDER_TIMEOUT_S",
    "ProviderFailed",
    "ProviderRequest",
    "call_provider",
    "parse_reply",
    "strip_code_fence",
]
