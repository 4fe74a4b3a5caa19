"""The lease scripts' guarantees, against a real Redis over both of the client's paths (the
shared script connection and redis-py's pool), which must agree (docs/architecture.md §5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from schemas.ids import new_action_id
from worker.errors import StoreUnavailable
from worker.store.connection import multiplexed, open_redis
from worker.store.keys import ActionKeys
from worker.store.lease_store import (
    MAX_PENDING_CANCELS,
    AcquireStatus,
    ActionSubject,
    CancelState,
    LeaseStore,
    SettleStatus,
)
from worker.store.multiplexed import _Wire
from worker.testing.services import ServiceHandle


@pytest.fixture
def store(store_client: Any) -> LeaseStore:
    """Over both Redis paths (`store_client`): every guarantee below holds on each."""
    return LeaseStore(store_client, call_budget_s=2.0)


async def test_fences_only_grow_and_an_expired_lease_is_taken_over(store: LeaseStore) -> None:
    keys = ActionKeys.of(new_action_id())
    first = await store.acquire(keys, "w1#a", 200, "fp")
    assert (first.status, first.fence, first.is_takeover) == (AcquireStatus.ACQUIRED, 1, False)
    held = await store.acquire(keys, "w2#b", 200, "fp")
    assert (held.status, held.other_owner) == (AcquireStatus.HELD, "w1#a")
    await asyncio.sleep(0.3)
    second = await store.acquire(keys, "w2#b", 200, "fp")
    assert (second.status, second.fence, second.other_owner) == (AcquireStatus.ACQUIRED, 2, "w1#a")
    assert second.is_takeover
    again = await store.acquire(keys, "w2#b", 200, "fp")
    assert (again.status, again.fence) == (AcquireStatus.ACQUIRED, 2)


async def test_a_replaced_owner_can_neither_renew_settle_nor_release(store: LeaseStore) -> None:
    keys = ActionKeys.of(new_action_id())
    old = await store.acquire(keys, "w1#a", 100, "fp")
    await asyncio.sleep(0.2)
    new = await store.acquire(keys, "w2#b", 5000, "fp")
    [renewal] = await store.renew_many([(keys, "w1#a", old.fence)], 5000, budget_s=1)
    assert not renewal.still_held
    assert not await store.release(keys, "w1#a", old.fence)
    assert not await store.mark_attempt(keys, "w1#a", old.fence)
    stale = await store.settle(keys, "w1#a", old.fence, b'{"by":"w1"}', b"t1")
    assert stale.status is SettleStatus.FENCED_OUT
    won = await store.settle(keys, "w2#b", new.fence, b'{"by":"w2"}', b"t2")
    assert (won.status, won.stored, won.terminal) == (SettleStatus.SETTLED, b'{"by":"w2"}', b"t2")


async def test_results_are_write_once_and_replays_see_them(store: LeaseStore) -> None:
    keys = ActionKeys.of(new_action_id())
    grant = await store.acquire(keys, "w1#a", 5000, "fp")
    await store.settle(keys, "w1#a", grant.fence, b"first", b"first-terminal")
    repeat = await store.settle(keys, "w1#a", grant.fence, b"second", b"second-terminal")
    assert (repeat.status, repeat.stored, repeat.terminal) == (
        SettleStatus.EXISTS, b"first", b"first-terminal"
    )
    replay = await store.acquire(keys, "w3#c", 5000, "fp")
    assert replay.status is AcquireStatus.SETTLED
    assert await store.get_settled(keys) == (b"first", b"first-terminal", None)


async def test_owed_chunks_are_stored_with_the_result_and_returned_by_a_repeat(
    store: LeaseStore,
) -> None:
    keys = ActionKeys.of(new_action_id())
    grant = await store.acquire(keys, "w1#a", 5000, "fp")
    settled = await store.settle(keys, "w1#a", grant.fence, b"r", b"t", b"c0\nc1")
    assert (settled.status, settled.owed) == (SettleStatus.SETTLED, b"c0\nc1")
    repeat = await store.settle(keys, "w1#a", grant.fence, b"r2", b"t2", b"other")
    assert (repeat.status, repeat.stored, repeat.owed) == (SettleStatus.EXISTS, b"r", b"c0\nc1")
    assert await store.get_settled(keys) == (b"r", b"t", b"c0\nc1")


async def test_reuse_with_another_request_is_a_collision_even_after_settling(
    store: LeaseStore,
) -> None:
    keys = ActionKeys.of(new_action_id())
    grant = await store.acquire(keys, "w1#a", 5000, "fp-1")
    assert (await store.acquire(keys, "w2#b", 5000, "fp-2")).status is AcquireStatus.COLLISION
    await store.settle(keys, "w1#a", grant.fence, b"done", b"t")
    assert (await store.acquire(keys, "w2#b", 5000, "fp-2")).status is AcquireStatus.COLLISION


async def test_unsafe_attempt_is_visible_to_the_next_owner(store: LeaseStore) -> None:
    keys = ActionKeys.of(new_action_id())
    first = await store.acquire(keys, "w1#a", 100, "fp")
    assert await store.mark_attempt(keys, "w1#a", first.fence)
    await asyncio.sleep(0.2)
    second = await store.acquire(keys, "w2#b", 5000, "fp")
    assert second.attempted_fence == first.fence


SUBJECT = ActionSubject("user:alice", "tenant-a", "cap:hermes_agent:h1:models")


async def test_cancel_intent_is_durable_and_reaches_the_holder_on_renewal(
    store: LeaseStore,
) -> None:
    keys = ActionKeys.of(new_action_id())
    grant = await store.acquire(keys, "w1#a", 5000, "fp", SUBJECT)
    assert not grant.cancel_requested
    assert await store.cancel_subject(keys) == SUBJECT
    answer = await store.request_cancel(
        keys, b"{}", requested_by="user:alice", authorized_for="user:alice"
    )
    assert (answer.state, answer.owner) == (CancelState.RECORDED, "w1#a")
    [renewal] = await store.renew_many([(keys, "w1#a", grant.fence)], 5000, budget_s=1)
    assert renewal.cancel_requested
    assert await store.cancel_requested_many([keys], budget_s=1) == [True]
    again = await store.request_cancel(
        keys, b"{}", requested_by="user:alice", authorized_for="user:alice"
    )
    assert again.state is CancelState.ALREADY_REQUESTED


async def test_a_cancel_authorized_against_another_principal_writes_nothing(
    store: LeaseStore,
) -> None:
    keys = ActionKeys.of(new_action_id())
    # Authorized while no worker knew the Action; leased before the write: re-check.
    await store.acquire(keys, "w1#a", 5000, "fp", SUBJECT)
    answer = await store.request_cancel(keys, b"{}", requested_by="user:bob", authorized_for="")
    assert (answer.state, answer.principal_id) == (CancelState.CHANGED, "user:alice")
    assert await store.cancel_intent(keys) is None
    assert await store.pending_cancels(keys) == {}


async def test_cancels_before_the_lease_wait_for_the_leasing_worker(store: LeaseStore) -> None:
    keys = ActionKeys.of(new_action_id())
    assert await store.cancel_subject(keys) is None
    for requester in ("user:mallory", "user:alice"):
        answer = await store.request_cancel(
            keys, requester.encode(), requested_by=requester, authorized_for=""
        )
        assert answer.state is CancelState.PENDING
    # Nothing cancels yet: only the intent key does, and it is not written.
    assert await store.cancel_intent(keys) is None
    grant = await store.acquire(keys, "w1#a", 5000, "fp", SUBJECT)
    assert (grant.cancel_pending, grant.cancel_requested) == (True, False)
    assert await store.pending_cancels(keys) == {
        "user:mallory": b"user:mallory",
        "user:alice": b"user:alice",
    }
    # The leasing worker authorized alice's: it becomes the intent, the rest is dropped.
    assert await store.promote_cancel(keys, b"user:alice") is True
    assert await store.cancel_intent(keys) == b"user:alice"
    assert await store.pending_cancels(keys) == {}


async def test_unauthorized_pending_cancels_are_dropped_and_bounded(store: LeaseStore) -> None:
    keys = ActionKeys.of(new_action_id())
    for n in range(MAX_PENDING_CANCELS):
        answer = await store.request_cancel(
            keys, b"{}", requested_by=f"user:{n}", authorized_for=""
        )
        assert answer.state is CancelState.PENDING
    full = await store.request_cancel(keys, b"{}", requested_by="user:x", authorized_for="")
    assert full.state is CancelState.PENDING_FULL
    assert await store.promote_cancel(keys, None) is False
    assert await store.cancel_intent(keys) is None
    assert await store.pending_cancels(keys) == {}


async def test_renewals_of_many_leases_take_one_round_trip(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pipeline on redis-py's path; on the shared connection, one write carrying every
    renewal (`Multiplexed.execute_many`)."""
    keys = [ActionKeys.of(new_action_id()) for _ in range(500)]
    grants = [await store.acquire(k, f"w1#{i}", 5000, "fp") for i, k in enumerate(keys)]
    pipelines: list[object] = []
    make_pipeline = store.redis.pipeline

    def counting_pipeline(*args: object, **kwargs: object) -> object:
        pipe = make_pipeline(*args, **kwargs)
        pipelines.append(pipe)
        return pipe

    store.redis.pipeline = counting_pipeline
    writes: list[int] = []
    flush = _Wire._flush

    def counting_flush(wire: _Wire) -> None:
        writes.append(len(wire.outbox))
        flush(wire)

    monkeypatch.setattr(_Wire, "_flush", counting_flush)
    before = (await store.redis.info("commandstats"))["cmdstat_evalsha"]["calls"]
    renewals = await store.renew_many(
        [(k, f"w1#{i}", g.fence) for i, (k, g) in enumerate(zip(keys, grants, strict=True))],
        5000,
        budget_s=5,
    )
    after = (await store.redis.info("commandstats"))["cmdstat_evalsha"]["calls"]
    assert all(r.still_held for r in renewals)
    if multiplexed(store.redis) is None:
        assert len(pipelines) == 1
    else:
        assert pipelines == []
        assert max(writes) >= 500, writes  # a health PING may share the write
    assert after - before == 500


@pytest.mark.chaos
async def test_a_frozen_redis_is_unavailable_and_the_retry_answers_after(
    store: LeaseStore, redis_server: ServiceHandle
) -> None:
    keys = ActionKeys.of(new_action_id())
    await asyncio.to_thread(redis_server.pause)
    try:
        with pytest.raises(StoreUnavailable):
            await store.acquire(keys, "w1#a", 5000, "fp")
    finally:
        await asyncio.to_thread(redis_server.resume)
    # The script may have run before the freeze hid its reply; asking again with the same
    # owner token tells what happened instead of taking a second fence.
    grant = await store.acquire(keys, "w1#a", 5000, "fp")
    assert grant.status is AcquireStatus.ACQUIRED
    assert grant.fence == 1


async def test_both_redis_paths_answer_a_lease_life_alike(redis_server: ServiceHandle) -> None:
    """The same sequence of lease calls, once on each path, gives the same answers."""
    async def life(multiplex: bool) -> list[object]:
        client = open_redis(redis_server.url, socket_timeout_s=1.0, multiplex=multiplex)
        try:
            store = LeaseStore(client, call_budget_s=2.0)
            keys = ActionKeys.of(new_action_id())
            first = await store.acquire(keys, "w1#a", 5_000, "fp")
            held = await store.acquire(keys, "w2#b", 5_000, "fp")
            cancel = await store.request_cancel(
                keys, b"{}", requested_by="user:a", authorized_for=""
            )
            [renewal] = await store.renew_many([(keys, "w1#a", first.fence)], 5_000, budget_s=2)
            result, terminal = b'{"status":"succeeded"}', b'{"kind":"done"}'
            settled = await store.settle(keys, "w1#a", first.fence, result, terminal)
            again = await store.settle(keys, "w1#a", first.fence, result, terminal)
            replay = await store.acquire(keys, "w3#c", 5_000, "fp")
            return [
                (first.status, first.fence, first.is_takeover),
                (held.status, held.other_owner),
                cancel.state,
                (renewal.still_held, renewal.cancel_requested),
                settled.status,
                again.status,
                replay.status,
                await store.get_settled(keys),
            ]
        finally:
            await client.aclose()

    assert await life(multiplex=True) == await life(multiplex=False)


@pytest.mark.parametrize("multiplex", [True, False], ids=["shared", "redis-py"])
async def test_a_renewal_after_the_server_lost_its_scripts_loads_them_and_answers(
    redis_server: ServiceHandle, multiplex: bool
) -> None:
    """A restarted or promoted server has no scripts: the pipeline's NOSCRIPT is answered by
    loading them and sending it once more, on either path."""
    client = open_redis(redis_server.url, socket_timeout_s=1.0, multiplex=multiplex)
    try:
        store = LeaseStore(client, call_budget_s=2.0)
        keys = ActionKeys.of(new_action_id())
        grant = await store.acquire(keys, "w1#a", 5_000, "fp")
        await store.renew_many([(keys, "w1#a", grant.fence)], 5_000, budget_s=2)
        await client.script_flush()
        [renewal] = await store.renew_many([(keys, "w1#a", grant.fence)], 5_000, budget_s=2)
        assert renewal.still_held
    finally:
        await client.aclose()
