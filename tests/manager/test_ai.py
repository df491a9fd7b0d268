"""``/api/v1/ai/*`` against a real ``mp-manager serve`` whose providers are local fakes (interop.md 7.6).

The manager runs with ``MEDIAPLANE_{OPENAI,ANTHROPIC,GEMINI}_BASE_URL`` pointing at three
:class:`~tests.helpers.fake_ai.FakeAi` servers on 127.0.0.1; each test checks what the fake
received (path, headers, body, model) and what the manager answered. The last test checks that
the API keys never appeared in any answer, the manager's log or its data files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pydantic import SecretStr

from appliance.protocol import NodeCredentials
from services.manager.ai.assistant import no_key_message
from services.manager.ai.prompts import ACTIONS_PART, ROLE_PART, SCHEMA_PART
from services.manager.store import AiProvider, NewNode, NodeStatus, Store, sqlite_url
from tests.helpers.fake_ai import FakeAi, Provider, SeenRequest
from tests.helpers.manager import Manager, login, manager_env, start_manager
from tests.helpers.test_node import connect_node
from tests.manager.test_auth import prepared_data_dir

pytestmark = pytest.mark.e2e

PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic", "gemini")
KEYS = {provider: f"{provider}-KEY-c0ffee-{index}-never-echoed-7b1e" for index, provider in enumerate(PROVIDERS)}
OPERATOR_KEY = "operator-KEY-feedface-2d9a-never-echoed"
PASSWORDS = {"viewer": "Viewer-Pw0rd-v1", "operator": "Operator-Pw0rd-o1"}
OFFLINE_NODE = "studio-b-offline"
FLOW = {"id": "cam-1", "name": "Camera 1", "input": {"type": "udp", "bind_addr": "0.0.0.0:9000"}, "outputs": []}
BODIES: list[str] = []


def _record(response: httpx.Response) -> None:
    response.read()
    BODIES.append(response.text)


class Fakes(dict[Provider, FakeAi]):
    def reset(self) -> None:
        for fake in self.values():
            fake.requests.clear()
            fake.status, fake.garbage, fake.delay_s, fake.raw_body = 200, False, 0.0, None
            fake.reply_text = '{"action": "info", "message": "fake"}'


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with contextlib.ExitStack() as stack:
        yield Fakes({provider: stack.enter_context(FakeAi(provider)) for provider in PROVIDERS})


@pytest.fixture(scope="module")
def manager(tmp_path_factory: pytest.TempPathFactory, fakes: Fakes) -> Iterator[Manager]:
    data_dir = prepared_data_dir(tmp_path_factory.mktemp("ai"))

    async def add_offline_node() -> None:
        async with await Store.open(sqlite_url(data_dir)) as store:
            await store.create_node(NewNode(name=OFFLINE_NODE, registration_token_digest="0" * 64))

    trio.run(add_offline_node)
    env = manager_env(**{f"MEDIAPLANE_{p.upper()}_BASE_URL": fake.base_url for p, fake in fakes.items()})
    started = start_manager(data_dir, env=env)
    try:
        with client_of(started) as root:
            assert login(root).status_code == 200
            for role, password in PASSWORDS.items():
                r = root.post("/api/v1/users", json={"username": f"the-{role}", "password": password, "role": role})
                assert r.status_code == 201, r.text
        yield started
    finally:
        started.stop()


def client_of(manager: Manager) -> httpx.Client:
    return manager.client(event_hooks={"response": [_record]})


@pytest.fixture
def root(manager: Manager, fakes: Fakes) -> Iterator[httpx.Client]:
    fakes.reset()
    with client_of(manager) as c:
        assert login(c).status_code == 200
        yield c


@contextlib.contextmanager
def as_role(manager: Manager, role: str) -> Iterator[httpx.Client]:
    with client_of(manager) as c:
        assert login(c, f"the-{role}", PASSWORDS[role]).status_code == 200
        yield c


def store_key(client: httpx.Client, provider: Provider, model: str | None = None) -> None:
    body: dict[str, Any] = {"provider": provider, "api_key": KEYS[provider]}
    if model is not None:
        body["model_preference"] = model
    r = client.post("/api/v1/ai/keys", json=body)
    assert (r.status_code, r.json()) == (200, {"success": True}), r.text


def system_and_user(provider: Provider, seen: SeenRequest) -> tuple[str, str]:
    body = seen.body
    if provider == "openai":
        return body["messages"][0]["content"], body["messages"][1]["content"]
    if provider == "anthropic":
        return body["system"], body["messages"][0]["content"]
    return body["system_instruction"]["parts"][0]["text"], body["contents"][0]["parts"][0]["text"]


# --- access ----------------------------------------------------------------------------------


def test_ai_routes_need_an_operator(manager: Manager) -> None:
    with client_of(manager) as anonymous:
        assert anonymous.get("/api/v1/ai/keys").status_code == 401
    with as_role(manager, "viewer") as viewer:
        assert viewer.get("/api/v1/ai/keys").status_code == 403
        r = viewer.post("/api/v1/ai/query", json={"query": "hi"})
        assert r.status_code == 403
    with as_role(manager, "operator") as operator:
        assert operator.get("/api/v1/ai/keys").status_code == 200
        del operator.headers["X-CSRF-Token"]
        assert operator.post("/api/v1/ai/keys", json={"provider": "openai", "api_key": "x"}).status_code == 403


# --- keys ------------------------------------------------------------------------------------


def test_keys_are_upserted_listed_without_the_key_and_deleted(root: httpx.Client) -> None:
    store_key(root, "openai")
    store_key(root, "anthropic", "claude-custom")
    listed = root.get("/api/v1/ai/keys").json()
    assert [entry["provider"] for entry in listed] == ["anthropic", "openai"]
    for entry in listed:
        assert set(entry) == {"id", "provider", "model_preference", "configured", "updated_at"}
        assert entry["configured"] is True and entry["updated_at"].endswith("Z")
    assert {e["provider"]: e["model_preference"] for e in listed} == {"anthropic": "claude-custom", "openai": None}
    store_key(root, "openai", "gpt-custom")  # upsert: still one openai row
    listed = root.get("/api/v1/ai/keys").json()
    assert {e["provider"]: e["model_preference"] for e in listed} == {
        "anthropic": "claude-custom",
        "openai": "gpt-custom",
    }
    r = root.request("DELETE", "/api/v1/ai/keys", json={"provider": "anthropic"})
    assert (r.status_code, r.json()) == (200, {"success": True})
    assert root.request("DELETE", "/api/v1/ai/keys", json={"provider": "anthropic"}).status_code == 404
    assert [e["provider"] for e in root.get("/api/v1/ai/keys").json()] == ["openai"]
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": "openai"})


def test_keys_are_per_user(manager: Manager, root: httpx.Client) -> None:
    store_key(root, "gemini")
    with as_role(manager, "operator") as operator:
        assert operator.get("/api/v1/ai/keys").json() == []
        r = operator.post("/api/v1/ai/keys", json={"provider": "gemini", "api_key": OPERATOR_KEY})
        assert r.status_code == 200
        assert [e["provider"] for e in operator.get("/api/v1/ai/keys").json()] == ["gemini"]
        assert operator.request("DELETE", "/api/v1/ai/keys", json={"provider": "gemini"}).status_code == 200
    assert [e["provider"] for e in root.get("/api/v1/ai/keys").json()] == ["gemini"]
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": "gemini"})


@pytest.mark.parametrize(
    "body",
    [
        {"provider": "openai", "api_key": ""},
        {"provider": "openai", "api_key": "k" * 257},
        {"provider": "openai", "api_key": 12345},
        {"provider": "mistral", "api_key": "k"},
        {"api_key": "k"},
        {"provider": "openai", "api_key": "k", "model_preference": "m" * 129},
        {"provider": "openai", "api_key": "k", "surprise": 1},
    ],
)
def test_bad_key_bodies_are_400_without_echoing_them(root: httpx.Client, body: dict[str, Any]) -> None:
    r = root.post("/api/v1/ai/keys", json=body)
    assert r.status_code == 400
    assert "k" * 20 not in r.text and "mistral" not in r.text
    assert root.get("/api/v1/ai/keys").json() == []


def test_the_longest_key_and_model_are_accepted(root: httpx.Client) -> None:
    r = root.post("/api/v1/ai/keys", json={"provider": "openai", "api_key": "k" * 256, "model_preference": "m" * 128})
    assert r.status_code == 200
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": "openai"})


# --- generate-config -------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["generate-config", "analyze", "query"])
@pytest.mark.parametrize("provider", [None, *PROVIDERS])
def test_no_key_is_400_with_the_exact_text(root: httpx.Client, fakes: Fakes, route: str, provider: str | None) -> None:
    field = {"generate-config": "prompt", "analyze": "description", "query": "query"}[route]
    body: dict[str, Any] = {field: "make me a flow"}
    if provider is not None:
        body["provider"] = provider
    r = root.post(f"/api/v1/ai/{route}", json=body)
    named = provider or "openai"
    assert r.status_code == 400
    assert r.json() == {"success": False, "error": f"No {named} API key configured. Add one under AI Keys."}
    assert r.json()["error"] == no_key_message(AiProvider(named))
    assert all(not fake.requests for fake in fakes.values())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_generate_config_calls_the_provider_and_parses_the_reply(
    root: httpx.Client, fakes: Fakes, provider: Provider
) -> None:
    store_key(root, provider)
    fake = fakes[provider]
    fake.reply_text = f"```json\n{json.dumps(FLOW)}\n```"
    body = {"prompt": "An SRT listener on 9001", "provider": provider, "existing_flows": [FLOW]}
    r = root.post("/api/v1/ai/generate-config", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "success": True,
        "config": {"action": "create_flow", "flow": FLOW, "message": "Generated flow configuration"},
        "raw_response": fake.reply_text,
    }
    [seen] = fake.requests
    assert seen.query == ""
    system, user = system_and_user(provider, seen)
    assert user == "An SRT listener on 9001"
    parts = [ROLE_PART, SCHEMA_PART, json.dumps([FLOW], separators=(",", ":")), OFFLINE_NODE, ACTIONS_PART]
    positions = [system.index(part) for part in parts]
    assert positions == sorted(positions)
    nodes = json.loads(system.split("Available nodes:\n", 1)[1].split("\n", 1)[0])
    assert [(n["name"], n["device_type"], n["status"]) for n in nodes] == [(OFFLINE_NODE, "edge", "pending")]
    assert set(nodes[0]) == {"id", "name", "device_type", "status"}
    if provider == "openai":
        assert seen.path == "/v1/chat/completions"
        assert seen.headers["authorization"] == f"Bearer {KEYS[provider]}"
        assert seen.body["model"] == "gpt-4.1" and seen.body["temperature"] == 0.3
        assert [m["role"] for m in seen.body["messages"]] == ["system", "user"]
        assert set(seen.body) == {"model", "messages", "temperature"}
    elif provider == "anthropic":
        assert seen.path == "/v1/messages"
        assert seen.headers["x-api-key"] == KEYS[provider]
        assert seen.headers["anthropic-version"] == "2023-06-01"
        assert seen.body["model"] == "claude-sonnet-4-6-20260318" and seen.body["max_tokens"] == 4096
        assert set(seen.body) == {"model", "max_tokens", "system", "messages"}
    else:
        assert seen.path == "/v1beta/models/gemini-2.0-flash:generateContent"
        assert seen.headers["x-goog-api-key"] == KEYS[provider]
        assert "authorization" not in seen.headers
        assert seen.body["generationConfig"] == {"temperature": 0.3}
        assert set(seen.body) == {"system_instruction", "contents", "generationConfig"}
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": provider})


@pytest.mark.parametrize("provider", PROVIDERS)
def test_model_preference_overrides_the_default(root: httpx.Client, fakes: Fakes, provider: Provider) -> None:
    store_key(root, provider, "my-model-1")
    r = root.post("/api/v1/ai/query", json={"query": "How many nodes?", "provider": provider})
    assert r.json() == {"success": True, "response": '{"action": "info", "message": "fake"}'}
    [seen] = fakes[provider].requests
    if provider == "gemini":
        assert seen.path == "/v1beta/models/my-model-1:generateContent"
    else:
        assert seen.body["model"] == "my-model-1"
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": provider})


def test_provider_defaults_to_openai_and_text_becomes_info(root: httpx.Client, fakes: Fakes) -> None:
    store_key(root, "openai")
    fakes["openai"].reply_text = "  I need to know the port.  "
    r = root.post("/api/v1/ai/generate-config", json={"prompt": "make a flow"})
    assert r.json() == {
        "success": True,
        "config": {"action": "info", "message": "I need to know the port."},
        "raw_response": "  I need to know the port.  ",
    }
    system, _ = system_and_user("openai", fakes["openai"].requests[0])
    assert "Current flows:\n[]" in system
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": "openai"})


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "p" * 10_001},
        {"prompt": 5},
        {},
        {"prompt": "x", "provider": "mistral"},
        {"prompt": "x", "existing_flows": {}},
        {"prompt": "x", "node_id": "not-a-uuid"},
    ],
)
def test_bad_generate_bodies_are_400(root: httpx.Client, body: dict[str, Any]) -> None:
    assert root.post("/api/v1/ai/generate-config", json=body).status_code == 400


def test_analyze_and_query_use_2048_tokens_and_their_prompts(root: httpx.Client, fakes: Fakes) -> None:
    store_key(root, "anthropic")
    fake = fakes["anthropic"]
    fake.reply_text = '{"findings": [], "suggestions": ["none"]}'
    r = root.post("/api/v1/ai/analyze", json={"description": "loss on cam-1", "provider": "anthropic"})
    assert r.json() == {"success": True, "response": fake.reply_text}
    r = root.post("/api/v1/ai/query", json={"query": "which nodes are down?", "provider": "anthropic"})
    assert r.json() == {"success": True, "response": fake.reply_text}
    analyze, query = fake.requests
    assert analyze.body["max_tokens"] == 2048 and query.body["max_tokens"] == 2048
    assert "findings" in analyze.body["system"] and "Node statistics" in analyze.body["system"]
    assert OFFLINE_NODE in analyze.body["system"]
    assert analyze.body["messages"] == [{"role": "user", "content": "loss on cam-1"}]
    assert "terse" in query.body["system"] and OFFLINE_NODE in query.body["system"]
    assert query.body["messages"] == [{"role": "user", "content": "which nodes are down?"}]
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": "anthropic"})


# --- provider failures -----------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("failure", ["status500", "status401", "garbage", "no_text"])
def test_provider_failures_are_200_success_false(
    root: httpx.Client, fakes: Fakes, provider: Provider, failure: str
) -> None:
    store_key(root, provider)
    fake = fakes[provider]
    if failure == "status500":
        fake.status = 500
    elif failure == "status401":
        fake.status = 401
    elif failure == "garbage":
        fake.garbage = True
    else:
        fake.raw_body = b"{}"
    for route, field in (("generate-config", "prompt"), ("analyze", "description"), ("query", "query")):
        r = root.post(f"/api/v1/ai/{route}", json={field: "hello", "provider": provider})
        assert r.status_code == 200
        answer = r.json()
        assert set(answer) == {"success", "error"} and answer["success"] is False
        assert answer["error"].startswith(f"{provider} request failed: ")
        assert KEYS[provider] not in answer["error"]
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": provider})


def test_a_slow_provider_within_the_limit_is_waited_for(root: httpx.Client, fakes: Fakes) -> None:
    store_key(root, "gemini")
    fakes["gemini"].delay_s = 1.5
    fakes["gemini"].reply_text = "slow but here"
    r = root.post("/api/v1/ai/query", json={"query": "status?", "provider": "gemini"})
    assert r.json() == {"success": True, "response": "slow but here"}
    root.request("DELETE", "/api/v1/ai/keys", json={"provider": "gemini"})


# --- an online node's cached flows -----------------------------------------------------------


async def test_an_online_nodes_cached_flows_replace_existing_flows(manager: Manager, fakes: Fakes) -> None:
    fakes.reset()
    token = "3f2b8c1e-6a7d-4e59-9b0c-1d2e3f4a5b6c"
    live_flow = {"id": "live-flow", "name": "Live", "input": {"type": "srt", "mode": "listener"}, "outputs": []}
    async with await Store.open(sqlite_url(manager.data_dir)) as store:
        digest = hashlib.sha256(token.encode()).hexdigest()
        node_id = (await store.create_node(NewNode(name="ob-truck-live", registration_token_digest=digest))).id
        context = ssl.create_default_context(cafile=str(manager.cert_path))
        url = f"wss://127.0.0.1:{manager.port}/ws/node"
        credentials = NodeCredentials(registration_token=SecretStr(token))
        async with connect_node(url, context, credentials, send_auth=False) as node:
            node.config = {"version": 1, "flows": [live_flow]}
            await node.ws.send_message(node.session.start(trio.current_time()))
            await node.wait_authenticated()
            with trio.fail_after(10):
                while (await store.get_cached_config(node_id)) is None:
                    await trio.sleep(0.05)

            offline_id = next(n.id for n in await store.list_nodes() if n.name == OFFLINE_NODE)

            def ask(node_ref: str) -> list[httpx.Response]:
                with client_of(manager) as c:
                    assert login(c).status_code == 200
                    store_key(c, "openai")
                    answers = [
                        c.post(
                            "/api/v1/ai/generate-config",
                            json={"prompt": "add an output", "node_id": ref, "existing_flows": [FLOW]},
                        )
                        for ref in (node_ref, str(offline_id))
                    ]
                    c.request("DELETE", "/api/v1/ai/keys", json={"provider": "openai"})
                    return answers

            online, offline = await trio.to_thread.run_sync(ask, str(node_id))
            assert online.json()["success"] is True and offline.json()["success"] is True
        with trio.fail_after(10):
            while getattr(await store.get_node(node_id), "status", None) is not NodeStatus.OFFLINE:
                await trio.sleep(0.05)
    first, second = fakes["openai"].requests
    system, _ = system_and_user("openai", first)
    flows = json.loads(system.split("Current flows:\n", 1)[1].split("\n", 1)[0])
    assert flows == [live_flow]
    nodes = json.loads(system.split("Available nodes:\n", 1)[1].split("\n", 1)[0])
    assert {(n["name"], n["status"]) for n in nodes} >= {("ob-truck-live", "online"), (OFFLINE_NODE, "pending")}
    system, _ = system_and_user("openai", second)
    assert json.loads(system.split("Current flows:\n", 1)[1].split("\n", 1)[0]) == [FLOW]


# --- leaks (keep last) -----------------------------------------------------------------------


def test_no_key_ever_leaked(manager: Manager) -> None:
    secrets = [*KEYS.values(), OPERATOR_KEY]
    assert BODIES
    for body in BODIES:
        for secret in secrets:
            assert secret not in body
    log = manager.log()
    assert "request failed" in log  # the failures were logged, without the keys
    files = [path for path in Path(manager.data_dir).rglob("*") if path.is_file()]
    assert any(path.suffix == ".db" for path in files), files  # the store, with the encrypted keys
    for secret in secrets:
        assert secret not in log
        for path in files:
            assert secret.encode() not in path.read_bytes(), path
