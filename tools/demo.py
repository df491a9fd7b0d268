"""``make run``: the all-in-one local demo.

Starts ``mp-edge`` on 127.0.0.1:8080 with a config dir under ``.demo/``, creates a
demo flow (RTP in on 127.0.0.1:5000, a raw-UDP TS output to 127.0.0.1:5004 and an
RTP output to 127.0.0.1:5006), feeds it a live H.264 + AAC MPEG-TS test stream
from ffmpeg, starts ``mp-manager`` on https://127.0.0.1:8443 (its two secrets generated
once into ``.demo/manager.env``, mode 0600, and a first ``admin`` user), registers the edge
with it (a node created in the manager, its token and the manager's certificate fingerprint
in the edge's ``manager`` block), and prints what to open and type. Ctrl-C stops everything cleanly.
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


def _request(method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, dict[str, object]]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(API + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _wait_healthy(edge: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if edge.poll() is not None:
            sys.exit(f"demo: mp-edge exited with status {edge.returncode} (is port 8080 or 9090 in use?)")
        try:
            if _request("GET", "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("demo: mp-edge did not answer on 127.0.0.1:8080")


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


def _link_edge_to_manager() -> str:
    """Register the demo edge with the demo manager (once): a node created in the manager, its
    token and the manager's certificate fingerprint put in the edge's ``manager`` block through
    ``PUT /api/v1/config`` (the link follows at once). Returns one line for the banner."""
    import hashlib
    import ssl

    import httpx
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    status, answer = _request("GET", "/api/v1/manager")
    link = answer.get("data") if status == 200 else None
    if isinstance(link, dict) and link.get("registered"):
        return f"the edge is registered as node {link.get('node_id')} ({link.get('state')})"
    cert_path = MANAGER_DIR / "tls" / "cert.pem"
    deadline = time.monotonic() + 30
    while not cert_path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    context = ssl.create_default_context(cafile=str(cert_path))
    der = x509.load_pem_x509_certificate(cert_path.read_bytes()).public_bytes(Encoding.DER)
    fingerprint = ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())
    with httpx.Client(base_url=MANAGER_URL, verify=context, timeout=10) as manager:
        while True:
            try:
                if manager.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                return "the manager did not answer: the edge is not linked"
            time.sleep(0.2)
        login = manager.post("/api/v1/auth/login", json={"username": MANAGER_USER, "password": MANAGER_PASSWORD})
        if login.status_code != 200:
            return "could not log in to the manager: the edge is not linked"
        manager.headers["X-CSRF-Token"] = login.json()["csrf_token"]
        created = manager.post("/api/v1/nodes", json={"name": "demo-edge", "description": "make run"})
        if created.status_code != 201:
            return "could not create the demo node in the manager"
        token = created.json()["registration_token"]
    status, answer = _request("GET", "/api/v1/config")
    config = answer.get("data")
    if status != 200 or not isinstance(config, dict):
        return "could not read the edge's config: the edge is not linked"
    config["manager"] = {
        "enabled": True,
        "url": "wss://127.0.0.1:8443/ws/node",
        "cert_fingerprint": fingerprint,
        "registration_token": token,
    }
    status, answer = _request("PUT", "/api/v1/config", config)
    if status != 200:
        return f"could not link the edge: {answer.get('error')}"
    return "the edge registers with the manager now (mp manager status)"


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop works like Ctrl-C
    DEMO_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    status_page = _configure_monitor()
    edge_bin = Path(sys.executable).with_name("mp-edge")
    edge = subprocess.Popen(
        [str(edge_bin), "--config-dir", str(DEMO_DIR), "--listen-addr", "127.0.0.1", "--listen-port", "8080"],
        start_new_session=True,
    )
    feeder: subprocess.Popen[bytes] | None = None
    manager = _start_manager()
    try:
        _wait_healthy(edge)
        status, answer = _request("GET", "/api/v1/flows/demo")
        if status == 404:
            status, answer = _request("POST", "/api/v1/flows", FLOW)
            if status != 200:
                sys.exit(f"demo: could not create the demo flow: {answer.get('error')}")
        elif _request("GET", "/api/v1/stats/demo")[1].get("data", {}).get("state") != "Running":  # type: ignore[union-attr]
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
        linked = _link_edge_to_manager() if manager is not None and manager.poll() is None else "manager not started"
        bin_dir = Path(sys.executable).parent
        print(
            f"""
Mediaplane demo is running.

  Status page {status_page}   (live flows, TR 101 290 alarms, thumbnails; no login)
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

Manager (being built; docs/manager.md says what is there yet):
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
