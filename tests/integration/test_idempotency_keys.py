"""Idempotency keys as AIP defines them (docs/guarantees.md "Idempotency keys").

An Action whose `idempotency_key` was seen for the same capability, tenant and principal
within the key's TTL gets the first Action's result under its own id, naming it in
`original_action_id`, and sends nothing to Hermes; the same key with another input is a
collision. Real NATS, Redis and worker processes; the fake Hermes counts every request.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import msgspec
import pytest

from schemas.action import Action
from schemas.ids import new_action_id
from schemas.result import ActionResult, ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.store.scripts import all_script_names, script_source
from worker.testing.fake_hermes import RouteDelay
from worker.testing.fake_hermes.faults import RouteError
from worker.testing.identities import TENANT_A, TENANT_B, USER_A, USER_B

CHAT = "POST /v1/chat/completions"
COLLISION = "connector.hermes_agent.configuration_or_input"
SHARED = {"AIPD_HERMES_SHARED_ENDPOINTS": ENDPOINT}


def turn(text: str = "hello") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def keyed(stack: Stack, key: str, text: str = "hello", **kw: Any) -> Action:
    return stack.action("chat", turn(text), idempotency_key=key, **kw)


async def answer(stack: Stack, action: Action, timeout_s: float = 30) -> ActionResult:
    return await (await stack.publish(action)).result(timeout_s=timeout_s)


def posts(stack: Stack) -> int:
    assert stack.fake is not None
    return stack.fake.stats().count(CHAT)


def same_answer(replayed: ActionResult, first: ActionResult) -> None:
    assert replayed.original_action_id == first.action_id
    assert (replayed.status, replayed.output, replayed.error) == (
        first.status,
        first.output,
        first.error,
    )


async def test_a_retry_under_a_new_id_returns_the_original_result_without_a_request(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    first = await answer(stack, keyed(stack, "key-retry"))
    assert first.status is ResultStatus.COMPLETED, first.error
    assert first.original_action_id is None
    retry = keyed(stack, "key-retry")
    replayed = await answer(stack, retry)
    assert replayed.action_id == retry.id
    same_answer(replayed, first)
    assert posts(stack) == 1
    assert len(await stack.results(retry.id)) == 1
    # `chat` does not stream: the replay is its result alone, with no chunk.
    assert await stack.chunks(retry.id) == []
    assert replayed.last_chunk_sha256 is None


@pytest.mark.aip_family("idempotency_duplicates", assertions=["collision_rejected"])
async def test_the_same_key_with_another_input_is_a_collision_and_sends_nothing(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    first = await answer(stack, keyed(stack, "key-collide", "one question"))
    assert first.status is ResultStatus.COMPLETED, first.error
    other = await answer(stack, keyed(stack, "key-collide", "another question"))
    assert other.status is ResultStatus.FAILED
    assert other.error is not None
    assert other.error.code == COLLISION
    assert "idempotency collision" in other.error.message
    assert (other.error.retryable, other.error.uncertain_outcome) == (False, False)
    assert other.original_action_id is None
    assert posts(stack) == 1


@pytest.mark.aip_family("idempotency_duplicates", assertions=["duplicate_suppressed"])
async def test_concurrent_holders_of_one_key_start_one_run_and_share_its_result(
    stack: Stack,
) -> None:
    assert stack.fake is not None
    stack.fake.faults.add(RouteDelay(route=CHAT, delay_s=2.0, times=1))
    await stack.spawn("w1")
    await stack.spawn("w2")
    actions = [keyed(stack, "key-concurrent") for _ in range(3)]
    handles = [await stack.publish(a) for a in actions]
    results = await asyncio.gather(*(h.result(timeout_s=40) for h in handles))
    ran = [r for r in results if r.original_action_id is None]
    assert len(ran) == 1
    assert ran[0].status is ResultStatus.COMPLETED, ran[0].error
    for r in results:
        if r is not ran[0]:
            same_answer(r, ran[0])
    assert posts(stack) == 1


async def test_a_waiting_holder_ends_at_its_own_deadline_without_a_run(stack: Stack) -> None:
    """A second key-holder waits for the first no longer than its own deadline: then it is
    refused as a late Action, having sent nothing, and the first still settles once."""
    assert stack.fake is not None
    stack.fake.faults.add(RouteDelay(route=CHAT, delay_s=6.0, times=1))
    await stack.spawn("w1")
    first_handle = await stack.publish(keyed(stack, "key-deadline"))
    await asyncio.sleep(1.0)
    impatient = await answer(stack, keyed(stack, "key-deadline", timeout_ms=2_000))
    assert impatient.status is ResultStatus.FAILED
    assert impatient.error is not None
    assert impatient.error.code == "connector.hermes_agent.deadline_exceeded"
    assert impatient.original_action_id is None
    first = await first_handle.result(timeout_s=30)
    assert first.status is ResultStatus.COMPLETED, first.error
    assert posts(stack) == 1


async def test_after_the_ttl_the_key_runs_again(stack: Stack) -> None:
    await stack.spawn("w1", AIPD_IDEMPOTENCY_TTL_MS="1500")
    first = await answer(stack, keyed(stack, "key-ttl"))
    assert first.status is ResultStatus.COMPLETED, first.error
    await asyncio.sleep(2.0)
    second = await answer(stack, keyed(stack, "key-ttl"))
    assert second.status is ResultStatus.COMPLETED, second.error
    assert second.original_action_id is None
    assert posts(stack) == 2


async def test_a_tenant_cannot_read_another_tenants_result_by_reusing_its_key(
    stack: Stack,
) -> None:
    await stack.spawn("w1", **SHARED)
    alice = await answer(stack, keyed(stack, "key-shared", principal_id=USER_A, tenant_id=TENANT_A))
    assert alice.status is ResultStatus.COMPLETED, alice.error
    bob = await answer(stack, keyed(stack, "key-shared", principal_id=USER_B, tenant_id=TENANT_B))
    assert bob.status is ResultStatus.COMPLETED, bob.error
    assert bob.original_action_id is None
    assert posts(stack) == 2


async def test_an_outcome_unknown_original_is_what_a_retry_gets(stack: Stack) -> None:
    assert stack.fake is not None
    stack.fake.faults.add(RouteError(route=CHAT, status=502, times=1))
    await stack.spawn("w1")
    first = await answer(stack, keyed(stack, "key-unknown"))
    assert first.status is ResultStatus.FAILED
    assert first.error is not None
    assert first.error.uncertain_outcome
    replayed = await answer(stack, keyed(stack, "key-unknown"))
    same_answer(replayed, first)
    assert posts(stack) == 1


@pytest.mark.parametrize("point", ["after_idempotency_claim", "after_settle"])
async def test_a_worker_killed_around_the_originals_run_loses_nothing(
    stack: Stack, point: str
) -> None:
    """Killed after the key's claim, before the lease (the original's redelivery holds the
    key and runs once), or after the original's settle, before its publish (the stored
    result is the answer): the retry waits, then gets the one result."""
    original = keyed(stack, f"key-{point}")
    await stack.spawn("w1", fault_points=f"{point}=exit@{original.id}")
    first_handle = await stack.publish(original)
    await asyncio.sleep(1.5)
    retry = keyed(stack, f"key-{point}")
    retry_handle = await stack.publish(retry)
    await stack.spawn("w2")
    first = await first_handle.result(timeout_s=30)
    replayed = await retry_handle.result(timeout_s=30)
    assert first.status is ResultStatus.COMPLETED, first.error
    same_answer(replayed, first)
    assert posts(stack) == 1


async def test_a_holder_refused_before_anything_was_sent_gives_its_key_up(stack: Stack) -> None:
    """The key's first Action claims it, its worker dies, and its redelivery is refused
    (its deadline passed) with nothing attempted: it claimed nothing, so a later Action
    with the key, even with another input, runs instead of meeting that refusal."""
    doomed_id = new_action_id()
    await stack.spawn("w1", fault_points=f"after_idempotency_claim=exit@{doomed_id}")
    doomed = keyed(stack, "key-void", "first question", timeout_ms=1_500, action_id=doomed_id)
    handle = await stack.publish(doomed)
    await asyncio.sleep(1.0)
    await stack.spawn("w2")
    refused = await handle.result(timeout_s=30)
    assert refused.status is ResultStatus.FAILED
    assert refused.error is not None
    assert refused.error.code == "connector.hermes_agent.deadline_exceeded"
    later = await answer(stack, keyed(stack, "key-void", "second question"))
    assert later.status is ResultStatus.COMPLETED, later.error
    assert later.original_action_id is None
    assert posts(stack) == 1


async def _script_calls(stack: Stack, run: Any) -> dict[str, int]:
    """The Lua scripts Redis ran (by name) while `run()` ran, from its SLOWLOG."""
    from redis.asyncio import Redis

    by_sha = {
        hashlib.sha1(script_source(name).encode(), usedforsecurity=False).hexdigest(): name
        for name in all_script_names()
    }
    admin = Redis.from_url(stack.redis_url)
    try:
        await admin.config_set("slowlog-log-slower-than", 0)
        await admin.config_set("slowlog-max-len", 100_000)
        await admin.slowlog_reset()
        await run()
        calls: dict[str, int] = {}
        for entry in await admin.slowlog_get(100_000):
            command = entry["command"].split()
            if command and command[0].upper() in (b"EVALSHA", b"EVALSHA_RO"):
                name = by_sha.get(command[1].decode(), "?")
                if name != "lease_renew":  # the heartbeat's, by the clock: not per Action
                    calls[name] = calls.get(name, 0) + 1
        await admin.config_set("slowlog-log-slower-than", 10_000)
        return calls
    finally:
        await admin.aclose()


async def test_a_key_costs_one_script_call_and_a_replay_answers_without_running(
    stack: Stack,
) -> None:
    """The measured cost: an Action without a key, or keyed by its own id, runs no
    idempotency script; a keyed one runs one more call than it (the claim); a replay runs
    the claim, the holder read, and the acquire and settle of its own answer, and never
    marks an attempt."""
    await stack.spawn("w1")
    await answer(stack, stack.action("models"))  # warm: scripts loaded, endpoint probed
    unkeyed = msgspec.structs.replace(stack.action("models"), idempotency_key=None)
    bare = await _script_calls(stack, lambda: answer(stack, unkeyed))
    own = stack.action("models")
    own = msgspec.structs.replace(own, idempotency_key=own.id)  # AipClient's default key
    assert await _script_calls(stack, lambda: answer(stack, own)) == bare
    first = await _script_calls(
        stack, lambda: answer(stack, stack.action("models", idempotency_key="k-cost"))
    )
    replay = await _script_calls(
        stack, lambda: answer(stack, stack.action("models", idempotency_key="k-cost"))
    )
    print(f"script calls per Action: unkeyed {bare}, keyed {first}, replay {replay}")
    assert "idempotency_claim" not in bare
    assert sum(first.values()) == sum(bare.values()) + 1
    assert first["idempotency_claim"] == 1
    assert replay == {
        "idempotency_claim": 1,
        "idempotency_original": 1,
        "lease_acquire": 1,
        "settle": 1,
    }
