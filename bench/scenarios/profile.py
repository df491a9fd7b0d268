"""py-spy on the engine worker while a step runs: the top frames by own and by total time.

``py-spy record --nonblocking`` samples without stopping the worker (a blocking sampler pauses
it at every sample, which would itself cost packets). ``--idle`` keeps the samples where the
worker waits in epoll, so the table shows how busy it was; ``--function`` folds line numbers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PY_SPY_RATE = 250  # samples/s: enough for a 4 s step, cheap for the sampled process


@dataclass
class Profile:
    samples: int
    idle_samples: int
    own: list[tuple[str, int]]  # (function, samples in it, not in callees), most first
    total: list[tuple[str, int]]  # (function, samples with it on the stack), most first
    raw_path: Path

    def lines(self, top: int = 15) -> list[str]:
        if not self.samples:
            return ["(no samples)"]
        busy = self.samples - self.idle_samples
        out = [
            f"{self.samples} samples, {self.idle_samples / self.samples:.0%} idle (waiting in epoll), "
            f"{busy / self.samples:.0%} busy; shares below are of all samples"
        ]
        out.append("own time (function itself):")
        out += [f"  {n / self.samples:6.1%}  {name}" for name, n in self.own[:top]]
        out.append("total time (function and its callees; the frames on every stack left out):")
        inner = [(name, n) for name, n in self.total if n < 0.97 * self.samples]
        out += [f"  {n / self.samples:6.1%}  {name}" for name, n in inner[:top]]
        return out


def py_spy() -> str | None:
    venv = Path(sys.executable).with_name("py-spy")
    return str(venv) if venv.exists() else shutil.which("py-spy")


def start(pid: int, seconds: float, raw_path: Path) -> subprocess.Popen[bytes] | None:
    """Start sampling ``pid`` for ``seconds``; None when py-spy is missing."""
    tool = py_spy()
    if tool is None:
        return None
    return subprocess.Popen(
        [
            tool,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            str(PY_SPY_RATE),
            "--nonblocking",
            "--idle",
            "--function",
            "--format",
            "raw",
            "--output",
            str(raw_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(process: subprocess.Popen[bytes] | None, raw_path: Path) -> Profile | None:
    if process is None:
        return None
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return None
    if not raw_path.exists():
        raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")
    return summarise(raw_path)


_IDLE_MARKERS = ("get_events", "epoll", "select (selectors.py)", "wait (threading.py)")


def _name(frame: str) -> str:
    # "func (path/to/file.py)" -> "func (file.py)"; keeps it short and unambiguous enough.
    func, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for prefix in ("services/", "appliance/", "trio/"):
        if prefix in where:
            where = where[where.index(prefix) :]
            break
    else:
        where = where.rsplit("/", 1)[-1]
    return f"{func} ({where})"


def summarise(raw_path: Path) -> Profile:
    """Fold py-spy's raw (collapsed-stack) output into own and total counts per function."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = idle = 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if " (" in f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += count
        leaf = frames[-1]
        if any(marker in leaf for marker in _IDLE_MARKERS) or "get_events" in stack:
            idle += count
        own[_name(leaf)] += count
        for name in {_name(f) for f in frames}:
            total[name] += count
    return Profile(samples, idle, own.most_common(), total.most_common(), raw_path)
