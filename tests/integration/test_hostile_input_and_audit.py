"""Hostile input through a live worker, and the audit chain of a chaos scenario.

Every hostile envelope ends in a DLQ entry with its reason or a typed failed result; the
worker keeps serving; nothing reaches Hermes. Receipts tell the true story of a kill -9 and
carry no secret and no raw input.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from typing import Any

from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.aip.errors import AipWireError
from worker.testing.fake_hermes import RouteDelay
from worker.testing.identities import USER_UNTENANTED

SECRET_INPUT = "very-private-input-text-7f3a"


def _with_action(document: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of an Action Envelope document whose `body.action` has `changes`."""
    copied = copy.deepcopy(document)
    copied["body"]["action"].update(changes)
    return copied


def _hostile(stack: Stack, rng: random.Random) -> list[bytes]:
    """Mutations of valid Action Envelopes (signed by the gateway, so only what they carry
    is wrong), attacks, and random corruptions of a signed Envelope's bytes."""
    base = stack.envelope_document(stack.action("models"))
    operator = stack.envelope_document(stack.action("operator", {"objective": SECRET_INPUT}))
    base_identity = base["body"]["action"]["identity"]
    long_principal = copy.deepcopy(base_identity)
    next(iter(v for k, v in long_principal.items() if k != "tenant"))["id"] = "x" * 600
    source = "act_" + "c" * 32
    cases: list[dict[str, Any] | bytes] = [
        _with_action(base, id="act_" + "0" * 31),
        _with_action(base, identity=long_principal),
        _with_action(base, input={"identity": {"principal_id": "admin"}, "_aip": {"tenant": "t"}}),
        _with_action(operator, input={}),
        _with_action(
            operator,
            input={"objective": "a", "resume": {"source_action_id": source, "choice": "once"}},
        ),
        _with_action(
            operator, input={"resume": {"source_action_id": source, "choice": "always-yes"}}
        ),
        _with_action(operator, input={"objective": "a", "candidate_capabilities": ["c"] * 300}),
        _with_action(
            operator, input={"objective": "x", "context": {"_aip": {"principal_id": "admin"}}}
        ),
        _with_action(base, observability={"trace_id": "abc\r\nX-Evil: 1"}),
        _with_action(base, idempotency_key="k\nAuthorization: Bearer stolen"),
        _with_action(base, input={"deep": _nested(200)}),
        _with_action(base, input={"huge": "h" * 50_000}),
        b'{"id": "act_' + b"d" * 32 + b'", "capability": "\xff\xfe"}',
        b"[" * 5000,
        b"",
    ]
    payloads: list[bytes] = []
    for case in cases:
        if isinstance(case, bytes):
            payloads.append(case)
            continue
        try:
            payloads.append(stack.sign_document(case))
        except AipWireError:  # too deep to sign: sent unsigned, refused all the same
            payloads.append(json.dumps(case).encode())
    good = stack.sign_document(base)
    for _ in range(40):
        mutated = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        payloads.append(bytes(mutated))
    return payloads


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


async def test_hostile_envelopes_are_refused_or_dead_lettered_and_never_reach_hermes(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    rng = random.Random(20261130)
    payloads = _hostile(stack, rng)
    for payload in payloads:
        await stack.publish_raw(payload)
    # A replayed signature on an altered Envelope.
    victim = stack.trust.seal_action(stack.action("models"))
    await stack.nc.jetstream().publish(
        stack.subjects.actions("h1"),
        victim.replace(b":models", b":health"),
        headers={"Nats-Msg-Id": "replay"},
    )
    good = await (await stack.publish(stack.action("health"))).result(timeout_s=30)
    assert good.status is ResultStatus.COMPLETED
    info = await stack.settled_and_acked(timeout_s=60)
    assert info.delivered.stream_seq == len(payloads) + 2
    assert stack.fake.stats().count("GET /v1/models") == 0
    assert stack.fake.stats().count("POST /v1/runs") == 0
    dead = await stack.dlq()
    assert dead
    assert all(h["code"] for _, h in dead)
    assert stack.workers[0].alive


async def test_the_receipt_chain_of_a_killed_run_tells_the_true_story(stack: Stack) -> None:
    stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=60, times=1))
    w1 = await stack.spawn("w1")
    action = stack.action("models", idempotency_key=SECRET_INPUT)
    handle = await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    await stack.spawn("w2")
    w1.kill()
    result = await handle.result(timeout_s=30)
    assert result.settled_by == "w2"
    await asyncio.sleep(1.0)
    receipts = await stack.client.receipts("h1", action.id)
    # The signed seals that close each segment are bookkeeping, not part of the story.
    story = [
        (r.worker_id, r.event.value, r.fence)
        for r in receipts
        if r.event.value != "segment_sealed"
    ]
    assert story[0][:2] == ("w1", "received")
    assert ("w1", "lease_acquired", 1) in story
    assert ("w2", "lease_acquired", 2) in story
    assert story[-1] == ("w2", "settled", 2)
    assert not any(w == "w1" and e == "settled" for w, e, _ in story)
    takeover = next(
        r for r in receipts if r.worker_id == "w2" and r.event.value == "lease_acquired"
    )
    assert takeover.details["takeover"] is True
    assert str(takeover.details["previous_owner"]).startswith("w1#")


async def test_an_operator_run_leaves_claim_request_bind_and_settle_receipts(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action, handle = await stack.operator("leave a trail")
    await handle.result(timeout_s=30)
    await asyncio.sleep(1.0)
    receipts = await stack.client.receipts("h1", action.id)
    events = [r.event.value for r in receipts]
    for expected in ("received", "lease_acquired", "start_claimed", "run_bound", "settled"):
        assert expected in events
    assert events.index("start_claimed") < events.index("run_bound") < events.index("settled")
    requests = [r.details for r in receipts if r.event.value == "provider_request"]
    assert {"method": "POST", "route": "/v1/runs", "status": 202} in [
        {k: d[k] for k in ("method", "route", "status")} for d in requests
    ]


async def test_receipts_carry_no_secret_and_no_raw_input(stack: Stack) -> None:
    await stack.spawn("w1")
    action, handle = await stack.operator(f"{SECRET_INPUT} please")
    await handle.result(timeout_s=30)
    refused = stack.action("models", principal_id="user:mallory")
    await (await stack.publish(refused)).result(timeout_s=30)
    await asyncio.sleep(1.0)
    api_key = (stack.root / "hermes.key").read_text()
    raw = b""
    for action_id in (action.id, refused.id):
        for data in await stack.stream_messages("audit", stack.subjects.audit("h1", action_id)):
            raw += data
    assert raw
    for secret in (api_key, SECRET_INPUT, "opaque-credential-of-", USER_UNTENANTED + "-secret"):
        assert secret.encode() not in raw
    seed = stack.trust.seed_file.read_bytes().strip()
    assert seed not in raw
    for worker in stack.workers:
        log = worker.log_text()
        assert api_key not in log
        assert SECRET_INPUT not in log
