"""The fault schedule is a pure function of the seed, covers every kind, and never puts
two faults on one target at once."""

from __future__ import annotations

import itertools
from collections import Counter

from tests.chaos.nemesis import KINDS, schedule


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert schedule(7, 120, disk=True) == schedule(7, 120, disk=True)
    assert schedule(7, 120, disk=True) != schedule(8, 120, disk=True)


def test_a_long_schedule_injects_every_kind_and_overlaps_faults() -> None:
    faults = schedule(1, 600, disk=True)
    assert set(Counter(f.kind for f in faults)) == set(KINDS)
    overlapping = [(a, b) for a, b in itertools.pairwise(faults) if b.at < a.at + a.duration]
    assert overlapping, "two faults should overlap somewhere in ten minutes"


def test_one_target_carries_one_fault_at_a_time() -> None:
    busy: dict[str, float] = {}
    for fault in schedule(3, 600, disk=True):
        for key in fault.occupies():
            assert busy.get(key, 0.0) <= fault.at, f"{fault} overlaps on {key}"
            busy[key] = fault.at + fault.duration


def test_every_fault_heals_within_the_horizon_and_kinds_filter() -> None:
    faults = schedule(5, 60, disk=False)
    assert all(f.at + f.duration <= 60 for f in faults)
    assert "disk_full" not in {f.kind for f in faults}
    only = schedule(5, 60, disk=True, kinds=("kill",))
    assert only
    assert {f.kind for f in only} == {"kill"}


def test_the_real_hermes_shape_draws_only_its_targets_and_fewer_faults() -> None:
    from tests.chaos.deployment import REAL_WORKERS
    from tests.chaos.nemesis import REAL

    faults = schedule(1, 600, disk=True, shape=REAL)
    kinds = {f.kind for f in faults}
    assert kinds == {k for k, w in zip(KINDS, REAL.weights, strict=True) if w}
    assert "disk_full" not in kinds
    for fault in faults:
        if fault.kind in ("kill", "pause"):
            assert fault.target in REAL_WORKERS, fault
        elif fault.kind in ("partition", "latency", "drop"):
            worker, dep = fault.target.split("->")
            assert worker in REAL_WORKERS, fault
            assert dep in ("hermes", "all") if fault.kind == "partition" else dep == "hermes"
        elif fault.kind == "clock":
            assert fault.target in REAL_WORKERS, fault
    assert len(faults) < len(schedule(1, 600, disk=True)) * 0.7
