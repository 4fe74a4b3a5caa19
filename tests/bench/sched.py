"""How a measured process spent the wall time: on a CPU, or runnable and waiting for one.

Why: on two cores a worker shares the machine with nats-server, Redis and the fake Hermes,
so its rate is its CPU per Action times the share of a core it gets. Whether a system is
CPU-bound, and how long it queued for a CPU beside the others, is what tells a cost of its
own from the machine's (BENCHMARKS.md, "Where one process's time goes while measured").

The kernel keeps both per thread, cumulatively, in `/proc/PID/task/TID/schedstat` (time on
a CPU and time runnable but waiting, in nanoseconds, then the number of timeslices), so two
readings around the measured window are enough. Where the file does not exist (not Linux,
or a kernel without schedstats) the reading is None and the shares are NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class SchedTimes:
    """Seconds the threads of some processes spent on a CPU and waiting for one, so far."""

    on_cpu_s: float
    waiting_s: float


def parse_schedstat(text: str) -> SchedTimes:
    """One thread's `schedstat` line: `on-CPU-ns waiting-ns timeslices`."""
    on_cpu_ns, waiting_ns = (int(field) for field in text.split()[:2])
    return SchedTimes(on_cpu_ns / 1e9, waiting_ns / 1e9)


def sched_times(pids: Iterable[int | None], proc: Path = PROC) -> SchedTimes | None:
    """The sum over every thread of `pids`; None when a process cannot be read (gone, not
    started, or no schedstats here). A thread that ends between the listing and its read
    is left out: its time is lost, the reading is not."""
    on_cpu_s = waiting_s = 0.0
    for pid in pids:
        if pid is None:
            return None
        try:
            tasks = list((proc / str(pid) / "task").iterdir())
        except OSError:
            return None
        read = 0
        for task in tasks:
            try:
                times = parse_schedstat((task / "schedstat").read_text())
            except (OSError, ValueError):
                continue
            on_cpu_s += times.on_cpu_s
            waiting_s += times.waiting_s
            read += 1
        if not read:
            return None
    return SchedTimes(on_cpu_s, waiting_s)


def shares(
    before: SchedTimes | None, after: SchedTimes | None, wall_s: float, processes: int
) -> tuple[float, float]:
    """(on a CPU, waiting for one) as shares of each process's wall time between the two
    readings; NaN when either reading is missing."""
    if before is None or after is None or wall_s <= 0 or processes <= 0:
        return math.nan, math.nan
    span = wall_s * processes
    return (
        (after.on_cpu_s - before.on_cpu_s) / span,
        (after.waiting_s - before.waiting_s) / span,
    )
