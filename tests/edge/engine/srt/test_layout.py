"""The ctypes binding against the C headers: every bound struct field and constant.

A small C program is compiled with gcc against ``/usr/include/srt/srt.h``; it prints
``sizeof``/``offsetof`` of every field we bind and the value of every constant, and
the test compares each with the ctypes side. A truncated or shifted ``SRT_TRACEBSTATS``
would make ``srt_bstats`` write past our buffer: this is the test that catches it.

Skips locally when gcc or the headers (libsrt-openssl-dev) are missing; fails in CI.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from services.edge.engine.srt import binding as b

HEADER = Path("/usr/include/srt/srt.h")

STRUCTS: dict[str, tuple[str, type[ctypes.Structure]]] = {
    "SRT_TRACEBSTATS": ("SRT_TRACEBSTATS", b.SRT_TRACEBSTATS),
    "SRT_MSGCTRL": ("SRT_MSGCTRL", b.SRT_MSGCTRL),
    "SRT_EPOLL_EVENT": ("SRT_EPOLL_EVENT", b.SRT_EPOLL_EVENT),
}

# Every constant the binding defines that srt.h (1.5.1) declares; the probe-only
# SRTO_CRYPTOMODE / SRTO_MAXREXMITBW are absent from this header by design.
CONSTANTS = [
    name
    for name in dir(b)
    if name.startswith(("SRTS_", "SRTO_", "SRTT_", "SRT_KM_S_", "SRT_EPOLL_", "SRT_E", "SRT_REJ_"))
    and isinstance(getattr(b, name), int)
    and name not in ("SRTO_CRYPTOMODE", "SRTO_MAXREXMITBW")
] + ["SRT_INVALID_SOCK", "SRT_ERROR", "SRT_LIVE_MAX_PLSIZE"]


def _require_toolchain() -> str:
    gcc = shutil.which("gcc")
    if gcc is None or not HEADER.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("gcc or /usr/include/srt/srt.h missing in CI (install gcc, libsrt-openssl-dev)")
        pytest.skip("gcc or libsrt-openssl-dev headers not installed")
    return gcc


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    gcc = _require_toolchain()
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <srt/srt.h>", "int main(void) {"]
    for label, (c_type, py_type) in STRUCTS.items():
        lines.append(f'  printf("{label}.sizeof %zu\\n", sizeof({c_type}));')
        for field, _ in py_type._fields_:
            lines.append(f'  printf("{label}.{field} %zu\\n", offsetof({c_type}, {field}));')
            lines.append(f'  printf("{label}.{field}.size %zu\\n", sizeof((({c_type}*)0)->{field}));')
    for name in CONSTANTS:
        lines.append(f'  printf("const.{name} %lld\\n", (long long)({name}));')
    lines += ["  return 0;", "}"]
    work = tmp_path_factory.mktemp("srt_layout")
    src = work / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = work / "layout"
    subprocess.run([gcc, "-Wall", "-o", str(exe), str(src), "-lsrt"], check=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=10).stdout
    table = {}
    for line in out.splitlines():
        key, value = line.split()
        table[key] = int(value)
    return table


def test_constants_list_is_not_empty() -> None:
    assert len(CONSTANTS) > 40


@pytest.mark.parametrize("label", sorted(STRUCTS))
def test_struct_size_and_every_field_offset(c_layout: dict[str, int], label: str) -> None:
    _, py_type = STRUCTS[label]
    assert ctypes.sizeof(py_type) == c_layout[f"{label}.sizeof"]
    assert py_type._fields_
    for field, ctype in py_type._fields_:
        assert getattr(py_type, field).offset == c_layout[f"{label}.{field}"], field
        assert ctypes.sizeof(ctype) == c_layout[f"{label}.{field}.size"], field


def test_bstats_binds_every_field_of_the_header(c_layout: dict[str, int]) -> None:
    # Our last field ends exactly where the C struct ends: nothing left unbound.
    last_name, last_type = b.SRT_TRACEBSTATS._fields_[-1]
    end = getattr(b.SRT_TRACEBSTATS, last_name).offset + ctypes.sizeof(last_type)
    assert end == c_layout["SRT_TRACEBSTATS.sizeof"]


@pytest.mark.parametrize("name", CONSTANTS)
def test_constant(c_layout: dict[str, int], name: str) -> None:
    ours = getattr(b, name)
    theirs = c_layout[f"const.{name}"]
    if name == "SRT_EPOLL_ET":  # 1u << 31 in C; the API takes it as a (negative) int
        theirs = ctypes.c_int32(theirs).value
    assert ours == theirs
