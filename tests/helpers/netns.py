"""Network namespaces for tests: a netns with a veth pair to the host, processes in it, impairments.

Usage (sync, as root)::

    with netns_pair("mpl") as net:                    # host_addr <=veth=> ns_addr, a random /30
        manager = start_manager_in_netns(net, data_dir)  # mp-manager on ns_addr, its cert naming it
        with Impairment(net) as links:
            links.loss(20)                            # both directions, on the namespace's veth
            links.block()                             # drop everything
            links.clear()

Impairments are nftables rules in the namespace's own ruleset (``numgen random`` for loss), not
``tc netem``: the kernel the tests run on here is built without ``CONFIG_NET_SCH_NETEM`` and
without module support, while nf_tables is built in. The rules live in the namespace, so
nothing in the host's firewall is touched and deleting the namespace takes them with it.

Skips only where namespaces are impossible (not root, ``ip netns add`` answers EPERM); a
missing ``ip`` or ``nft`` skips locally and fails under ``CI=true``, where a skip would be a
silent pass (tools/ensure-debs.sh installs both).

Tests that call :func:`netns_pair` are marked ``netns``: ``make test`` runs them in a network
namespace of their own, away from the browser tests (tools/run-tests.sh), and under ``CI=true``
a call outside that run fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest

from tests.helpers.edge import EDGE_BIN, write_config
from tests.helpers.manager import MANAGER_BIN, Manager, manager_env
from tests.helpers.media import Pacer

IN_CI = os.environ.get("CI", "").lower() == "true"
_LISTENING = re.compile(r"mp-manager \S+ listening on (https?)://(\S+):(\d+)")


def missing(reason: str) -> None:
    """Skip for a missing tool or kernel feature, but fail in CI, where a skip is a silent pass."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a skip here would be a silent pass)")
    pytest.skip(reason)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


@dataclass(frozen=True)
class Net:
    """One test's namespace and the veth pair between it and the host."""

    name: str
    host_if: str
    ns_if: str
    host_addr: str
    ns_addr: str

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it in the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name]


SHARED_NETNS_VARIABLE = "MP_TEST_SHARED_NETNS"
"""Set by tools/run-tests.sh for its netns part: the namespace the browser tests run in."""


def shared_namespace() -> Path | None:
    """The namespace the browser tests run in (``/proc/PID/ns/net``), when tools/run-tests.sh said."""
    value = os.environ.get(SHARED_NETNS_VARIABLE)
    return Path(value) if value else None


def apart_from_the_browsers() -> bool:
    """Whether this process is in another network namespace than the browser tests' one."""
    shared = shared_namespace()
    if shared is None:
        return False
    here, there = os.stat("/proc/self/ns/net"), os.stat(shared)
    return (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino)


@contextlib.contextmanager
def netns_pair(prefix: str = "mp") -> Iterator[Net]:
    """A fresh netns with a veth pair into it (10.213.x.y/30); always torn down, whatever failed.

    ``prefix``: at most 4 characters (interface names are at most 15). Every process still in
    the namespace at the end is killed (only the test's own processes can be in there).
    """
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        missing("the 'ip' tool (iproute2) is not installed")
    token = secrets.token_hex(3)
    block = secrets.randbelow(256 * 64)  # a random /30 of 10.213.0.0/16: parallel runs do not collide
    third, fourth = block // 64, (block % 64) * 4
    net = Net(
        name=f"{prefix}-{token}",
        host_if=f"{prefix[:4]}h{token}",
        ns_if=f"{prefix[:4]}n{token}",
        host_addr=f"10.213.{third}.{fourth + 1}",
        ns_addr=f"10.213.{third}.{fourth + 2}",
    )
    added = ip("netns", "add", net.name, check=False)
    if added.returncode != 0:
        if "Operation not permitted" in added.stderr or "Permission denied" in added.stderr:
            pytest.skip(f"cannot create a network namespace here: {added.stderr.strip()}")
        pytest.fail(f"ip netns add failed: {added.stderr.strip()}")
    if IN_CI and not apart_from_the_browsers():
        # Namespaces work here, so the netns part of make test ran in one of its own. Chromium
        # fails requests in flight on any link or address change in its namespace
        # (net::ERR_NETWORK_CHANGED): this test must run there (tools/run-tests.sh).
        ip("netns", "del", net.name, check=False)
        pytest.fail("netns_pair outside the netns run: mark the test pytest.mark.netns (tools/run-tests.sh)")
    try:
        ip("link", "add", net.host_if, "type", "veth", "peer", "name", net.ns_if)
        ip("link", "set", net.ns_if, "netns", net.name)
        ip("addr", "add", f"{net.host_addr}/30", "dev", net.host_if)
        ip("link", "set", net.host_if, "up")
        ip("-n", net.name, "addr", "add", f"{net.ns_addr}/30", "dev", net.ns_if)
        ip("-n", net.name, "link", "set", net.ns_if, "up")
        ip("-n", net.name, "link", "set", "lo", "up")
        yield net
    finally:
        kill_namespace_processes(net.name)
        ip("link", "del", net.host_if, check=False)  # takes its peer with it
        ip("netns", "del", net.name, check=False)


def kill_namespace_processes(name: str) -> None:
    for pid in ip("netns", "pids", name, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


# --------------------------------------------------------------------------- mp-manager in a netns


@dataclass
class NsManager(Manager):
    """A :class:`Manager` listening on ``host`` (the namespace's address) instead of 127.0.0.1."""

    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def client(self, timeout: float = 10.0, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("trust_env", False)  # never a proxy for the test's private addresses
        return super().client(timeout=timeout, **kwargs)


def start_manager_in_netns(net: Net, data_dir: Path, *, port: int = 0, timeout: float = 30.0) -> NsManager:
    """``ip netns exec NS mp-manager serve`` on the namespace's veth address; waits for /health.

    The self-signed certificate is generated in the namespace, so its SANs name ``ns_addr``
    and a client trusting ``cert.pem`` checks the host name as usual.
    """
    log_path = data_dir.parent / f"{data_dir.name}-manager.log"
    with log_path.open("ab") as log:
        offset = log.tell()
        process = subprocess.Popen(
            [
                *net.exec_prefix,
                str(MANAGER_BIN),
                "serve",
                "--data-dir",
                str(data_dir),
                "--listen-addr",
                net.ns_addr,
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=manager_env(),
            start_new_session=True,
        )
    manager = NsManager(data_dir, process, log_path, log_offset=offset, host=net.ns_addr)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mp-manager in {net.name} exited with {process.returncode}:\n{manager.log()}")
            found = _LISTENING.search(manager.run_log())
            if found:
                manager.scheme, manager.port = found.group(1), int(found.group(3))
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"mp-manager in {net.name} did not log 'listening on':\n{manager.log()}")
            time.sleep(0.05)
        with manager.client(timeout=2) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/health").status_code == 200:
                        return manager
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mp-manager in {net.name} did not answer /health:\n{manager.log()}")
                time.sleep(0.05)
    except BaseException:
        manager.stop()
        raise


# --------------------------------------------------------------------------- impairments


class Impairment:
    """Loss or a full block on the namespace's veth, both directions, as nftables rules in the namespace.

    Each change replaces the whole table in one ``nft -f`` transaction; the rules count what
    they drop (:meth:`dropped`). Leaving the ``with`` block removes the table.
    """

    TABLE = "mp_impair"

    def __init__(self, net: Net) -> None:
        self.net = net
        if shutil.which("nft") is None:
            missing("the 'nft' tool (nftables) is not installed")
        probe = self._nft_script(f"table inet {self.TABLE}\ndelete table inet {self.TABLE}\n", check=False)
        if probe.returncode != 0:
            missing(f"nftables does not work in a network namespace here: {probe.stderr.strip()}")

    def __enter__(self) -> Impairment:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.clear()

    def loss(self, percent: int) -> None:
        """Drop each packet in or out of the veth with probability ``percent`` %, independently."""
        if not 0 < percent < 100:
            raise ValueError("percent must be 1 to 99 (block() drops everything)")
        self._apply(f"numgen random mod 100 < {percent} counter drop")

    def block(self) -> None:
        """Drop every IP packet in or out of the veth (ARP still passes: the path is black-holed, not down)."""
        self._apply("counter drop")

    def clear(self) -> None:
        self._nft_script(f"table inet {self.TABLE}\ndelete table inet {self.TABLE}\n")

    def dropped(self) -> int:
        """Packets the current rules dropped, both directions."""
        listed = self._nft("list", "table", "inet", self.TABLE).stdout
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", listed))

    def _apply(self, verdict: str) -> None:
        ns_if = self.net.ns_if
        self._nft_script(
            f"table inet {self.TABLE}\n"
            f"delete table inet {self.TABLE}\n"
            f"table inet {self.TABLE} {{\n"
            f"  chain input {{ type filter hook input priority filter; policy accept;\n"
            f'    iifname "{ns_if}" {verdict}\n  }}\n'
            f"  chain output {{ type filter hook output priority filter; policy accept;\n"
            f'    oifname "{ns_if}" {verdict}\n  }}\n'
            f"}}\n"
        )

    def _nft(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.net.exec_prefix, "nft", *args], capture_output=True, text=True, timeout=20, check=True
        )

    def _nft_script(self, script: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.net.exec_prefix, "nft", "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=20,
            check=check,
        )


# --------------------------------------------------------------------------- mp-edge in a netns

EDGE_API_PORT = 18080  # inside the test's own namespace: nothing else can hold it


@dataclass
class NsEdge:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> Any:
        r = httpx.get(self.url + path, timeout=5, trust_env=False)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


@contextlib.contextmanager
def edge_in_netns(net: Net, config_dir: Path, config: dict[str, Any]) -> Iterator[NsEdge]:
    """``ip netns exec NS mp-edge ...`` listening on the namespace's veth address."""
    write_config(config_dir, config)
    log_path = config_dir.parent / "edge-netns.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                net.name,
                str(EDGE_BIN),
                "--config-dir",
                str(config_dir),
                "--listen-addr",
                net.ns_addr,
                "--listen-port",
                str(EDGE_API_PORT),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    edge = NsEdge(process, f"http://{net.ns_addr}:{EDGE_API_PORT}", log_path)
    try:
        deadline = time.monotonic() + 20
        while True:
            if process.poll() is not None:
                pytest.fail(f"mp-edge in {net.name} exited with {process.returncode}:\n{edge.log()}")
            try:
                if httpx.get(edge.url + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mp-edge in {net.name} did not answer /health in 20 s:\n{edge.log()}")
            time.sleep(0.05)
        yield edge
    finally:
        edge.stop()


def send_multicast(group: str, port: int, datagrams: Iterable[bytes], iface_addr: str, pps: float = 1000.0) -> int:
    """Paced multicast out of the interface that owns ``iface_addr`` (TTL 1, no loopback)."""
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(iface_addr))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        pacer = Pacer(pps)
        for datagram in datagrams:
            sock.sendto(datagram, (group, port))
            sent += 1
            pacer.sent_one()
    return sent
