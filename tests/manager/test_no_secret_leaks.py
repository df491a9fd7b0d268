"""One whole run of a real ``mp-manager serve`` that greps every answer and the whole log for
every secret it set (interop.md 6, 7.1, 7.6, 7.7, 13).

The run sets its own ``MEDIAPLANE_JWT_SECRET`` and ``MEDIAPLANE_MASTER_KEY``, passwords (the
admin's, an operator's changed twice, a rejected weak one, wrong login passwords), gets session
JWTs and CSRF tokens, registration tokens and node secrets (an edge over WSS with the test node,
a re-registration after a new token, a ``rotate_secret``, a relay with ``authorize_tunnel``
tokens), AI keys of the three providers (a stand-in provider that echoes the key in its error
bodies), a TLS key pair upload, and rejected inputs carrying a marker. Then every response body
and header (Set-Cookie aside), every dashboard frame, the CLI outputs, the export (route and
``mp-manager export`` file) and the whole service log must hold none of them, in the forms a
leak could take (as set, URL-encoded, JSON-escaped, base64 at any alignment, and for the two
hex secrets the base64 of their bytes and upper-case hex). The manager runs at ``--log-level
debug`` (the access log and every library's debug lines included), and one client speaks HTTP/2.

Where a secret legitimately appears, that one response is exempt: the registration token in
the ``POST /nodes`` or ``POST /nodes/{id}/token`` answer that creates it (interop.md 7.2), the
CSRF token in its own login answer (7.1). The SRT ``passphrase`` of a node's config is not an
infrastructure secret (2.7: ``config_response`` carries it so operators can see it) and the
manager relays and caches configs verbatim (13), so it is expected in ``PUT``/``GET
/nodes/{id}/config`` answers, and only there.
"""

from __future__ import annotations

import base64
import json
import math
import re
import secrets
import shutil
import ssl
import string
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest
import trio
from pydantic import SecretStr
from trio_websocket import open_websocket_url

from appliance.protocol import DeviceType, NodeCredentials
from tests.helpers.fake_ai import Provider, reply_body
from tests.helpers.manager import MANAGER_BIN, Manager, manager_env, start_manager
from tests.helpers.test_node import TestNode, connect_node
from tests.manager.certs import ca_signed_pair

pytestmark = pytest.mark.e2e

ADMIN = "root"
OPERATOR = "operator-1"


# --- the secrets and where they may appear ------------------------------------------------


def password(label: str) -> str:
    """A valid password (upper, lower, digit) that is greppable and unique to this run."""
    return f"Pw7-{label}-{secrets.token_hex(10)}"


def marker(label: str) -> str:
    return f"MARK{label}{secrets.token_hex(10)}"


def _base64_cores(data: bytes) -> set[str]:
    """The base64 characters that depend on ``data`` alone, at each of the 3 alignments."""
    cores: set[str] = set()
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b"\0" * shift + data).decode()
            cores.add(text[math.ceil(8 * shift / 6) : (8 * (shift + len(data))) // 6])
    return cores


def leak_forms(value: str) -> dict[str, str]:
    """The texts a leak of ``value`` could take, each with what it is."""
    forms = {value: "as set"}
    forms.setdefault(quote(value, safe=""), "URL-encoded")
    forms.setdefault(json.dumps(value)[1:-1], "JSON-escaped")
    for core in _base64_cores(value.encode()):
        forms.setdefault(core, "base64")
    if re.fullmatch(r"(?:[0-9a-f]{2})+", value):
        forms.setdefault(value.upper(), "upper-case hex")
        for core in _base64_cores(bytes.fromhex(value)):
            forms.setdefault(core, "base64 of the hex bytes")
    return {text: kind for text, kind in forms.items() if len(text) >= 12}


@dataclass
class Seen:
    where: str
    text: str
    allowed: set[str] = field(default_factory=set)
    response: httpx.Response | None = None


@dataclass
class Run:
    """Every secret set (name → value) and everything the run saw come back."""

    secrets: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def secret(self, name: str, value: str) -> str:
        assert name not in self.secrets, name
        self.secrets[name] = value
        return value

    async def on_response(self, response: httpx.Response) -> None:
        await response.aread()
        headers = "\n".join(f"{k}: {v}" for k, v in response.headers.multi_items() if k.lower() != "set-cookie")
        where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
        self.seen.append(Seen(where, f"{headers}\n\n{response.text}", response=response))

    def allow(self, response: httpx.Response, value: str) -> None:
        """``value`` may appear in this one answer (its legitimate place)."""
        matches = [seen for seen in self.seen if seen.response is response]
        assert len(matches) == 1
        matches[0].allowed.add(value)

    def add(self, where: str, text: str) -> None:
        self.seen.append(Seen(where, text))

    def cli(self, where: str, done: subprocess.CompletedProcess[str]) -> None:
        self.add(f"{where} (stdout)", done.stdout)
        self.add(f"{where} (stderr)", done.stderr)

    def leaks(self) -> list[str]:
        found: list[str] = []
        for name, value in self.secrets.items():
            forms = leak_forms(value)
            for seen in self.seen:
                if value in seen.allowed:
                    continue
                for text, kind in forms.items():
                    if text in seen.text:
                        found.append(f"{name} ({kind}) in {seen.where}")
                        break
        return found


# --- a stand-in for the three AI providers that echoes the key in its errors ---------------


@dataclass
class EchoingProviders:
    """OpenAI, Anthropic and Gemini at one local URL (chosen by path), like ``FakeAi``; a
    provider listed in ``failing`` answers that status with a body quoting the key it got,
    as real providers do for a rejected key."""

    failing: dict[str, int] = field(default_factory=dict)
    keys_seen: list[tuple[str, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[EchoingProviders]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urlsplit(self.path).path
                provider: Provider
                if path == "/v1/chat/completions":
                    provider, key = "openai", self.headers.get("Authorization", "").removeprefix("Bearer ")
                elif path == "/v1/messages":
                    provider, key = "anthropic", self.headers.get("x-api-key", "")
                else:
                    provider, key = "gemini", self.headers.get("x-goog-api-key", "")
                fake.keys_seen.append((provider, key))
                status = fake.failing.get(provider)
                if status is None:
                    text = '{"action": "info", "message": "nothing to change"}'
                    payload = json.dumps(reply_body(provider, text)).encode()
                    status = 200
                else:
                    echoed = {"message": f"Incorrect API key provided: {key}", "key": key, "type": "auth"}
                    payload = json.dumps({"error": echoed}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Echoed-Key", key)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(5)


# --- driving the manager --------------------------------------------------------------------


@dataclass
class Harness:
    run: Run
    manager: Manager
    context: ssl.SSLContext
    env: dict[str, str]

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.manager.url,
            verify=self.context,
            timeout=20,
            event_hooks={"response": [self.run.on_response]},
            **kwargs,
        )

    async def log_in(self, client: httpx.AsyncClient, username: str, password: str) -> str:
        """Logs ``client`` in (cookies and the CSRF header); the session JWT."""
        r = await client.post("/api/v1/auth/login", json={"username": username, "password": password})
        assert r.status_code == 200, r.text
        csrf = r.json()["csrf_token"]
        self.run.secret(f"CSRF token #{len(self.run.secrets)} ({username})", csrf)
        self.run.allow(r, csrf)
        jwt = r.cookies["session"]
        self.run.secret(f"session JWT #{len(self.run.secrets)} ({username})", jwt)
        client.headers["X-CSRF-Token"] = csrf
        return jwt

    @asynccontextmanager
    async def logged_in(self, username: str, password: str) -> AsyncIterator[httpx.AsyncClient]:
        async with self.client() as client:
            await self.log_in(client, username, password)
            yield client

    async def cli(self, where: str, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [str(MANAGER_BIN), *args, "--data-dir", str(self.manager.data_dir)],
                input=stdin,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )
        self.run.cli(where, done)
        return done

    @property
    def node_url(self) -> str:
        return f"wss://127.0.0.1:{self.manager.port}/ws/node"

    async def create_node(self, root: httpx.AsyncClient, name: str, device_type: str = "edge") -> tuple[str, str]:
        r = await root.post("/api/v1/nodes", json={"name": name, "device_type": device_type})
        assert r.status_code == 201, r.text
        token = self.run.secret(f"registration token of {name}", r.json()["registration_token"])
        self.run.allow(r, token)
        return r.json()["id"], token

    def track_node_secret(self, node: TestNode, name: str) -> str:
        assert node.registered is not None
        return self.run.secret(name, node.registered.node_secret.get_secret_value())


async def wait_status(client: httpx.AsyncClient, node_id: str, status: str) -> None:
    with trio.fail_after(10):
        while (await client.get(f"/api/v1/nodes/{node_id}")).json()["status"] != status:
            await trio.sleep(0.05)


async def wait_log(manager: Manager, text: str, count: int = 1) -> None:
    with trio.fail_after(10):
        while manager.log().count(text) < count:
            await trio.sleep(0.05)


async def users_and_sessions(h: Harness, root: httpx.AsyncClient, admin_password: str) -> tuple[str, str]:
    """Passwords set, changed, rejected and mistyped; logins, Bearer use, logout. The
    operator's id and current password."""
    run = h.run
    first = run.secret("operator password (created)", password("op-first"))
    r = await root.post("/api/v1/users", json={"username": OPERATOR, "password": first, "role": "operator"})
    assert r.status_code == 201, r.text
    operator_id = r.json()["id"]
    weak = run.secret(
        "weak password (rejected)", "weak" + "".join(secrets.choice(string.ascii_lowercase) for _ in range(20))
    )
    r = await root.post("/api/v1/users", json={"username": "weakling", "password": weak, "role": "viewer"})
    assert r.status_code == 400
    assert (await root.put(f"/api/v1/users/{operator_id}", json={"password": weak})).status_code == 400
    second = run.secret("operator password (changed)", password("op-second"))
    assert (await root.put(f"/api/v1/users/{operator_id}", json={"password": second})).status_code == 200
    assert (await root.get("/api/v1/users")).status_code == 200
    assert (await root.get(f"/api/v1/users/{operator_id}")).status_code == 200

    async with h.client() as anonymous:
        wrong = run.secret("wrong login password", password("wrong"))
        r = await anonymous.post("/api/v1/auth/login", json={"username": ADMIN, "password": wrong})
        assert r.status_code == 401
        r = await anonymous.post("/api/v1/auth/login", json={"username": OPERATOR, "password": first})
        assert r.status_code == 401  # the old password no longer works
        overlong = run.secret("overlong login password", marker("pw") * 8)
        r = await anonymous.post("/api/v1/auth/login", json={"username": ADMIN, "password": overlong})
        assert r.status_code == 400
        long_name = run.secret("overlong username", marker("user") * 4)
        r = await anonymous.post("/api/v1/auth/login", json={"username": long_name, "password": admin_password})
        assert r.status_code == 400
        assert (await anonymous.get("/api/v1/users")).status_code == 401

    long_name2 = run.secret("overlong username (create)", marker("newuser") * 4)
    r = await root.post("/api/v1/users", json={"username": long_name2, "password": second, "role": "viewer"})
    assert r.status_code == 400

    # A Bearer client (no cookies) and a logout; the revoked JWT is then refused.
    async with h.client() as browser:
        jwt = await h.log_in(browser, ADMIN, admin_password)
        csrf = browser.headers["X-CSRF-Token"]
        async with h.client(headers={"Authorization": f"Bearer {jwt}", "X-CSRF-Token": csrf}) as api:
            assert (await api.get("/api/v1/nodes")).status_code == 200
            assert (await api.get("/api/v1/settings")).status_code == 200
            assert (await api.post("/api/v1/auth/logout")).status_code == 200
            assert (await api.get("/api/v1/nodes")).status_code == 401
        assert (await browser.get("/api/v1/users")).status_code == 401
    return operator_id, second


async def rejected_inputs(h: Harness, root: httpx.AsyncClient) -> None:
    """interop.md 13: a rejected input is never echoed."""
    run = h.run
    json_type = {"Content-Type": "application/json"}
    bad_json = run.secret("marker in a malformed JSON body", marker("badjson"))
    r = await root.post("/api/v1/users", content=f'{{"username": "{bad_json}", '.encode(), headers=json_type)
    assert r.status_code == 400
    not_object = run.secret("marker in a JSON array body", marker("array"))
    r = await root.post("/api/v1/nodes", content=json.dumps([not_object]).encode(), headers=json_type)
    assert r.status_code == 400
    wrong_type = run.secret("marker in a text/plain body", marker("plain"))
    r = await root.post("/api/v1/nodes", content=wrong_type.encode(), headers={"Content-Type": "text/plain"})
    assert r.status_code == 400
    unknown = run.secret("marker as an unknown key's value", marker("unknown"))
    r = await root.post("/api/v1/nodes", json={"name": "n", "bogus": unknown})
    assert r.status_code == 400
    r = await root.post(
        "/api/v1/users", json={"username": "u", "password": "Aa1aaaaaaa", "role": "viewer", "x": unknown}
    )
    assert r.status_code == 400
    r = await root.put("/api/v1/settings", json={"settings": {"no_such_setting": unknown}})
    assert r.status_code == 400
    bad_value = run.secret("marker as a setting's value", marker("setting"))
    r = await root.put("/api/v1/settings", json={"settings": {"events_retention_days": bad_value}})
    assert r.status_code == 400
    bad_role = run.secret("marker as a role", marker("role"))
    r = await root.post("/api/v1/users", json={"username": "u", "password": "Aa1aaaaaaa", "role": bad_role})
    assert r.status_code == 400
    bad_kind = run.secret("marker as a device type", marker("kind"))
    r = await root.post("/api/v1/nodes", json={"name": "n", "device_type": bad_kind})
    assert r.status_code == 400
    search = run.secret("overlong event search", marker("search") * 12)
    assert (await root.get("/api/v1/events", params={"search": search})).status_code == 400


async def nodes(h: Harness, root: httpx.AsyncClient, operator: httpx.AsyncClient) -> str:
    """Registration tokens, node secrets, a rotation, config secrets and relay tunnel tokens;
    the edge node's id."""
    run = h.run
    edge_id, token = await h.create_node(root, "edge-1")
    first_credentials = NodeCredentials(registration_token=SecretStr(token))
    async with connect_node(h.node_url, h.context, first_credentials) as node:
        await node.wait_authenticated()
        h.track_node_secret(node, "node secret of edge-1")
        await wait_status(root, edge_id, "online")
        assert (await root.get("/api/v1/nodes")).status_code == 200
        assert (await root.get(f"/api/v1/nodes/{edge_id}")).status_code == 200
        assert (await root.put(f"/api/v1/nodes/{edge_id}", json={"description": "truck"})).status_code == 200
        assert (await root.get("/api/v1/device-types")).status_code == 200

        # A config with an SRT passphrase: relayed verbatim, cached, served by the config route only.
        passphrase = run.secret("SRT passphrase in a node config", f"srt-{secrets.token_hex(12)}")
        output = {"type": "srt", "id": "out-b", "mode": "caller", "remote_addr": "203.0.113.7:9000"}
        config = {
            "version": 1,
            "flows": [{"id": "cam1", "name": "Camera 1", "outputs": [output | {"passphrase": passphrase}]}],
        }
        node.config = config
        r = await operator.put(f"/api/v1/nodes/{edge_id}/config", json=config)
        assert r.status_code == 200, r.text
        run.allow(r, passphrase)
        with trio.fail_after(10):
            while True:
                r = await operator.get(f"/api/v1/nodes/{edge_id}/config")
                run.allow(r, passphrase)
                if r.status_code == 200 and r.json() == config:
                    break
                await trio.sleep(0.05)

        # Tunnel secrets in a relayed command: the ack carries none of them.
        psk = run.secret("tunnel PSK in a command", f"psk-{secrets.token_hex(16)}")
        tunnel = {"id": "t1", "mode": "relay", "tunnel_psk": psk, "tunnel_encryption_key": secrets.token_hex(32)}
        run.secret("tunnel encryption key in a command", tunnel["tunnel_encryption_key"])
        r = await operator.post(
            f"/api/v1/nodes/{edge_id}/command", json={"action": {"type": "create_tunnel", "tunnel": tunnel}}
        )
        assert r.status_code == 200, r.text
        unsupported = run.secret("marker as a command type", marker("action"))
        r = await operator.post(f"/api/v1/nodes/{edge_id}/command", json={"action": {"type": unsupported}})
        assert r.status_code == 400

        # rotate_secret: the new secret works once acked, and is never shown.
        rotated = run.secret("rotated node secret", str(uuid.uuid4()))
        r = await root.post(
            f"/api/v1/nodes/{edge_id}/command", json={"action": {"type": "rotate_secret", "new_secret": rotated}}
        )
        assert r.status_code == 200, r.text

        # A frame the manager drops, carrying a marker.
        dropped = run.secret("marker in a dropped node frame", marker("frame"))
        frame = {"type": dropped, "timestamp": "2026-01-01T00:00:00Z", "payload": {"x": dropped}}
        await node.send_raw(json.dumps(frame))
        await node.send_raw(json.dumps({"type": "stats", "timestamp": dropped, "payload": {"x": dropped}}))
        await wait_log(h.manager, "frame from node", 2)

        # The dashboard stream while the node is online.
        await dashboard_frames(h)

    async with connect_node(
        h.node_url, h.context, NodeCredentials(node_id=edge_id, node_secret=SecretStr(rotated))
    ) as node:
        await node.wait_authenticated()
        await wait_status(root, edge_id, "online")
    wrong = run.secret("wrong node secret", str(uuid.uuid4()))
    async with connect_node(
        h.node_url, h.context, NodeCredentials(node_id=edge_id, node_secret=SecretStr(wrong))
    ) as node:
        await node.wait_closed()
        assert node.rejected == "Invalid node secret"
    bad_token = run.secret("unknown registration token", str(uuid.uuid4()))
    async with connect_node(h.node_url, h.context, NodeCredentials(registration_token=SecretStr(bad_token))) as node:
        await node.wait_closed()
        assert node.rejected is not None
    async with connect_node(h.node_url, h.context, first_credentials) as node:  # used already
        await node.wait_closed()
        assert node.rejected is not None

    # A new registration token: shown once, the node registers again with a new secret.
    r = await root.post(f"/api/v1/nodes/{edge_id}/token")
    assert r.status_code == 200, r.text
    again = run.secret("regenerated registration token of edge-1", r.json()["registration_token"])
    run.allow(r, again)
    async with connect_node(h.node_url, h.context, NodeCredentials(registration_token=SecretStr(again))) as node:
        await node.wait_authenticated()
        h.track_node_secret(node, "node secret of edge-1 after a new token")
        await wait_status(root, edge_id, "online")
        assert (await root.get("/api/v1/nodes")).status_code == 200
        assert (await root.get(f"/api/v1/nodes/{edge_id}")).status_code == 200

    # A relay: bind tokens relayed in authorize_tunnel.
    relay_id, relay_token = await h.create_node(root, "relay-1", "relay")
    credentials = NodeCredentials(registration_token=SecretStr(relay_token))
    async with connect_node(h.node_url, h.context, credentials, device_type=DeviceType.RELAY) as relay:
        await relay.wait_authenticated()
        h.track_node_secret(relay, "node secret of relay-1")
        await wait_status(root, relay_id, "online")
        ingress = run.secret("relay ingress token", f"ingress-{secrets.token_hex(16)}")
        egress = run.secret("relay egress token", f"egress-{secrets.token_hex(16)}")
        action = {"type": "authorize_tunnel", "tunnel_id": "t1", "ingress_token": ingress, "egress_token": egress}
        r = await operator.post(f"/api/v1/nodes/{relay_id}/command", json={"action": action})
        assert r.status_code == 200, r.text
        sent = [c for c in relay.commands if c.action.type == "authorize_tunnel"]
        assert len(sent) == 1
    assert (await root.get("/api/v1/events", params={"per_page": 200})).status_code == 200
    assert (await root.get("/api/v1/events/count")).status_code == 200
    return edge_id


async def dashboard_frames(h: Harness) -> None:
    async with h.client() as browser:
        jwt = await h.log_in(browser, ADMIN, h.run.secrets["admin password"])
    headers = [(b"Authorization", f"Bearer {jwt}".encode())]
    url = f"wss://127.0.0.1:{h.manager.port}/ws/dashboard"
    async with open_websocket_url(url, h.context, extra_headers=headers, connect_timeout=5, disconnect_timeout=2) as ws:
        with trio.fail_after(10):
            while True:
                message = await ws.get_message()
                h.run.add("dashboard_update frame", str(message))
                nodes = json.loads(message)["payload"]["nodes"]
                if any(n["status"] == "online" for n in nodes):
                    break


async def ai(h: Harness, operator: httpx.AsyncClient, fake: EchoingProviders, edge_id: str) -> None:
    """Keys stored, listed, replaced, used (sent to the provider only) and deleted."""
    run = h.run
    keys = {
        "openai": run.secret("OpenAI key (first)", f"sk-{secrets.token_hex(20)}"),
        "anthropic": run.secret("Anthropic key", f"sk-ant-{secrets.token_hex(20)}"),
        "gemini": run.secret("Gemini key", f"AIza{secrets.token_hex(18)}"),
    }
    for provider, key in keys.items():
        r = await operator.post("/api/v1/ai/keys", json={"provider": provider, "api_key": key})
        assert r.status_code == 200, r.text
    keys["openai"] = run.secret("OpenAI key (replaced)", f"sk-{secrets.token_hex(20)}")
    r = await operator.post(
        "/api/v1/ai/keys", json={"provider": "openai", "api_key": keys["openai"], "model_preference": "gpt-4.1"}
    )
    assert r.status_code == 200
    too_long = run.secret("overlong AI key (rejected)", marker("aikey") * 12)
    assert (await operator.post("/api/v1/ai/keys", json={"provider": "openai", "api_key": too_long})).status_code == 400
    bad_provider = run.secret("AI key with an unknown provider", marker("provider"))
    r = await operator.post("/api/v1/ai/keys", json={"provider": bad_provider, "api_key": bad_provider})
    assert r.status_code == 400
    r = await operator.get("/api/v1/ai/keys")
    assert r.status_code == 200 and {k["provider"] for k in r.json()} == set(keys)

    calls = {
        "openai": ("/api/v1/ai/generate-config", {"prompt": "add a flow", "node_id": edge_id}),
        "anthropic": ("/api/v1/ai/analyze", {"description": "any anomaly?", "provider": "anthropic"}),
        "gemini": ("/api/v1/ai/query", {"query": "which nodes are up?", "provider": "gemini"}),
    }
    for failing in (None, 401, 500, 200):
        for provider, (path, body) in calls.items():
            fake.failing = {} if failing is None else {provider: failing}
            before = len(fake.keys_seen)
            r = await operator.post(path, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["success"] is (failing is None), r.text
            assert fake.keys_seen[before:] == [(provider, keys[provider])]
    fake.failing = {}

    assert (await operator.request("DELETE", "/api/v1/ai/keys", json={"provider": "gemini"})).status_code == 200
    assert (await operator.request("DELETE", "/api/v1/ai/keys", json={"provider": "gemini"})).status_code == 404
    r = await operator.post("/api/v1/ai/query", json={"query": "hi", "provider": "gemini"})
    assert r.status_code == 400
    assert (await operator.get("/api/v1/ai/keys")).status_code == 200


def pem_body_lines(pem: bytes) -> list[str]:
    return [line for line in pem.decode().splitlines() if line and not line.startswith("-----")]


async def tls(h: Harness, root: httpx.AsyncClient) -> None:
    """Uploads (refused ones included) never show the key; GET /settings/tls neither."""
    run = h.run
    _, cert, key = ca_signed_pair(hostname="mgr.example", ip="127.0.0.1")
    _, _, other_key = ca_signed_pair(hostname="other.example", ip="127.0.0.1")
    for index, line in enumerate(pem_body_lines(key)):
        if len(line) >= 16:
            run.secret(f"TLS private key, line {index + 1}", line)
    for index, line in enumerate(pem_body_lines(other_key)):
        if len(line) >= 16:
            run.secret(f"mismatched TLS private key (rejected), line {index + 1}", line)
    garbage = run.secret("garbage key_pem (rejected)", marker("pem"))
    assert (await root.get("/api/v1/settings/tls")).status_code == 200
    upload = {"cert_pem": cert.decode(), "key_pem": other_key.decode()}
    assert (await root.post("/api/v1/settings/tls/upload", json=upload)).status_code == 400
    upload = {
        "cert_pem": cert.decode(),
        "key_pem": f"-----BEGIN PRIVATE KEY-----\n{garbage}\n-----END PRIVATE KEY-----\n",
    }
    assert (await root.post("/api/v1/settings/tls/upload", json=upload)).status_code == 400
    upload = {"cert_pem": cert.decode(), "key_pem": key.decode()}
    r = await root.post("/api/v1/settings/tls/upload", json=upload)
    assert r.status_code == 200, r.text
    assert (h.manager.data_dir / "tls" / "key.pem").read_bytes() == key
    assert (await root.get("/api/v1/settings/tls")).status_code == 200


async def whole_run(h: Harness, fake: EchoingProviders, admin_password: str) -> None:
    run = h.run
    async with h.client() as root:
        await h.log_in(root, ADMIN, admin_password)
        r = await root.put("/api/v1/settings", json={"settings": {"max_login_attempts": 100}})
        assert r.status_code == 200, r.text
        operator_id, operator_password = await users_and_sessions(h, root, admin_password)
        async with h.client(http2=True) as browser:  # HTTP/2: headers go through HPACK
            jwt = await h.log_in(browser, ADMIN, admin_password)
            r = await browser.get("/api/v1/users")
            assert r.status_code == 200 and r.http_version == "HTTP/2"
            bearer = {"Authorization": f"Bearer {jwt}"}
            assert (await browser.get("/api/v1/nodes", headers=bearer)).status_code == 200
        await rejected_inputs(h, root)
        async with h.logged_in(OPERATOR, operator_password) as operator:
            edge_id = await nodes(h, root, operator)
            await ai(h, operator, fake, edge_id)
            await tls(h, root)

            # The export: the route and the CLI file.
            assert (await root.get("/api/v1/export")).status_code == 200
            output = h.manager.data_dir.parent / "export.json"
            done = await h.cli("mp-manager export", ["export", "--output", str(output)])
            assert done.returncode == 0, done.stderr
            run.add("mp-manager export --output FILE", output.read_text())

            # reset-password: a weak one refused, then a new one; the operator's session ends.
            weak = run.secret("weak password (reset-password)", "weak" + secrets.token_hex(8).lower())
            done = await h.cli(
                "mp-manager reset-password (weak)",
                ["reset-password", "--username", OPERATOR, "--password-stdin"],
                weak + "\n",
            )
            assert done.returncode != 0
            third = run.secret("operator password (reset-password)", password("op-third"))
            done = await h.cli(
                "mp-manager reset-password",
                ["reset-password", "--username", OPERATOR, "--password-stdin"],
                third + "\n",
            )
            assert done.returncode == 0, done.stderr
            assert (await operator.get("/api/v1/ai/keys")).status_code == 401
        async with h.logged_in(OPERATOR, third) as operator:
            assert (await operator.get("/api/v1/ai/keys")).status_code == 200
        assert (await root.get(f"/api/v1/users/{operator_id}")).status_code == 200


async def test_no_secret_reaches_an_answer_the_export_or_the_log(tmp_path: Path) -> None:
    run = Run()
    jwt_secret = run.secret("MEDIAPLANE_JWT_SECRET", secrets.token_hex(32))
    master_key = run.secret("MEDIAPLANE_MASTER_KEY", secrets.token_hex(32))
    admin_password = run.secret("admin password", password("admin"))
    fake = EchoingProviders()
    with fake.running():
        env = manager_env(
            MEDIAPLANE_JWT_SECRET=jwt_secret,
            MEDIAPLANE_MASTER_KEY=master_key,
            MEDIAPLANE_OPENAI_BASE_URL=fake.base_url,
            MEDIAPLANE_ANTHROPIC_BASE_URL=fake.base_url,
            MEDIAPLANE_GEMINI_BASE_URL=fake.base_url,
        )
        data_dir = tmp_path / "manager"
        setup = subprocess.run(
            [str(MANAGER_BIN), "setup", "--data-dir", str(data_dir), "--username", ADMIN, "--password-stdin"],
            input=admin_password + "\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert setup.returncode == 0, setup.stderr
        run.cli("mp-manager setup", setup)
        manager = await trio.to_thread.run_sync(
            lambda: start_manager(data_dir, env=env, extra_args=["--log-level", "debug"])
        )
        try:
            # The cert served by this run: an upload replaces the file, not what is served.
            served = tmp_path / "served-cert.pem"
            shutil.copy(manager.cert_path, served)
            harness = Harness(run, manager, ssl.create_default_context(cafile=str(served)), env)
            await whole_run(harness, fake, admin_password)
        finally:
            await trio.to_thread.run_sync(manager.stop)
    log = manager.log()
    # The grep is only worth something if the log saw the run (debug: the access log too).
    for expected in ("POST /api/v1/nodes ", "POST /api/v1/ai/keys ", "registered", "login refused for node", "stopped"):
        assert expected in log, expected
    run.add("the service log", log)
    # The grep finds a leak in a re-encoded form (here the master key's bytes in base64).
    probe = Seen("probe", "x" + base64.b64encode(b"!" + bytes.fromhex(master_key)).decode())
    assert Run({"master key": master_key}, [probe]).leaks() == ["master key (base64 of the hex bytes) in probe"]
    assert len(run.seen) > 90
    leaks = run.leaks()
    assert not leaks, "secrets leaked:\n" + "\n".join(leaks)
