"""The provider adapters in-process against the fake providers: shapes, headers, failures, timeout."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio
from pydantic import SecretStr

from services.manager.ai import DEFAULT_MODELS, PROVIDER_TIMEOUT_S, ProviderFailed, ProviderRequest, call_provider
from services.manager.ai.providers import BASE_URL_ENV, base_url, build_request
from services.manager.store import AiProvider
from tests.helpers.fake_ai import FakeAi, Provider

KEY = "sk-adapter-9d2f-SECRET-key"


@pytest.fixture(params=list(AiProvider))
def fake(request: pytest.FixtureRequest) -> Iterator[FakeAi]:
    provider: Provider = request.param.value
    with FakeAi(provider) as running:
        yield running


def _request(fake: FakeAi, **kwargs: object) -> ProviderRequest:
    provider = AiProvider(fake.provider)
    fields: dict[str, object] = {
        "provider": provider,
        "api_key": SecretStr(KEY),
        "system": "SYSTEM PROMPT",
        "user": "USER PROMPT",
        "env": {BASE_URL_ENV[provider]: fake.base_url + "/"},
    }
    fields.update(kwargs)
    return ProviderRequest(**fields)  # type: ignore[arg-type]


def test_defaults() -> None:
    assert PROVIDER_TIMEOUT_S == 60.0
    assert DEFAULT_MODELS == {
        AiProvider.OPENAI: "gpt-4.1",
        AiProvider.ANTHROPIC: "claude-sonnet-4-6-20260318",
        AiProvider.GEMINI: "gemini-2.0-flash",
    }
    assert base_url(AiProvider.OPENAI, {}) == "https://api.openai.com"
    assert base_url(AiProvider.ANTHROPIC, {}) == "https://api.anthropic.com"
    assert base_url(AiProvider.GEMINI, {}) == "https://generativelanguage.googleapis.com"
    assert base_url(AiProvider.GEMINI, {"MEDIAPLANE_GEMINI_BASE_URL": "http://x:1/"}) == "http://x:1"


async def test_each_provider_gets_its_own_request_shape(fake: FakeAi) -> None:
    fake.reply_text = "the reply"
    assert await call_provider(_request(fake)) == "the reply"
    [seen] = fake.requests
    provider = AiProvider(fake.provider)
    model = DEFAULT_MODELS[provider]
    assert seen.query == ""
    assert KEY not in seen.path and KEY not in str(seen.body)
    if provider is AiProvider.OPENAI:
        assert seen.path == "/v1/chat/completions"
        assert seen.headers["authorization"] == f"Bearer {KEY}"
        assert seen.body == {
            "model": model,
            "messages": [{"role": "system", "content": "SYSTEM PROMPT"}, {"role": "user", "content": "USER PROMPT"}],
            "temperature": 0.3,
        }
    elif provider is AiProvider.ANTHROPIC:
        assert seen.path == "/v1/messages"
        assert seen.headers["x-api-key"] == KEY
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in seen.headers
        assert seen.body == {
            "model": model,
            "max_tokens": 4096,
            "system": "SYSTEM PROMPT",
            "messages": [{"role": "user", "content": "USER PROMPT"}],
        }
    else:
        assert seen.path == f"/v1beta/models/{model}:generateContent"
        assert seen.headers["x-goog-api-key"] == KEY
        assert "authorization" not in seen.headers
        assert seen.body == {
            "system_instruction": {"parts": [{"text": "SYSTEM PROMPT"}]},
            "contents": [{"role": "user", "parts": [{"text": "USER PROMPT"}]}],
            "generationConfig": {"temperature": 0.3},
        }


async def test_model_preference_and_max_tokens(fake: FakeAi) -> None:
    await call_provider(_request(fake, model="my-model", max_tokens=2048))
    [seen] = fake.requests
    if fake.provider == "gemini":
        assert seen.path == "/v1beta/models/my-model:generateContent"
    else:
        assert seen.body["model"] == "my-model"
    if fake.provider == "anthropic":
        assert seen.body["max_tokens"] == 2048


async def _failure(fake: FakeAi, **kwargs: object) -> str:
    with pytest.raises(ProviderFailed) as caught:
        await call_provider(_request(fake), **kwargs)  # type: ignore[arg-type]
    text = str(caught.value)
    assert text.startswith(f"{fake.provider} request failed: ")
    assert KEY not in text and KEY[:8] not in text
    return text


async def test_a_non_2xx_answer_fails(fake: FakeAi) -> None:
    fake.status = 500
    assert (await _failure(fake)).endswith("HTTP 500")
    fake.status = 401
    assert (await _failure(fake)).endswith("HTTP 401")


async def test_an_unreadable_answer_fails(fake: FakeAi) -> None:
    fake.garbage = True
    assert "not JSON" in await _failure(fake)
    fake.garbage = False
    fake.raw_body = b'{"choices": [], "content": [], "candidates": []}'
    assert "no text" in await _failure(fake)
    fake.raw_body = b'{"choices": [{"message": {"content": 5}}], "content": [{"text": 5}],' + (
        b' "candidates": [{"content": {"parts": [{"text": 5}]}}]}'
    )
    assert "not a string" in await _failure(fake)


async def test_a_slow_answer_times_out(fake: FakeAi) -> None:
    fake.delay_s = 5.0
    started = trio.current_time()
    assert "no answer within 0.3 s" in await _failure(fake, timeout_s=0.3)
    assert trio.current_time() - started < 3


async def test_an_answer_within_the_timeout_is_used(fake: FakeAi) -> None:
    fake.delay_s = 0.3
    fake.reply_text = "late but fine"
    assert await call_provider(_request(fake), timeout_s=5) == "late but fine"


async def test_a_refused_connection_fails() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    request = ProviderRequest(
        provider=AiProvider.OPENAI,
        api_key=SecretStr(KEY),
        system="s",
        user="u",
        env={"MEDIAPLANE_OPENAI_BASE_URL": f"http://127.0.0.1:{port}"},
    )
    with pytest.raises(ProviderFailed, match=r"^openai request failed: the connection failed \(ConnectError\)$"):
        await call_provider(request)


def test_the_key_is_never_in_the_url_or_repr() -> None:
    for provider in AiProvider:
        request = ProviderRequest(provider=provider, api_key=SecretStr(KEY), system="s", user="u", env={})
        url, _, body = build_request(request)
        assert KEY not in url and KEY not in str(body) and KEY not in repr(request)
