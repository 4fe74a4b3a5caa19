"""The worker process's garbage-collector schedule (worker/gc_policy.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from worker import gc_policy


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """Give the test process its collector back as it was: unfrozen, default schedule."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_settle_startup_freezes_survivors_and_lengthens_the_schedule(restored_gc: None) -> None:
    survivor = [object()]  # a long-lived object that exists before the worker fetches work
    gc.unfreeze()
    gc_policy.settle_startup()
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(survivor)
    assert gc.get_threshold() == (
        gc_policy.YOUNG_THRESHOLD, gc_policy.MIDDLE_THRESHOLD, gc_policy.OLD_THRESHOLD
    )


def test_start_up_cyclic_garbage_is_collected_not_frozen(restored_gc: None) -> None:
    collected: list[str] = []

    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector can free it

        def __del__(self) -> None:
            collected.append("node")

    gc.disable()
    try:
        Node()
        gc_policy.settle_startup()
    finally:
        gc.enable()
    assert collected == ["node"]
