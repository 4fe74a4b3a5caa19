"""The planted bugs still plant: each mutation, installed in this process, patches what it
names (the campaign tests that show the checker finds them run only on request,
`AIPD_CHAOS_MUTATIONS=1`, so a hook that stopped applying would go unnoticed there)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.chaos.launcher import MUTATIONS, install_mutation
from worker.execution import leases
from worker.operator import resume, start
from worker.operator.binding import BindingState
from worker.store import scripts

#: Every attribute a mutation may replace, put back after each test.
PATCHED: list[tuple[Any, str]] = [
    (scripts, "script_source"),
    (leases.HeldLease, "check"),
    (leases.LeaseKeeper, "lose"),
    (start.StartFence, "_unknown"),
    (resume, "_answering"),
    (resume.ResumeLedger, "_apply"),
]
PATCHED_ORIGINALS = {name: owner.__dict__[name] for owner, name in PATCHED}


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    saved = [(owner, name, owner.__dict__[name]) for owner, name in PATCHED]
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def test_every_mutation_has_a_test() -> None:
    assert sorted(MUTATIONS) == [
        "resend_unbound_start",
        "stale_settle",
        "two_decisions_per_generation",
    ]


def test_stale_settle_unfences_the_settle_script_and_the_local_checks() -> None:
    before = scripts.script_source("settle")
    install_mutation("stale_settle")
    # What the worker's Scripts load (Scripts reads the module's script_source).
    loaded = scripts.Scripts(SimpleNamespace(execute_command=None), ("settle",))
    source = loaded._scripts["settle"].script
    assert source != before
    assert "if false then" in source
    assert "redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2]" not in source
    assert leases.HeldLease.__dict__["check"] is not PATCHED_ORIGINALS["check"]
    assert leases.LeaseKeeper.__dict__["lose"] is not PATCHED_ORIGINALS["lose"]


def test_resend_unbound_start_replaces_the_unknown_outcome_of_an_unbound_claim() -> None:
    install_mutation("resend_unbound_start")
    assert start.StartFence.__dict__["_unknown"] is not PATCHED_ORIGINALS["_unknown"]
    # The mutation acts on the reasons `run` gives for an earlier delivery's unbound claim,
    # and takes it over with the methods the production holder uses: still there.
    run = inspect.getsource(start.StartFence.run)
    assert run.count('"the start claim') == 2
    for name in ("_claim", "_send", "claim_id"):
        assert name in inspect.getsource(start.StartFence), name
    assert BindingState.STARTING


def test_two_decisions_per_generation_blinds_the_ledger_to_answered_generations() -> None:
    """tests/qualify/test_qualify_generation_mutation.py installs it in the workers."""
    install_mutation("two_decisions_per_generation")
    assert resume.__dict__["_answering"] is not PATCHED_ORIGINALS["_answering"]
    assert resume._answering(object(), 1) == []
    # Each claimed decision is held before it is sent, so resumes arriving together overlap.
    assert resume.ResumeLedger.__dict__["_apply"] is not PATCHED_ORIGINALS["_apply"]
    # The ledger still asks `_answering` before it claims a generation: the hook bites.
    assert inspect.getsource(resume).count("_answering(") >= 3  # its def and two callers
