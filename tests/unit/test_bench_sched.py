"""The bench's reading of the kernel's per-thread scheduler accounting."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from tests.bench.sched import SchedTimes, parse_schedstat, sched_times, shares


def _fake_proc(root: Path, pid: int, lines: list[str]) -> None:
    for tid, line in enumerate(lines, start=pid):
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        (task / "schedstat").write_text(line + "\n")


def test_a_schedstat_line_is_on_cpu_then_waiting_in_nanoseconds() -> None:
    assert parse_schedstat("1500000000 250000000 42\n") == SchedTimes(1.5, 0.25)


def test_every_thread_of_every_process_is_summed(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 100, ["1000000000 100000000 5", "500000000 0 1"])
    _fake_proc(tmp_path, 200, ["2000000000 400000000 9"])

    assert sched_times([100, 200], proc=tmp_path) == SchedTimes(3.5, 0.5)


def test_a_process_that_cannot_be_read_gives_no_reading(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 100, ["1000000000 100000000 5"])

    assert sched_times([100, 999], proc=tmp_path) is None
    assert sched_times([None], proc=tmp_path) is None


def test_shares_are_of_each_process_wall_time_and_nan_without_a_reading() -> None:
    before, after = SchedTimes(1.0, 0.2), SchedTimes(4.6, 0.6)

    on_cpu, waiting = shares(before, after, wall_s=2.0, processes=2)
    assert (round(on_cpu, 6), round(waiting, 6)) == (0.9, 0.1)
    assert all(math.isnan(share) for share in shares(None, after, 2.0, 2))


def test_this_process_reads_back_time_it_spent_on_a_cpu() -> None:
    """On this machine's kernel: 50 ms of CPU spent here show up as time on a CPU."""
    before = sched_times([os.getpid()])
    if before is None:
        pytest.skip("this kernel keeps no schedstats (the bench prints `-`)")
    spent_until = time.process_time() + 0.05
    while time.process_time() < spent_until:
        pass
    after = sched_times([os.getpid()])
    assert after is not None
    assert after.on_cpu_s - before.on_cpu_s >= 0.04
