"""Where the engine's processes run: the CPU plan and the workers' priority, on a real mp-edge."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.edge.engine.supervisor import WORKER_NICE, WORKER_REALTIME, cpu_plan, default_worker_count
from tests.helpers.edge import running_edge, wait_for
from tests.helpers.procfs import engine_workers


def test_the_control_process_keeps_the_first_cpu_and_each_worker_gets_another() -> None:
    assert cpu_plan(1, [0, 1]) == ([0], [1])
    assert cpu_plan(3, [2, 5, 7, 9]) == ([2], [5, 7, 9])
    assert cpu_plan(1, [3, 1]) == ([1], [3])  # by number, whatever order the kernel gave


def test_nothing_is_pinned_when_the_cpus_do_not_go_round() -> None:
    assert cpu_plan(1, [0]) == (None, [None])  # one CPU: everything shares it
    assert cpu_plan(2, [0, 1]) == (None, [None, None])  # two workers would share a pinned core


def _stat(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()  # from field 3 on (proc(5))


def _nice(pid: int) -> int:
    return int(_stat(pid)[16])  # field 19: nice


def _realtime(pid: int) -> tuple[int, int]:
    fields = _stat(pid)
    return int(fields[38]), int(fields[37])  # fields 41 (policy) and 40 (rt_priority)


def _workers(control: int) -> list[int]:
    found: list[int] = wait_for(
        lambda: len(children := engine_workers(control)) == default_worker_count() and children, timeout=30
    )
    return found


@pytest.mark.e2e
def test_pinned_workers_run_on_their_own_cpu(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    with running_edge(tmp_path, extra_args=["--pin-cpus"]) as edge:
        control = edge.process.pid
        workers = _workers(control)
        allowed = sorted(os.sched_getaffinity(0))
        assert os.sched_getaffinity(control) == {allowed[0]}
        assert sorted(cpu for worker in workers for cpu in os.sched_getaffinity(worker)) == allowed[1:]


@pytest.mark.e2e
def test_workers_are_real_time_and_float_by_default(tmp_path: Path) -> None:
    with running_edge(tmp_path) as edge:
        control = edge.process.pid
        workers = _workers(control)
        allowed = os.sched_getaffinity(0)
        assert os.sched_getaffinity(control) == allowed
        assert all(os.sched_getaffinity(worker) == allowed for worker in workers)
        assert _realtime(control) == (os.SCHED_OTHER, 0)
        expected = (os.SCHED_FIFO, WORKER_REALTIME) if os.geteuid() == 0 else (os.SCHED_OTHER, 0)
        assert wait_for(lambda: all(_realtime(worker) == expected for worker in workers), timeout=10)


@pytest.mark.e2e
def test_without_real_time_the_workers_run_before_the_control_process(tmp_path: Path) -> None:
    with running_edge(tmp_path, extra_args=["--worker-realtime", "0"]) as edge:
        control = edge.process.pid
        workers = _workers(control)
        assert _nice(control) == _nice(os.getpid())
        expected = WORKER_NICE if os.geteuid() == 0 else _nice(os.getpid())
        assert wait_for(lambda: all(_nice(worker) == expected for worker in workers), timeout=10)
        assert all(_realtime(worker) == (os.SCHED_OTHER, 0) for worker in workers)
