"""Every Lua script runs unchanged on Redis Cluster (docs/architecture.md §5): one `{act_…}` slot
each.

The scripts are driven through the worker's own stores over redis-py's cluster client, with
Action ids chosen so the keys land on all three masters, including a resume Action (its keys
live under its source's tag) and the per-endpoint capacity key. Each master's SLOWLOG (set
to record every command) then proves which scripts the servers really ran; a script file
that no step runs fails the test, so a new script cannot skip this check.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, ResponseError

from schemas.action import Action, Identity
from schemas.approval import ApprovalDecision
from schemas.ids import new_action_id
from worker.store.approvals import read_records
from worker.store.connection import WriteConfirmation, open_redis
from worker.store.idempotency_store import ClaimStatus, IdempotencyStore, OriginalStatus
from worker.store.ingress_store import IngressStore
from worker.store.keys import (
    ActionKeys,
    IngressKeys,
    approvals_key,
    capacity_key,
    idempotency_key,
)
from worker.store.lease_store import (
    AcquireStatus,
    ActionSubject,
    ChunkHead,
    LeaseStore,
    SettleStatus,
)
from worker.store.operator_store import MarkStatus, OperatorStore, ReconcileStatus, WriteStatus
from worker.store.scripts import all_script_names, script_source
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
    write_trust_files,
)
from worker.testing.redis_cluster import RedisCluster
from worker.trust.approval_ledger import approve
from worker.trust.authority import ApprovalAuthority

pytestmark = pytest.mark.cluster

SHAPES = [
    pytest.param(0, id="3-masters", marks=pytest.mark.redis_cluster(masters=3)),
    pytest.param(
        1,
        id="3-masters-3-replicas",
        marks=pytest.mark.redis_cluster(masters=3, replicas_per_master=1),
    ),
]


def _ids_on_every_master(cluster: RedisCluster, count: int) -> list[str]:
    """`count` Action ids whose tags cover every master at least once (in master order)."""
    masters = [node.port for node in cluster.masters()]
    chosen: dict[int, list[str]] = {port: [] for port in masters}
    while sum(len(ids) for ids in chosen.values()) < count or not all(chosen.values()):
        action_id = new_action_id()
        port = cluster.node_for_key(ActionKeys.of(action_id).lease).port
        if len(chosen[port]) < max(1, count // len(masters)):
            chosen[port].append(action_id)
    return [action_id for ids in chosen.values() for action_id in ids]


@pytest.fixture
async def cluster_client(
    redis_cluster: RedisCluster, request: pytest.FixtureRequest
) -> AsyncIterator[Any]:
    """The worker's cluster client (confirming writes when the shape has replicas), with
    every master's SLOWLOG recording every command."""
    replicas = request.node.callspec.params["replicas"]
    for node in redis_cluster.masters():
        admin = node.client()
        admin.config_set("slowlog-log-slower-than", 0)
        admin.config_set("slowlog-max-len", 100_000)
        admin.slowlog_reset()
        admin.close()
    client = open_redis(
        redis_cluster.urls[0],
        cluster=True,
        confirm=WriteConfirmation(replicas) if replicas else None,
    )
    try:
        yield client
    finally:
        await client.aclose()


def _scripts_run(cluster: RedisCluster) -> tuple[set[str], set[int]]:
    """(script names the masters ran, ports of the masters that ran at least one)."""
    by_sha = {
        hashlib.sha1(script_source(name).encode(), usedforsecurity=False).hexdigest(): name
        for name in all_script_names()
    }
    names: set[str] = set()
    ports: set[int] = set()
    for node in cluster.masters():
        admin = node.client(decode_responses=False)
        for entry in admin.slowlog_get(100_000):
            command = entry["command"].split()
            # Read-only scripts (the approval read) go as EVALSHA_RO.
            if command and command[0].upper() in (b"EVALSHA", b"EVAL", b"EVALSHA_RO", b"EVAL_RO"):
                sha = command[1].decode()
                if sha in by_sha:
                    names.add(by_sha[sha])
                    ports.add(node.port)
        admin.close()
    return names, ports


@pytest.mark.parametrize("replicas", SHAPES)
async def test_every_script_runs_on_one_slot_across_all_masters(
    redis_cluster: RedisCluster, cluster_client: Any, replicas: int, tmp_path: Path
) -> None:
    leases = LeaseStore(cluster_client)
    operator = OperatorStore(cluster_client)
    assert (operator.confirm is not None) == bool(replicas)
    source, other, third = _ids_on_every_master(redis_cluster, 3)
    resume = new_action_id()
    source_keys = ActionKeys.of(source)
    resume_keys = ActionKeys.of(resume, source_action_id=source)
    # The resume's keys share the source's slot (that is what lets one script touch both).
    shared = (source_keys.binding, resume_keys.lease, resume_keys.result, resume_keys.cancel)
    assert {key_slot(k.encode()) for k in shared} == {key_slot(source_keys.lease.encode())}

    # Leases: acquire on all three masters, renew them all in one pipelined call.
    held = []
    for n, action_id in enumerate((source, other, third)):
        keys = ActionKeys.of(action_id)
        grant = await leases.acquire(keys, f"w1#{n}", 5_000, "fp")
        assert grant.status is AcquireStatus.ACQUIRED
        held.append((keys, f"w1#{n}", grant.fence))
    renewals = await leases.renew_many(held, 5_000, budget_s=5)
    assert [r.still_held for r in renewals] == [True, True, True]
    assert await leases.mark_attempt(*held[1])
    # The chunk chain's head (worker/execution/chunk_chain.py): recorded, then read back.
    assert await leases.record_chunk_head(*held[1], ChunkHead(4, "ab" * 32, 9))
    assert (await leases.chunk_chain(held[1][0])).head == ChunkHead(4, "ab" * 32, 9)
    assert await leases.release(*held[1])

    # Operator binding of the source: create, claim, bind, cancel flag, settle unknown.
    keys, owner, fence = held[0]
    created = await operator.create(keys, owner, fence, b'{"status":"starting"}', "starting")
    assert created.status is WriteStatus.CREATED
    claimed = await operator.write(keys, owner, fence, 1, b'{"claim":1}', "starting")
    assert claimed.status is WriteStatus.WRITTEN
    bound = await operator.write(keys, owner, fence, 2, b'{"run":"run_1"}', "running")
    assert bound.status is WriteStatus.WRITTEN
    assert (await operator.mark_cancel(keys.binding))[0] is MarkStatus.RECORDED
    ended = await operator.write(keys, owner, fence, 3, b'{"unknown":1}', "outcome_unknown")
    assert ended.status is WriteStatus.WRITTEN
    decision = await operator.record_reconciliation(keys.binding, b'{"decision":"absent"}')
    assert decision[0] is ReconcileStatus.RECORDED
    assert (await operator.read(keys.binding)).revision == 4
    assert operator.unconfirmed_writes == 0

    # The resume Action: its lease, cancel intent and result under the source's tag.
    await leases.remember_resume(resume_keys)
    assert await leases.keys_of(resume) == resume_keys
    pending = await leases.request_cancel(
        resume_keys, b"{}", requested_by="user:a", authorized_for=""
    )
    assert pending.state.value == "pending"
    subject = ActionSubject("user:a", None, "cap:hermes_agent:h1:operator")
    grant = await leases.acquire(resume_keys, "w2#r", 5_000, "fp-resume", subject)
    assert grant.status is AcquireStatus.ACQUIRED
    assert grant.cancel_pending
    assert await leases.pending_cancels(resume_keys) == {"user:a": b"{}"}
    assert await leases.promote_cancel(resume_keys, b"{}")
    recorded = await leases.request_cancel(
        resume_keys, b"{}", requested_by="user:a", authorized_for="user:a"
    )
    assert recorded.state.value == "already_requested"
    assert await leases.cancel_requested_many([resume_keys], budget_s=5) == [True]
    [renewal] = await leases.renew_many([(resume_keys, "w2#r", grant.fence)], 5_000, budget_s=5)
    assert renewal.cancel_requested
    settled = await leases.settle(
        resume_keys, "w2#r", grant.fence, b'{"status":"cancelled"}', b'{}'
    )
    assert settled.status is SettleStatus.SETTLED

    # Endpoint capacity: a key of its own, hash-tagged by endpoint.
    assert await operator.capacity_acquire("h1", source, 2, 5_000) == (True, 1)
    assert await operator.capacity_holders("h1") == 1
    assert await operator.capacity_release("h1", source)

    # Channel ingress: a followed session's lease and cursor share the session's own tag.
    ingress = IngressStore(cluster_client)
    session = IngressKeys.of("h1", "sess_1")
    assert key_slot(session.lease.encode()) == key_slot(session.cursor.encode())
    assert await ingress.hold(session, "w1#i", 5_000)
    assert not await ingress.hold(session, "w2#i", 5_000)
    assert await ingress.advance(session, "w1#i", 7)
    assert not await ingress.advance(session, "w2#i", 9)
    assert await ingress.cursor(session) == 7
    assert await ingress.release(session, "w1#i")

    # Idempotency keys: the key's record has a tag of its own, the holder's result is read
    # in the holder's slot (worker/pipeline/idempotency.py).
    idempotency = IdempotencyStore(cluster_client, ttl_ms=5_000)
    record = idempotency_key("ab" * 32)
    holder = held[2][0]
    assert (await idempotency.claim(record, holder, "fp")).status is ClaimStatus.CLAIMED
    later = await idempotency.claim(record, ActionKeys.of(new_action_id()), "fp")
    assert (later.status, later.holder) == (ClaimStatus.DUPLICATE, holder)
    assert (await idempotency.original(holder, "fp")).status is OriginalStatus.PENDING

    # An approval written by the authority through the same cluster client.
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    action = Action(
        id=third,
        capability="cap:hermes_agent:h1:operator",
        input={"objective": "x"},
        identity=Identity(
            principal_id=USER_UNTENANTED,
            principal_kind=PRINCIPAL_KIND,
            authentication_issuer=ISSUER,
            credential_revision=REVISION,
        ),
        created_at_unix_ms=time.time_ns() // 1_000_000,
    )
    authority = ApprovalAuthority.load(trust.authority_file, now_ms=time.time_ns() // 1_000_000)
    await approve(
        cluster_client, authority, action, APPROVER_UNTENANTED, "ok", ApprovalDecision.APPROVED,
        seed=trust.approver_seed(APPROVER_UNTENANTED),
    )  # fmt: skip
    key = approvals_key(third)
    assert await cluster_client.hget(key, f"decision:{APPROVER_UNTENANTED}") == b"approved"
    [record] = await read_records(cluster_client, third)
    assert record.decision is ApprovalDecision.APPROVED
    assert capacity_key("h1") != approvals_key(third)

    names, ports = _scripts_run(redis_cluster)
    assert names == set(all_script_names())
    assert ports == {node.port for node in redis_cluster.masters()}


@pytest.mark.parametrize("replicas", SHAPES[:1])
async def test_a_script_given_keys_of_two_slots_is_refused(
    redis_cluster: RedisCluster, cluster_client: Any, replicas: int
) -> None:
    """The check above has teeth: keys of two Actions in one script do not run."""
    first, second = _ids_on_every_master(redis_cluster, 3)[:2]
    operator = OperatorStore(cluster_client)
    with pytest.raises((RedisClusterException, ResponseError), match=r"slot|CROSSSLOT"):
        await operator.scripts["operator_write"](
            keys=[ActionKeys.of(first).binding, ActionKeys.of(second).lease],
            args=["w", 1, 0, "{}", "starting", 1000],
        )
