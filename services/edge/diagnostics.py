"""What the kernel's media tuning actually is on this box: sysctl knobs and NIC ring/coalescing.

`collect()` backs `GET /api/v1/system/diagnostics` and the appliance image test, which compares
it with `image/extra/usr/lib/sysctl.d/60-mediaplane-media.conf`. It only reads: /proc/sys for
the sysctls and `ethtool -g` / `ethtool -c` (both get-only) for the NICs. A value that cannot be
read is reported as None, never raised, so the route works in a container, in a sandboxed unit
and on a developer's laptop alike. Cost: a few file reads plus two short-lived `ethtool`
processes per physical NIC (none when ethtool is absent).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Final

__all__ = ["SYSCTL_KNOBS", "collect", "parse_ethtool_coalesce", "parse_ethtool_rings", "read_sysctl"]

# The knobs image/extra/usr/lib/sysctl.d/60-mediaplane-media.conf sets (docs/appliance.md says
# why), plus the busy-polling pair it documents but leaves off.
SYSCTL_KNOBS: Final[tuple[str, ...]] = (
    "net.core.rmem_max",
    "net.core.wmem_max",
    "net.core.rmem_default",
    "net.core.wmem_default",
    "net.core.netdev_max_backlog",
    "net.core.netdev_budget",
    "net.core.netdev_budget_usecs",
    "net.core.busy_read",
    "net.core.busy_poll",
    "net.ipv4.udp_mem",
    "net.ipv4.udp_rmem_min",
    "net.ipv4.udp_wmem_min",
    "net.ipv4.igmp_max_memberships",
)

_ETHTOOL_TIMEOUT_S: Final = 2.0
_NUMBER = re.compile(r"-?\d+")
_RX_TX_PAIR = re.compile(r"^(.*?)\s+RX:\s*(\S+)\s+TX:\s*(\S+)\s*$")


def _key(label: str) -> str:
    return label.strip().lower().replace("-", "_").replace(" ", "_")


def read_sysctl(name: str, proc_sys: Path = Path("/proc/sys")) -> int | str | None:
    """One sysctl by its dotted name: an int, a space-joined string for vectors, None if unreadable."""
    try:
        raw = (proc_sys / name.replace(".", "/")).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    fields = raw.split()
    if len(fields) == 1 and _NUMBER.fullmatch(fields[0]):
        return int(fields[0])
    return " ".join(fields)


def _value(text: str) -> int | str | None:
    text = text.strip()
    if _NUMBER.fullmatch(text):
        return int(text)
    if text in ("n/a", ""):
        return None
    return text


def parse_ethtool_rings(text: str) -> dict[str, dict[str, int | str | None]]:
    """`ethtool -g` text → {"max": {"rx": 4096, ...}, "current": {"rx": 256, ...}}."""
    sections: dict[str, dict[str, int | str | None]] = {}
    current: dict[str, int | str | None] | None = None
    for line in text.splitlines():
        if line.startswith("Pre-set maximums"):
            current = sections.setdefault("max", {})
        elif line.startswith("Current hardware settings"):
            current = sections.setdefault("current", {})
        elif current is not None and ":" in line:
            key, _, value = line.partition(":")
            current[_key(key)] = _value(value)
    return sections


def parse_ethtool_coalesce(text: str) -> dict[str, int | str | None]:
    """`ethtool -c` text → {"adaptive_rx": "off", "rx_usecs": 50, ...}."""
    settings: dict[str, int | str | None] = {}
    for line in text.splitlines()[1:]:  # the first line names the interface
        # "Adaptive RX: off  TX: off" and "CQE mode RX: n/a  TX: n/a" carry two settings each.
        pair = _RX_TX_PAIR.match(line)
        if pair:
            key = _key(pair.group(1))
            settings[f"{key}_rx"], settings[f"{key}_tx"] = _value(pair.group(2)), _value(pair.group(3))
        elif ":" in line:
            key, _, value = line.partition(":")
            settings[_key(key)] = _value(value)
    return settings


def _ethtool(ethtool: str, option: str, interface: str) -> str | None:
    try:
        done = subprocess.run(
            [ethtool, option, interface],
            capture_output=True,
            text=True,
            timeout=_ETHTOOL_TIMEOUT_S,
            check=False,
            env={"LC_ALL": "C", "PATH": os.defpath},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    # A driver without the feature answers "Operation not supported" with a non-zero status.
    return done.stdout if done.returncode == 0 else None


def _physical_interfaces(sys_class_net: Path) -> list[str]:
    try:
        entries = sorted(sys_class_net.iterdir())
    except OSError:
        return []
    # Virtual links (lo, bridges, veth, tunnels) have no backing device and no rings to tune.
    return [entry.name for entry in entries if (entry / "device").exists()]


def collect(
    *,
    proc_sys: Path = Path("/proc/sys"),
    sys_class_net: Path = Path("/sys/class/net"),
    ethtool: str | None = None,
) -> dict[str, object]:
    """Read the tuning knobs and NIC settings; JSON-ready, no side effects, never raises.

    Shape: ``{"sysctl": {name: value | None}, "ethtool": path | None,
    "nics": {name: {"rings": {...} | None, "coalesce": {...} | None}}}``.
    `ethtool` overrides the binary (tests); by default it is looked up on PATH and /usr/sbin.
    """
    sysctl = {name: read_sysctl(name, proc_sys) for name in SYSCTL_KNOBS}
    binary = ethtool or shutil.which("ethtool") or shutil.which("ethtool", path="/usr/sbin:/sbin")
    nics: dict[str, dict[str, object]] = {}
    for interface in _physical_interfaces(sys_class_net):
        rings_text = _ethtool(binary, "-g", interface) if binary else None
        coalesce_text = _ethtool(binary, "-c", interface) if binary else None
        nics[interface] = {
            "rings": parse_ethtool_rings(rings_text) if rings_text is not None else None,
            "coalesce": parse_ethtool_coalesce(coalesce_text) if coalesce_text is not None else None,
        }
    return {"sysctl": sysctl, "ethtool": binary, "nics": nics}
