"""The round trips an operator Action saves, and that saving them changes no answer."""

from __future__ import annotations

from typing import Any

from operator_support import Harness, objective

from schemas.result import ResultStatus
from worker.fingerprints import operator_fingerprint
from worker.operator.binding import new_binding
from worker.operator.handle import BindingHandle


def _count_scripts(store: Any, calls: list[str]) -> None:
    """Record every binding read, create and write `store` makes, in order."""
    for name in ("read", "create", "write"):
        original = getattr(store, name)

        async def counted(*args: Any, _name: str = name, _call: Any = original) -> Any:
            calls.append(f"operator_{_name}")
            return await _call(*args)

        setattr(store, name, counted)


async def test_a_first_lease_creates_the_binding_without_reading_it(harness: Harness) -> None:
    calls: list[str] = []
    _count_scripts(harness.store, calls)
    action = harness.action(objective("no read first"))
    ctx = await harness.lease(action)
    assert ctx.leased_at_ms > 0
    outcome = await harness.execute(ctx)
    assert outcome.status is ResultStatus.COMPLETED
    assert calls[0] == "operator_create"
    assert "operator_read" not in calls
    binding = await harness.require_binding(action.id)
    # The creation time is the lease's Redis time (what the read would have returned).
    assert binding.created_at == ctx.leased_at_ms


async def test_a_hinted_create_adopts_a_binding_that_exists_after_all(harness: Harness) -> None:
    """Even if a binding exists (it cannot after a first lease, but the script decides, not
    the hint), the stored binding is adopted and never replaced."""
    action = harness.action(objective("exists"))
    ctx = await harness.lease(action)
    fingerprint = operator_fingerprint(ctx.endpoint.id, action)
    first = BindingHandle(harness.store, ctx.keys, ctx.owner, ctx.fence)
    stored = await first.create(lambda now: new_binding(action, ctx.endpoint.id, fingerprint, now))
    later = BindingHandle(
        harness.store, ctx.keys, ctx.owner, ctx.fence, created_at_hint_ms=stored.created_at + 5
    )
    adopted = await later.create(
        lambda now: new_binding(action, ctx.endpoint.id, fingerprint, now)
    )
    assert adopted == stored
    assert await harness.require_binding(action.id) == stored


async def test_a_takeover_reads_the_binding_first(harness: Harness) -> None:
    action = harness.action(objective("takeover"))
    first = await harness.lease(action)
    second = await harness.replace_owner(first)
    assert second.is_takeover
    calls: list[str] = []
    _count_scripts(harness.store, calls)
    outcome = await harness.execute(second)
    assert outcome.status is ResultStatus.COMPLETED
    assert calls[0] == "operator_read"
