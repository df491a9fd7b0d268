"""``make run``: the all-in-one local demo.

Starts ``mp-edge`` on 127.0.0.1:8080 with a config dir under ``.demo/``, creates a
demo flow (RTP in on 127.0.0.1:5000, a raw-UDP TS output to 127.0.0.1:5004 and an
RTP output to 127.0.0.1:5006), feeds it a live H.264 + AAC MPEG-TS test stream
from ffmpeg, starts ``mp-manager`` on https://127.0.0.1:8443 (its two secrets generated
once into ``.demo/manager.env``, mode 0600, and a first ``admin`` user), registers the edge
with it (a node created in the manager, its token and the manager's certificate fingerprint
in the edge's ``manager`` block), starts ``mp-relay`` (QUIC 127.0.0.1:4433, native UDP plane
4434, API 4480; registered with the manager as a relay node the same way) and a second edge,
``edge-b`` on 127.0.0.1:8081, and carries the demo flow from the first edge to the second through
an encrypted UDP tunnel over the relay (issue 16: the demo flow's ``to-edge-b`` output goes into
the tunnel's entry 127.0.0.1:5020; edge-b's tunnel delivers to its flow ``from-edge-a`` on
127.0.0.1:5030, whose output is raw TS on 127.0.0.1:5032). It prints what to open and type.
Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / ".demo" / "edge"
MANAGER_DIR = ROOT / ".demo" / "manager"
MANAGER_ENV = ROOT / ".demo" / "manager.env"
MANAGER_URL = "https://127.0.0.1:8443"
MANAGER_USER = "admin"
MANAGER_PASSWORD = "Demo-admin-1"  # a demo on loopback; docs/manager.md says how to set a real one
API = "http://127.0.0.1:8080"
EDGE_B_DIR = ROOT / ".demo" / "edge-b"
EDGE_B_API = "http://127.0.0.1:8081"
RELAY_DIR = ROOT / ".demo" / "relay"
RELAY_API = "http://127.0.0.1:4480"
TUNNEL_FILE = ROOT / ".demo" / "tunnel.json"  # the demo tunnel's id and secrets, made once (0600)
TUNNEL_ENTRY = "127.0.0.1:5020"  # edge A's tunnel entry (the demo flow's to-edge-b output)
TUNNEL_EXIT = "127.0.0.1:5030"  # where edge-b's tunnel delivers (flow from-edge-a's input)
FLOW_B = {
    "id": "from-edge-a",
    "name": "From edge A through the relay",
    "enabled": True,
    "media_analysis": True,
    "input": {"type": "rtp", "bind_addr": TUNNEL_EXIT},  # the to-edge-b output sends RTP
    "outputs": [{"type": "udp", "id": "ts-out", "name": "Raw TS to 5032", "dest_addr": "127.0.0.1:5032"}],
}
TO_EDGE_B = {"type": "rtp", "id": "to-edge-b", "name": "Into the tunnel to edge-b", "dest_addr": TUNNEL_ENTRY}
# The edge's monitor listener: the local status page (no login, read-only), on loopback only.
MONITOR = {"listen_addr": "127.0.0.1", "listen_port": 9090}
FLOW = {
    "id": "demo",
    "name": "Demo test pattern",
    "enabled": True,
    "media_analysis": True,
    "input": {"type": "rtp", "bind_addr": "127.0.0.1:5000"},
    "outputs": [
        {"type": "udp", "id": "ts-out", "name": "Raw TS to 5004", "dest_addr": "127.0.0.1:5004"},
        {"type": "rtp", "id": "rtp-out", "name": "RTP to 5006", "dest_addr": "127.0.0.1:5006"},
    ],
}
FFMPEG = [
    "ffmpeg",
    "-hide_banner",
    "-loglevel",
    "error",
    "-re",
    "-f",
    "lavfi",
    "-i",
    "testsrc2=size=1280x720:rate=25",
    "-f",
    "lavfi",
    "-i",
    "sine=frequency=1000:sample_rate=48000",
    "-c:v",
    "libx264",
    "-preset",
    "veryfast",
    "-tune",
    "zerolatency",
    "-g",
    "50",
    "-b:v",
    "3M",
    "-c:a",
    "aac",
    "-b:a",
    "128k",
    "-f",
    "rtp_mpegts",
    "rtp://127.0.0.1:5000?pkt_size=1328",
]


def _request(
    method: str, path: str, body: Mapping[str, object] | None = None, *, api: str = API
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(api + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _wait_healthy(edge: subprocess.Popen[bytes], timeout: float = 60.0, *, api: str = API) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if edge.poll() is not None:
            sys.exit(f"demo: mp-edge exited with status {edge.returncode} (is {api}'s port in use?)")
        try:
            if _request("GET", "/health", api=api)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"demo: mp-edge did not answer on {api}")


def _configure_monitor() -> str:
    """Turn on the edge's ``monitor`` listener (the status page) in the demo's config.json, before
    the edge starts: a stopped edge's config.json is the place to edit (docs/edge.md), and this
    works whether or not API auth was turned on. A monitor block already there is kept. On the
    first run the file is written with the server block the demo runs with; the edge adds the
    rest (node_id and the defaults). Returns the status page's address."""
    path = DEMO_DIR / "config.json"
    server = {"listen_addr": "127.0.0.1", "listen_port": 8080}
    config: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"version": 1, "server": server}
    if not isinstance(config.get("monitor"), dict):
        config["monitor"] = MONITOR
        tmp = path.with_name(".config.json.demo-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(config, out, indent=2)
        tmp.replace(path)
    monitor = config["monitor"]
    host = monitor.get("listen_addr", "0.0.0.0")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{monitor.get('listen_port', 9090)}/"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _manager_env() -> dict[str, str]:
    """The manager's required secrets (interop.md 1.3), generated once and kept 0600."""
    if not MANAGER_ENV.exists():
        MANAGER_ENV.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        text = f"MEDIAPLANE_JWT_SECRET={secrets.token_hex(32)}\nMEDIAPLANE_MASTER_KEY={secrets.token_hex(32)}\n"
        fd = os.open(MANAGER_ENV, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
    values = dict(line.split("=", 1) for line in MANAGER_ENV.read_text().split() if "=" in line)
    return {**os.environ, **values}


def _start_manager() -> subprocess.Popen[bytes] | None:
    """``mp-manager serve`` on 127.0.0.1:8443 with a first admin; None (and a note) when it cannot start."""
    manager_bin = Path(sys.executable).with_name("mp-manager")
    if not manager_bin.exists():
        return None
    env = _manager_env()
    MANAGER_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (MANAGER_DIR / "manager.db").exists():
        subprocess.run(
            [str(manager_bin), "setup", "--data-dir", str(MANAGER_DIR), "--username", MANAGER_USER, "--password-stdin"],
            input=(MANAGER_PASSWORD + "\n").encode(),
            env=env,
            check=False,
            stdout=subprocess.DEVNULL,
        )
    return subprocess.Popen(
        [str(manager_bin), "serve", "--data-dir", str(MANAGER_DIR), "--listen-addr", "127.0.0.1", "--port", "8443"],
        env=env,
        start_new_session=True,
    )


def _manager_client() -> tuple[Any, str] | None:
    """A logged-in httpx client on the demo manager and its certificate fingerprint; None when
    the manager does not answer or the login fails."""
    import hashlib
    import ssl

    import httpx
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    cert_path = MANAGER_DIR / "tls" / "cert.pem"
    deadline = time.monotonic() + 30
    while not cert_path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not cert_path.exists():
        return None
    context = ssl.create_default_context(cafile=str(cert_path))
    der = x509.load_pem_x509_certificate(cert_path.read_bytes()).public_bytes(Encoding.DER)
    fingerprint = ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())
    manager = httpx.Client(base_url=MANAGER_URL, verify=context, timeout=10)
    while True:
        try:
            if manager.get("/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            manager.close()
            return None
        time.sleep(0.2)
    login = manager.post("/api/v1/auth/login", json={"username": MANAGER_USER, "password": MANAGER_PASSWORD})
    if login.status_code != 200:
        manager.close()
        return None
    manager.headers["X-CSRF-Token"] = login.json()["csrf_token"]
    return manager, fingerprint


def _manager_block(fingerprint: str, token: str) -> dict[str, object]:
    return {
        "enabled": True,
        "url": "wss://127.0.0.1:8443/ws/node",
        "cert_fingerprint": fingerprint,
        "registration_token": token,
    }


def _link_edge_to_manager(manager: Any, fingerprint: str) -> str:
    """Register the demo edge with the demo manager (once): a node created in the manager, its
    token and the manager's certificate fingerprint put in the edge's ``manager`` block through
    ``PUT /api/v1/config`` (the link follows at once). Returns one line for the banner."""
    status, answer = _request("GET", "/api/v1/manager")
    link = answer.get("data") if status == 200 else None
    if isinstance(link, dict) and link.get("registered"):
        return f"the edge is registered as node {link.get('node_id')} ({link.get('state')})"
    created = manager.post("/api/v1/nodes", json={"name": "demo-edge", "description": "make run"})
    if created.status_code != 201:
        return "could not create the demo node in the manager"
    token = created.json()["registration_token"]
    status, answer = _request("GET", "/api/v1/config")
    config = answer.get("data")
    if status != 200 or not isinstance(config, dict):
        return "could not read the edge's config: the edge is not linked"
    config["manager"] = _manager_block(fingerprint, token)
    status, answer = _request("PUT", "/api/v1/config", config)
    if status != 200:
        return f"could not link the edge: {answer.get('error')}"
    return "the edge registers with the manager now (mp manager status)"


def _write_private_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.demo-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(document, out, indent=2)
    tmp.replace(path)


def _prepare_relay(linked: tuple[Any, str] | None) -> str:
    """``.demo/relay/relay.json`` (once): loopback addresses and, when the manager answers, a
    relay node created there and its registration token (the relay rewrites the file with its
    credentials after registering, interop.md 1.2). Returns one line for the banner."""
    path = RELAY_DIR / "relay.json"
    if path.exists():
        stored = json.loads(path.read_text())
        registered = bool((stored.get("manager") or {}).get("node_id"))
        return "registered with the manager" if registered else "not linked to the manager"
    document: dict[str, Any] = {
        "quic_addr": "127.0.0.1:4433",
        "udp_relay_addr": "127.0.0.1:4434",
        "api_addr": "127.0.0.1:4480",
    }
    line = "not linked to the manager (the manager did not answer)"
    if linked is not None:
        manager, fingerprint = linked
        created = manager.post("/api/v1/nodes", json={"name": "demo-relay", "device_type": "relay"})
        if created.status_code == 201:
            document["manager"] = _manager_block(fingerprint, created.json()["registration_token"])
            line = "registers with the manager now (a relay node)"
    _write_private_json(path, document)
    return line


def _start_relay() -> subprocess.Popen[bytes] | None:
    relay_bin = Path(sys.executable).with_name("mp-relay")
    if not relay_bin.exists():
        return None
    return subprocess.Popen(
        [str(relay_bin), "--config", str(RELAY_DIR / "relay.json"), "--log-level", "warning"],
        start_new_session=True,
    )


def _tunnel_pair() -> tuple[dict[str, object], dict[str, object]]:
    """The demo tunnel as each edge holds it: one id and key, made once into .demo/tunnel.json."""
    if not TUNNEL_FILE.exists():
        import uuid

        _write_private_json(TUNNEL_FILE, {"id": str(uuid.uuid4()), "key": secrets.token_hex(32)})
    made = json.loads(TUNNEL_FILE.read_text())
    common: dict[str, object] = {
        "id": made["id"],
        "protocol": "udp",
        "mode": "relay",
        "transport": "quic",
        "relay_addr": "127.0.0.1:4433",
        "tunnel_encryption_key": made["key"],
    }
    source = {**common, "name": "To edge-b via the relay", "direction": "egress", "local_addr": TUNNEL_ENTRY}
    sink = {**common, "name": "From edge A via the relay", "direction": "ingress", "local_addr": TUNNEL_EXIT}
    return source, sink


def _set_up_tunnel() -> str:
    """Edge A: the tunnel and the demo flow's ``to-edge-b`` output; edge-b: the tunnel and the
    flow ``from-edge-a``. Each is created only when missing. Returns one line for the banner."""
    source, sink = _tunnel_pair()
    for api, tunnel in ((API, source), (EDGE_B_API, sink)):
        if _request("GET", f"/api/v1/tunnels/{tunnel['id']}", api=api)[0] == 404:
            status, answer = _request("POST", "/api/v1/tunnels", tunnel, api=api)
            if status != 201:
                return f"could not create the demo tunnel on {api}: {answer.get('error')}"
    if _request("GET", "/api/v1/flows/from-edge-a", api=EDGE_B_API)[0] == 404:
        status, answer = _request("POST", "/api/v1/flows", FLOW_B, api=EDGE_B_API)
        if status != 200:
            return f"could not create flow from-edge-a on edge-b: {answer.get('error')}"
    status, answer = _request("GET", "/api/v1/flows/demo")
    outputs = (answer.get("data") or {}).get("outputs", []) if status == 200 else []
    if not any(o.get("id") == "to-edge-b" for o in outputs):
        status, answer = _request("POST", "/api/v1/flows/demo/outputs", TO_EDGE_B)
        if status not in (200, 201):
            return f"could not add the to-edge-b output: {answer.get('error')}"
    return f"tunnel {source['id']}: 'demo' on edge A -> relay -> 'from-edge-a' on edge-b"


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop works like Ctrl-C
    DEMO_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    status_page = _configure_monitor()
    edge_bin = Path(sys.executable).with_name("mp-edge")
    edge = subprocess.Popen(
        [str(edge_bin), "--config-dir", str(DEMO_DIR), "--listen-addr", "127.0.0.1", "--listen-port", "8080"],
        start_new_session=True,
    )
    EDGE_B_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    edge_b = subprocess.Popen(
        [str(edge_bin), "--config-dir", str(EDGE_B_DIR), "--listen-addr", "127.0.0.1", "--listen-port", "8081"],
        start_new_session=True,
    )
    feeder: subprocess.Popen[bytes] | None = None
    relay: subprocess.Popen[bytes] | None = None
    manager = _start_manager()
    try:
        _wait_healthy(edge)
        _wait_healthy(edge_b, api=EDGE_B_API)
        status, answer = _request("GET", "/api/v1/flows/demo")
        if status == 404:
            status, answer = _request("POST", "/api/v1/flows", FLOW)
            if status != 200:
                sys.exit(f"demo: could not create the demo flow: {answer.get('error')}")
        elif _request("GET", "/api/v1/stats/demo")[1].get("data", {}).get("state") != "Running":
            _request("POST", "/api/v1/flows/demo/start")
        if shutil.which("ffmpeg"):
            feeder = subprocess.Popen(FFMPEG, stdin=subprocess.DEVNULL, start_new_session=True)
            source = "ffmpeg: 1280x720p25 H.264 3 Mbit/s + AAC 1 kHz tone, RTP/MPEG-TS to 127.0.0.1:5000"
        else:
            feeder = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.tools.rtpgen",
                    "--dest",
                    "127.0.0.1:5000",
                    "--pps",
                    "1000",
                    "--seconds",
                    "86400",
                ],
                cwd=ROOT,
                start_new_session=True,
            )
            source = "bench.tools.rtpgen: synthetic MPEG-TS (ffmpeg is not installed)"
        session = _manager_client() if manager is not None and manager.poll() is None else None
        linked = "manager not started" if session is None else _link_edge_to_manager(*session)
        relay_line = _prepare_relay(session)
        if session is not None:
            session[0].close()
        relay = _start_relay()
        tunnel_line = _set_up_tunnel() if relay is not None else "mp-relay is not installed: no tunnel"
        bin_dir = Path(sys.executable).parent
        print(
            f"""
Mediaplane demo is running.

  Status page {status_page}   (live flows, TR 101 290 alarms, thumbnails, "watch" plays a flow
                                 over WebRTC in the page; no login)
  Edge API    {API}   (config in {DEMO_DIR.relative_to(ROOT)})
  Demo flow   'demo': RTP in 127.0.0.1:5000 -> raw TS 127.0.0.1:5004 and RTP 127.0.0.1:5006
  Source      {source}

Open in a browser:
  {API}/setup            the first-boot setup wizard
  {API}/api/v1/stats     live statistics (TR 101 290, media analysis, IAT, bitrates)
  {API}/metrics          Prometheus metrics

Type in another terminal:
  {bin_dir}/mp flow list
  {bin_dir}/mp stats --watch
  {bin_dir}/mp events --follow
  curl -s {API}/api/v1/stats/demo | python3 -m json.tool
  ffplay udp://127.0.0.1:5004          (to watch the output, where a display is available)

Second edge and relay (tunnels, docs/relay.md):
  edge-b      {EDGE_B_API}   (config in {EDGE_B_DIR.relative_to(ROOT)})
  relay       {RELAY_API}/api/v1/tunnels   (QUIC 127.0.0.1:4433, native UDP 4434; {relay_line})
  tunnel      {tunnel_line}
  {bin_dir}/mp tunnel list
  {bin_dir}/mp --url {EDGE_B_API} stats from-edge-a
  ffplay udp://127.0.0.1:5032          (the demo flow, after its trip through the relay)

Manager (docs/manager.md, docs/dashboard.md):
  Dashboard    {MANAGER_URL}/   sign in as {MANAGER_USER} / {MANAGER_PASSWORD}  (fleet, node pages with
               start/stop and the config editor, events, tunnels, users, settings, assistant;
               the browser warns once about the self-signed certificate)
  {MANAGER_URL}/health   self-signed certificate in {MANAGER_DIR.relative_to(ROOT)}/tls/cert.pem
  link         {linked}
  login: curl -sk -X POST {MANAGER_URL}/api/v1/auth/login -H 'Content-Type: application/json' \\
           -d '{{"username":"{MANAGER_USER}","password":"{MANAGER_PASSWORD}"}}'
  {"(not started: " + str(manager.returncode) + ")" if manager is not None and manager.poll() is not None else ""}
Ctrl-C stops the demo.
""",
            flush=True,
        )
        while edge.poll() is None:
            time.sleep(0.5)
            if feeder.poll() is not None:
                print(f"demo: the stream source exited with status {feeder.returncode}", file=sys.stderr)
                break
    except KeyboardInterrupt:
        print("\ndemo: stopping", file=sys.stderr)
    finally:
        if feeder is not None and feeder.poll() is None:
            feeder.terminate()
            feeder.wait(5)
        for child in (relay, edge_b):
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(15)
                except subprocess.TimeoutExpired:
                    child.kill()
        if manager is not None and manager.poll() is None:
            manager.send_signal(signal.SIGTERM)
            try:
                manager.wait(10)
            except subprocess.TimeoutExpired:
                manager.kill()
        if edge.poll() is None:
            edge.send_signal(signal.SIGTERM)
            try:
                edge.wait(15)
            except subprocess.TimeoutExpired:
                edge.kill()
        print("demo: stopped", file=sys.stderr)


if __name__ == "__main__":
    main()
