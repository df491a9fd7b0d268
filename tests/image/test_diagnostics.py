"""services.edge.diagnostics: sysctl reads, ethtool parsing, and collect() on fake trees."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from services.edge import diagnostics

SYSCTL_CONF = Path(__file__).resolve().parents[2] / "image/extra/usr/lib/sysctl.d/60-mediaplane-media.conf"

RINGS = """Ring parameters for enp1s0:
Pre-set maximums:
RX:\t\t4096
RX Mini:\tn/a
RX Jumbo:\tn/a
TX:\t\t4096
Current hardware settings:
RX:\t\t512
RX Mini:\tn/a
RX Jumbo:\tn/a
TX:\t\t512
"""

COALESCE = """Coalesce parameters for enp1s0:
Adaptive RX: off  TX: on
stats-block-usecs:\tn/a
rx-usecs:\t50
rx-frames:\t0
tx-usecs:\t64
CQE mode RX: n/a  TX: n/a
"""


def fake_proc_sys(root: Path, values: dict[str, str]) -> Path:
    for name, value in values.items():
        path = root / name.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return root


def test_read_sysctl_int_vector_and_missing(tmp_path: Path) -> None:
    proc = fake_proc_sys(tmp_path, {"net.core.rmem_max": "67108864", "net.ipv4.udp_mem": "131072\t262144\t524288"})
    assert diagnostics.read_sysctl("net.core.rmem_max", proc) == 67108864
    assert diagnostics.read_sysctl("net.ipv4.udp_mem", proc) == "131072 262144 524288"
    assert diagnostics.read_sysctl("net.core.busy_poll", proc) is None


def test_parse_rings() -> None:
    rings = diagnostics.parse_ethtool_rings(RINGS)
    assert rings["max"]["rx"] == 4096
    assert rings["current"]["rx"] == 512
    assert rings["current"]["rx_mini"] is None


def test_parse_coalesce() -> None:
    settings = diagnostics.parse_ethtool_coalesce(COALESCE)
    assert settings["adaptive_rx"] == "off"
    assert settings["adaptive_tx"] == "on"
    assert settings["rx_usecs"] == 50
    assert settings["tx_usecs"] == 64
    assert settings["stats_block_usecs"] is None
    assert settings["cqe_mode_rx"] is None


def fake_ethtool(tmp_path: Path) -> str:
    # Answers -g and -c for enp1s0; fails like a driver without the feature for anything else.
    script = tmp_path / "ethtool"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$2" != enp1s0 ]; then echo "Operation not supported" >&2; exit 95; fi\n'
        f"case \"$1\" in -g) cat <<'X'\n{RINGS}X\n;; -c) cat <<'X'\n{COALESCE}X\n;; *) exit 1;; esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def fake_sys_class_net(root: Path) -> Path:
    for name, physical in (("lo", False), ("enp1s0", True), ("virtio0", True), ("br0", False)):
        (root / name).mkdir(parents=True)
        if physical:
            (root / name / "device").mkdir()
    return root


def test_collect_on_fake_trees(tmp_path: Path) -> None:
    proc = fake_proc_sys(tmp_path / "proc", {"net.core.rmem_max": "67108864", "net.core.netdev_budget": "600"})
    net = fake_sys_class_net(tmp_path / "net")
    result = diagnostics.collect(proc_sys=proc, sys_class_net=net, ethtool=fake_ethtool(tmp_path))
    json.dumps(result)  # the route returns it as is
    sysctl = result["sysctl"]
    assert isinstance(sysctl, dict)
    assert set(sysctl) == set(diagnostics.SYSCTL_KNOBS)
    assert sysctl["net.core.rmem_max"] == 67108864
    assert sysctl["net.ipv4.udp_mem"] is None
    nics = result["nics"]
    assert isinstance(nics, dict)
    assert sorted(nics) == ["enp1s0", "virtio0"]  # lo and the bridge have no device
    assert nics["enp1s0"]["rings"]["current"]["rx"] == 512
    assert nics["enp1s0"]["coalesce"]["rx_usecs"] == 50
    assert nics["virtio0"] == {"rings": None, "coalesce": None}  # "Operation not supported"


def test_collect_without_ethtool(tmp_path: Path) -> None:
    net = fake_sys_class_net(tmp_path / "net")
    result = diagnostics.collect(proc_sys=tmp_path / "none", sys_class_net=net, ethtool=str(tmp_path / "no-such"))
    assert result["nics"] == {"enp1s0": {"rings": None, "coalesce": None}, "virtio0": {"rings": None, "coalesce": None}}
    assert all(value is None for value in result["sysctl"].values())


def test_collect_on_this_host_does_not_raise() -> None:
    result = diagnostics.collect()
    assert isinstance(result["sysctl"]["net.core.rmem_max"], int)  # /proc/sys/net is always there on Linux


def test_every_knob_the_image_sets_is_reported() -> None:
    # The image test compares collect() with this file: a knob missing here would go unchecked.
    keys = {
        line.split("=", 1)[0].strip()
        for line in SYSCTL_CONF.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    assert keys
    assert keys <= set(diagnostics.SYSCTL_KNOBS)
