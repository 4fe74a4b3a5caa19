"""Approval: only a durable, matching, live, approved record lets a governed capability run."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from redis.asyncio import Redis
from trust_support import GOVERNED, action_document, encode_action, endpoint, now_ms

from schemas.action import Action
from schemas.approval import MAX_INPUT_SNAPSHOT_BYTES, ApprovalDecision, ApprovalRecord
from schemas.errors import ErrorCode
from worker.errors import ApprovalRefused, ConnectorError, TrustConfigError
from worker.fingerprints import approval_fingerprint
from worker.settings import Settings
from worker.store.approvals import slot_fields
from worker.store.keys import approvals_key
from worker.store.scripts import script_source
from worker.store.stores import Stores
from worker.testing.identities import (
    APPROVER_A,
    APPROVER_B,
    APPROVER_UNTENANTED,
    REVISION,
    TENANT_A,
    USER_B,
    TrustFiles,
    authority_memberships,
    write_json,
    write_trust_files,
)
from worker.trust.approval_ledger import approve, decision_view
from worker.trust.authority import ApprovalAuthority
from worker.trust.gate import AdmitDecision, TrustGate
from worker.trust.signing import generate_keypair, public_key_of, sign_detached, verify_detached

CONFLICT = ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT
UNAVAILABLE = ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE


@pytest.fixture
def authority(trust_files: TrustFiles) -> ApprovalAuthority:
    return ApprovalAuthority.load(trust_files.authority_file, now_ms=now_ms())


async def admit(
    gate: TrustGate, redis: Redis, files: TrustFiles, document: dict[str, Any]
) -> AdmitDecision:
    _, payload = encode_action(document, files)
    return await gate.admit(
        payload=payload,
        endpoint=endpoint(),
        spec=GOVERNED,
        stores=Stores.over(redis),
    )


async def refused(
    gate: TrustGate, redis: Redis, files: TrustFiles, document: dict[str, Any]
) -> ConnectorError:
    with pytest.raises(ConnectorError) as caught:
        await admit(gate, redis, files, document)
    return caught.value


async def decide(
    redis: Redis,
    authority: ApprovalAuthority,
    files: TrustFiles,
    document: dict[str, Any],
    decision: ApprovalDecision = ApprovalDecision.APPROVED,
    *,
    approver: str = APPROVER_A,
    signer: str | None = None,
    **kwargs: Any,
) -> ApprovalRecord:
    """`approver`'s decision, signed with `signer`'s key (default: the approver's own)."""
    action, _ = encode_action(document)
    seed = files.approver_seeds.get(signer or approver, files.approver_seed(APPROVER_A))
    return await approve(
        redis, authority, action, approver, "reviewed the objective", decision, seed=seed,
        **kwargs,
    )  # fmt: skip


def carried(record: ApprovalRecord, files: TrustFiles) -> dict[str, Any]:
    """The AIP ApprovalDecision `approve` prints for `record`, as a publisher carries it."""
    signer = public_key_of(files.approver_seed(record.approver_principal_id))
    view: dict[str, Any] = msgspec.to_builtins(decision_view(record, signer))
    return view


def forged_decision(decision_id: str, approver: str = APPROVER_A) -> dict[str, Any]:
    """A schema-valid AIP ApprovalDecision written from the AIP rules, naming no record."""
    return {
        "approval_id": "appr_" + "0" * 32,
        "decision": "approved",
        "approver": {"id": approver, "kind": "human"},
        "decided_at": "2026-01-01T00:00:00Z",
        "decision_id": decision_id,
    }


async def test_an_approved_matching_record_admits_and_is_carried_for_audit(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document()
    record = await decide(redis, authority, trust_files, document)
    decision = await admit(gate, redis, trust_files, document)
    assert decision.approval == record
    assert decision.receipt_details()["approval_decision_id"] == record.decision_id
    with_decision = {**document, "approval": carried(record, trust_files)}
    assert (await admit(gate, redis, trust_files, with_decision)).approval == record
    # The required fields alone (AIP omits the rest) name the same record.
    required = {
        k: v for k, v in carried(record, trust_files).items()
        if k in ("approval_id", "decision", "approver", "decided_at")
    }  # fmt: skip
    assert (await admit(gate, redis, trust_files, {**document, "approval": required})).approval == (
        record
    )


async def test_the_record_holds_the_policy_evidence(
    redis: Redis, authority: ApprovalAuthority, trust_files: TrustFiles
) -> None:
    document = action_document()
    record = await decide(redis, authority, trust_files, document)
    action, _ = encode_action(document)
    assert record.action_id == action.id
    assert record.input_fingerprint == approval_fingerprint(action)
    assert record.approver_principal_id == APPROVER_A
    assert record.approver_revision == 1
    assert record.reason == "reviewed the objective"
    assert record.expires_at_unix_ms - record.created_at_unix_ms == 15 * 60_000
    assert "summarise the inbox" in record.input_snapshot
    evidence = record.policy_decision
    assert evidence.matched_capability_prefix == "cap:hermes_agent:"
    assert evidence.membership_tenant_id == TENANT_A
    assert evidence.authority_file_sha256 == authority.sha256
    assert record.revision == 1
    stored = await redis.hget(approvals_key(action.id), f"record:{APPROVER_A}")
    assert stored is not None
    assert msgspec.json.decode(stored, type=ApprovalRecord) == record
    ttl_ms = await redis.pttl(approvals_key(action.id))
    assert 15 * 60_000 < ttl_ms <= 15 * 60_000 + 24 * 3_600_000


async def test_no_record_means_no_run(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    assert (await refused(gate, redis, trust_files, action_document())).code is UNAVAILABLE


async def test_a_record_of_another_action_grants_nothing(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    approved = action_document()
    record = await decide(redis, authority, trust_files, approved)
    borrower = {**action_document(), "approval": carried(record, trust_files)}
    error = await refused(gate, redis, trust_files, borrower)
    assert (error.code, "no decision is recorded" in error.message) == (CONFLICT, True)
    await decide(redis, authority, trust_files, {**borrower, "approval": None})
    error = await refused(gate, redis, trust_files, borrower)
    assert error.code is CONFLICT
    assert "names no live recorded decision" in error.message


async def test_a_record_for_another_capability_grants_nothing(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document(operation="run_stop")
    await decide(redis, authority, trust_files, document)
    same_id = {**document, "capability": "cap:hermes_agent:hermes-a:operator"}
    error = await refused(gate, redis, trust_files, same_id)
    assert (error.code, "another capability" in error.message) == (CONFLICT, True)


async def test_a_changed_input_voids_the_approval(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document()
    await decide(redis, authority, trust_files, document)
    changed = {**document, "input": {"objective": "wire the funds"}}
    error = await refused(gate, redis, trust_files, changed)
    assert (error.code, "input changed" in error.message) == (CONFLICT, True)


async def test_an_expired_approval_grants_nothing(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document()
    await decide(redis, authority, trust_files, document, ttl_ms=50)
    await asyncio.sleep(0.1)
    error = await refused(gate, redis, trust_files, document)
    assert (error.code, "expired" in error.message) == (UNAVAILABLE, True)


async def test_a_denial_refuses_and_is_final(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document()
    await decide(redis, authority, trust_files, document, ApprovalDecision.DENIED, ttl_ms=50)
    assert (await refused(gate, redis, trust_files, document)).code is CONFLICT
    await asyncio.sleep(0.1)
    with pytest.raises(ApprovalRefused, match="denial is final"):
        await decide(redis, authority, trust_files, document)


async def test_a_live_approval_cannot_be_replaced_but_an_expired_one_can(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document()
    first = await decide(redis, authority, trust_files, document, ttl_ms=500)
    with pytest.raises(ApprovalRefused, match=first.decision_id):
        await decide(redis, authority, trust_files, document, ApprovalDecision.DENIED)
    await asyncio.sleep(0.55)
    second = await decide(redis, authority, trust_files, document)
    assert second.revision == 2
    assert (await admit(gate, redis, trust_files, document)).approval == second


async def test_a_forged_decision_id_grants_nothing(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    forged = {**action_document(), "approval": forged_decision("apr_" + "0" * 32)}
    error = await refused(gate, redis, trust_files, forged)
    assert (error.code, "no decision is recorded" in error.message) == (CONFLICT, True)
    record = await decide(redis, authority, trust_files, {**forged, "approval": None})
    error = await refused(gate, redis, trust_files, forged)
    assert (error.code, "names no live recorded decision" in error.message) == (CONFLICT, True)
    # The genuine decision id with any field that is not the record's: refused, by name.
    for name, value in (
        ("approver", {"id": APPROVER_A, "kind": "agent"}),
        ("reason", "approved by the payload"),
        ("decided_at", "2030-01-01T00:00:00Z"),
        ("approval_id", "appr_" + "1" * 32),
    ):
        altered = {**carried(record, trust_files), name: value}
        error = await refused(gate, redis, trust_files, {**forged, "approval": altered})
        assert (error.code, error.message) == (
            CONFLICT, f"approval: the Action's approval.{name} is not the recorded decision's"
        )  # fmt: skip
    assert (await admit(
        gate, redis, trust_files, {**forged, "approval": carried(record, trust_files)}
    )).approval == record  # fmt: skip


async def test_approval_claims_inside_the_payload_grant_nothing(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    claims = {
        "objective": "x",
        "approval": {"decision": "approved", "approver": APPROVER_A},
        "_aip": {"approval": {"decision_id": "apr_" + "1" * 32, "decision": "approved"}},
    }
    document = action_document(input=claims)
    assert (await refused(gate, redis, trust_files, document)).code is UNAVAILABLE


@pytest.mark.parametrize(
    ("approver", "document_args", "expected"),
    [
        (USER_B, {}, "no approval membership"),
        (APPROVER_B, {}, "no approval membership"),
        (APPROVER_A, {"principal": APPROVER_A}, "own principal"),
    ],
    ids=["not-an-approver", "other-tenants-approver", "self-approval"],
)
async def test_approvers_without_standing_cannot_decide(
    redis: Redis,
    authority: ApprovalAuthority,
    trust_files: TrustFiles,
    approver: str,
    document_args: dict[str, Any],
    expected: str,
) -> None:
    document = action_document(**document_args)
    with pytest.raises(ApprovalRefused, match=expected):
        await decide(redis, authority, trust_files, document, approver=approver)
    action, _ = encode_action(document)
    assert await redis.exists(approvals_key(action.id)) == 0


async def test_membership_prefixes_and_expiry_bound_what_may_be_approved(
    tmp_path: Path, redis: Redis, trust_files: TrustFiles
) -> None:
    memberships = trust_files.memberships()
    memberships[0]["capability_prefixes"] = ["cap:hermes_agent:hermes-a:models"]
    path = write_json(tmp_path / "authority.json", memberships, mode=0o644)
    narrow = ApprovalAuthority.load(path, now_ms=now_ms())
    with pytest.raises(ApprovalRefused, match="may not approve capability"):
        await decide(redis, narrow, trust_files, action_document())
    memberships[0]["capability_prefixes"] = ["*"]
    memberships[0]["expires_at_unix_ms"] = now_ms() + 50
    write_json(path, memberships, mode=0o644)
    short_lived = ApprovalAuthority.load(path, now_ms=now_ms())
    await asyncio.sleep(0.1)
    with pytest.raises(ApprovalRefused, match="expired"):
        await decide(redis, short_lived, trust_files, action_document())


async def test_a_reason_is_required(
    redis: Redis, authority: ApprovalAuthority, trust_files: TrustFiles
) -> None:
    action, _ = encode_action(action_document())
    with pytest.raises(ApprovalRefused, match="reason"):
        await approve(
            redis, authority, action, APPROVER_A, "   ", ApprovalDecision.APPROVED,
            seed=trust_files.approver_seed(APPROVER_A),
        )  # fmt: skip


async def test_an_approver_removed_after_deciding_no_longer_authorizes(
    trust_files: TrustFiles, redis: Redis, authority: ApprovalAuthority
) -> None:
    document = action_document()
    await decide(redis, authority, trust_files, document)
    memberships = trust_files.memberships()
    memberships[0]["revision"] = 2
    write_json(trust_files.authority_file, memberships, mode=0o644)
    gate = TrustGate.from_settings(Settings(**trust_files.settings_overrides()))
    error = await refused(gate, redis, trust_files, document)
    assert (error.code, "revision" in error.message) == (CONFLICT, True)


async def test_without_an_authority_file_governed_capabilities_cannot_run(
    trust_files: TrustFiles, redis: Redis, authority: ApprovalAuthority
) -> None:
    document = action_document()
    await decide(redis, authority, trust_files, document)
    overrides = {**trust_files.settings_overrides(), "approval_authority_file": None}
    gate = TrustGate.from_settings(Settings(**overrides))
    error = await refused(gate, redis, trust_files, document)
    assert (error.code, "AIPD_APPROVAL_AUTHORITY_FILE" in error.message) == (UNAVAILABLE, True)


async def test_an_unreadable_record_is_unavailable_not_a_crash(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    document = action_document()
    action, _ = encode_action(document)
    await redis.hset(
        approvals_key(action.id), mapping={f"record:{APPROVER_A}": b'{"decision":"approved"}'}
    )
    assert (await refused(gate, redis, trust_files, document)).code is UNAVAILABLE


async def test_a_tampered_record_for_another_action_is_a_conflict(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    original = action_document()
    record = await decide(redis, authority, trust_files, original)
    target = action_document()
    target_action, _ = encode_action(target)
    # Signed and genuine, but for another Action: moving it grants nothing.
    original_action, _ = encode_action(original)
    signed = await redis.hgetall(approvals_key(original_action.id))
    await redis.hset(
        approvals_key(target_action.id),
        mapping={
            f"{k}:{APPROVER_A}": signed[f"{k}:{APPROVER_A}".encode()]
            for k in ("record", "signature", "signer")
        },
    )
    assert msgspec.json.decode(signed[f"record:{APPROVER_A}".encode()], type=ApprovalRecord) == (
        record
    )
    error = await refused(gate, redis, trust_files, target)
    assert (error.code, "another Action" in error.message) == (CONFLICT, True)


async def test_the_write_script_is_write_once_per_decision(redis: Redis) -> None:
    action: Action = encode_action(action_document())[0]
    key = approvals_key(action.id)
    script = redis.register_script(script_source("approval_write"))
    later = now_ms() + 60_000

    async def write(
        who: str, decision_id: str, record: bytes, read_revision: int, expires: int,
        decision: str = "approved", required: int = 1,
    ) -> tuple[bytes, int]:
        args: list[bytes | str | int] = [
            who, decision_id, record, read_revision, decision, expires, 1_000, "sig", "signer",
            required,
        ]
        reply = await script(keys=[key], args=args)
        return bytes(reply[0]), int(reply[2])  # fmt: skip

    first = "apr_" + "a" * 32
    assert await write("p:a", first, b'{"v":1}', 0, later) == (b"written", 1)
    assert await write("p:a", first, b'{"v":1}', 0, later) == (b"exists", 1)
    assert await write("p:a", first, b'{"v":2}', 1, later) == (b"conflict", 1)
    assert await write("p:b", "apr_" + "b" * 32, b'{"v":3}', 0, later) == (b"stale", 1)
    # Quorum 1 met: nothing more is written, not even a denial.
    assert (await write("p:b", "apr_" + "b" * 32, b'{"v":3}', 1, later, "denied"))[0] == (
        b"conflict"
    )
    assert await redis.hget(key, "record:p:a") == b'{"v":1}'
    # Quorum 2: the same member again does not count twice; another member completes it.
    assert (await write("p:a", "apr_" + "c" * 32, b'{"v":4}', 1, later, required=2))[0] == (
        b"conflict"
    )
    assert await write("p:b", "apr_" + "d" * 32, b'{"v":5}', 1, later, required=2) == (
        b"written", 2
    )
    key = approvals_key(encode_action(action_document())[0].id)
    assert (await write("p:a", "apr_" + "e" * 32, b'{"v":6}', 0, 1))[0] == b"expired"
    assert await redis.exists(key) == 0
    # A denial by any member is final, whatever the quorum.
    assert (await write("p:a", "apr_" + "f" * 32, b'{"v":7}', 0, later, "denied", 2))[0] == (
        b"written"
    )
    assert (await write("p:b", "apr_" + "9" * 32, b'{"v":8}', 1, later, required=2))[0] == (
        b"conflict"
    )


async def test_large_inputs_are_snapshotted_within_bounds(
    redis: Redis, authority: ApprovalAuthority, trust_files: TrustFiles
) -> None:
    document = action_document(input={"objective": "é" * 20_000})
    record = await decide(redis, authority, trust_files, document)
    assert record.input_snapshot_truncated
    assert len(record.input_snapshot.encode()) <= MAX_INPUT_SNAPSHOT_BYTES


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"revision": 0}, r"membership 0 \(principal 'approver:carol'\): revision must be"),
        ({"revoked": True}, "is revoked"),
        ({"expires_at_unix_ms": 1, "revoked": True}, "is revoked"),
        ({"capability_prefixes": []}, "capability_prefixes"),
        (
            {"tenant_id": "tenant-b", "principal_id": "approver:dave"},
            "membership 1 .*duplicate of membership 0",
        ),
    ],
    ids=["zero-revision", "revoked", "expired-and-revoked", "no-prefixes", "duplicate"],
)
def test_bad_memberships_stop_startup(
    trust_files: TrustFiles, change: dict[str, Any], expected: str
) -> None:
    memberships = trust_files.memberships()
    memberships[0].update(change)
    write_json(trust_files.authority_file, memberships, mode=0o644)
    with pytest.raises(TrustConfigError, match=r"^AIPD_APPROVAL_AUTHORITY_FILE: .*" + expected):
        TrustGate.from_settings(Settings(**trust_files.settings_overrides()))


def test_an_expired_membership_is_skipped_and_counted_not_fatal(
    trust_files: TrustFiles,
) -> None:
    memberships = trust_files.memberships()
    renewed = {**memberships[0]}
    memberships[0]["expires_at_unix_ms"] = 1
    memberships.append(renewed)  # same principal, tenant and key: not a duplicate now
    write_json(trust_files.authority_file, memberships, mode=0o644)
    gate = TrustGate.from_settings(Settings(**trust_files.settings_overrides()))
    assert gate.authority is not None
    assert gate.expired_entries == {"identity": 0, "authority": 1}
    assert len(gate.authority) == len(memberships) - 1


def test_authority_file_others_may_write_is_refused(trust_files: TrustFiles) -> None:
    os.chmod(trust_files.authority_file, 0o664)
    with pytest.raises(TrustConfigError, match="write"):
        ApprovalAuthority.load(trust_files.authority_file, now_ms=now_ms())


def test_fingerprint_binds_capability_input_principal_and_credential_revision() -> None:
    base = action_document(input={"b": 1, "a": [1, {"y": 2, "x": 1}]})
    reordered = {**base, "input": {"a": [1, {"x": 1, "y": 2}], "b": 1}}
    other_envelope = {
        **base, "trace": {"trace_id": "t-2"}, "approval": forged_decision("apr_" + "2" * 32)
    }
    fingerprints = {
        approval_fingerprint(encode_action(doc)[0]) for doc in (base, reordered, other_envelope)
    }
    assert len(fingerprints) == 1
    changed_input = {**base, "input": {"b": 2, "a": [1, {"y": 2, "x": 1}]}}
    changed_capability = {**base, "capability": "cap:hermes_agent:hermes-a:models"}
    # Another principal publishing the same request, or the same one after its credential
    # was rotated, is another request: a decision for one never admits the other.
    other_principal = {**base, "identity": {**base["identity"], "principal_id": USER_B}}
    rotated = {**base, "identity": {**base["identity"], "credential_revision": REVISION + 1}}
    for doc in (changed_input, changed_capability, other_principal, rotated):
        assert approval_fingerprint(encode_action(doc)[0]) not in fingerprints


async def test_the_approval_check_costs_one_redis_command(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    """The record and the Redis clock its expiry is decided on come from one script, sent
    read-only (the workers' Redis user may read approvals, never write them)."""
    document = action_document()
    record = await decide(redis, authority, trust_files, document)
    await admit(gate, redis, trust_files, document)  # loads the read script once
    sent: list[Any] = []
    original = redis.execute_command

    async def counted(*args: Any, **kwargs: Any) -> Any:
        sent.append(args[0])
        return await original(*args, **kwargs)

    redis.execute_command = counted  # type: ignore[method-assign]
    try:
        assert (await admit(gate, redis, trust_files, document)).approval == record
    finally:
        redis.execute_command = original  # type: ignore[method-assign]
    assert sent == ["EVALSHA_RO"]


async def _store_raw(
    redis: Redis, action: Action, record: ApprovalRecord, *, signature: str, signer: str
) -> None:
    """Write a decision straight into Redis, as anyone with write access could."""
    fields = slot_fields(record, msgspec.json.encode(record), signature=signature, signer=signer)
    await redis.hset(approvals_key(action.id), mapping=fields)


async def test_a_record_written_to_redis_without_the_approvers_signature_is_refused(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    # A record every field of which is right, copied from a real decision on another Action
    # and rewritten for this one: only the signature is missing.
    model = await decide(redis, authority, trust_files, action_document())
    document = action_document()
    action, _ = encode_action(document)
    forged = msgspec.structs.replace(
        model,
        decision_id="apr_" + "f" * 32,
        action_id=action.id,
        input_fingerprint=approval_fingerprint(action),
    )
    await _store_raw(redis, action, forged, signature="", signer="")
    error = await refused(gate, redis, trust_files, document)
    assert (error.code, "no signature" in error.message) == (CONFLICT, True)
    # A signature that does not cover these bytes is no better.
    someone = generate_keypair()
    await _store_raw(
        redis,
        action,
        forged,
        signature=sign_detached(b"something else", someone.seed),
        signer=authority.member(APPROVER_A, TENANT_A).public_key,  # type: ignore[union-attr]
    )
    error = await refused(gate, redis, trust_files, document)
    assert (error.code, "signature over the decision is invalid" in error.message) == (
        CONFLICT,
        True,
    )


async def test_a_signed_decision_from_the_members_key_is_accepted(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document()
    record = await decide(redis, authority, trust_files, document)
    action, _ = encode_action(document)
    stored = await redis.hgetall(approvals_key(action.id))
    member = authority.member(APPROVER_A, TENANT_A)
    assert member is not None
    slot = {k.decode().removesuffix(f":{APPROVER_A}"): v for k, v in stored.items()}
    assert slot["signer"].decode() == member.public_key
    verify_detached(slot["record"], slot["signature"].decode(), member.public_key)
    assert (await admit(gate, redis, trust_files, document)).approval == record


async def test_a_member_signing_for_another_member_is_refused(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, authority: ApprovalAuthority
) -> None:
    document = action_document()
    action, _ = encode_action(document)
    # `approve` itself refuses a key that is not the named approver's.
    with pytest.raises(ApprovalRefused, match="is not the approval key of"):
        await decide(
            redis, authority, trust_files, document, signer=APPROVER_UNTENANTED
        )
    assert await redis.exists(approvals_key(action.id)) == 0
    # Written around `approve`: a real member (approver:demo) signs a decision in the name
    # of approver:carol, with its own key and naming itself, or naming carol's key.
    model = await decide(redis, authority, trust_files, action_document())
    forged = msgspec.structs.replace(
        model,
        decision_id="apr_" + "e" * 32,
        action_id=action.id,
        input_fingerprint=approval_fingerprint(action),
    )
    raw = msgspec.json.encode(forged)
    other_seed = trust_files.approver_seed(APPROVER_UNTENANTED)
    other_key = public_key_of(other_seed)
    signature = sign_detached(raw, other_seed)
    await _store_raw(redis, action, forged, signature=signature, signer=other_key)
    error = await refused(gate, redis, trust_files, document)
    assert (error.code, f"signed by {other_key}" in error.message) == (CONFLICT, True)
    carol_key = authority.member(APPROVER_A, TENANT_A).public_key  # type: ignore[union-attr]
    await _store_raw(redis, action, forged, signature=signature, signer=carol_key)
    error = await refused(gate, redis, trust_files, document)
    assert (error.code, "invalid" in error.message) == (CONFLICT, True)


def test_memberships_need_a_valid_key_of_their_own(trust_files: TrustFiles) -> None:
    memberships = trust_files.memberships()
    memberships[1]["public_key"] = memberships[0]["public_key"]
    write_json(trust_files.authority_file, memberships, mode=0o644)
    with pytest.raises(TrustConfigError, match="also the key of 'approver:carol'"):
        ApprovalAuthority.load(trust_files.authority_file, now_ms=now_ms())
    del memberships[1]["public_key"]
    write_json(trust_files.authority_file, memberships, mode=0o644)
    with pytest.raises(TrustConfigError, match="public_key"):
        ApprovalAuthority.load(trust_files.authority_file, now_ms=now_ms())
    memberships[1]["public_key"] = "U" + "A" * 55
    write_json(trust_files.authority_file, memberships, mode=0o644)
    with pytest.raises(TrustConfigError, match="checksum"):
        ApprovalAuthority.load(trust_files.authority_file, now_ms=now_ms())


async def test_a_quorum_admits_only_with_n_distinct_live_approvals_and_names_them_all(
    tmp_path: Path, redis: Redis
) -> None:
    """Quorum 2 in tenant A (carol and erin): the gate counts distinct live approvals,
    an expired one does not count, and the admitted receipt names every approver."""
    erin = {"principal_id": "approver:erin", "revision": 1, "tenant_id": TENANT_A,
            "capability_prefixes": ["cap:hermes_agent:"]}  # fmt: skip
    files = write_trust_files(
        tmp_path,
        memberships=[*authority_memberships(), erin],
        quorums=[{"capability_prefix": "cap:hermes_agent:", "required": 2}],
    )
    gate = TrustGate.from_settings(Settings(**files.settings_overrides()))
    authority = ApprovalAuthority.load(files.authority_file, now_ms=now_ms())
    document = action_document()
    first = await decide(redis, authority, files, document, ttl_ms=300)
    error = await refused(gate, redis, files, document)
    assert (error.code, "1 of 2 approvals" in error.message) == (UNAVAILABLE, True)
    await asyncio.sleep(0.35)  # carol's approval expires: she may approve again
    second = await decide(redis, authority, files, document, approver="approver:erin")
    error = await refused(gate, redis, files, document)
    assert (error.code, "1 of 2 approvals" in error.message) == (UNAVAILABLE, True)
    third = await decide(redis, authority, files, document)
    assert third.decision_id != first.decision_id
    admitted = await admit(gate, redis, files, document)
    assert {r.decision_id for r in admitted.approvals} == {second.decision_id, third.decision_id}
    assert admitted.approval == second  # the oldest live one, none being carried
    names = str(admitted.receipt_details()["approver_principal_ids"]).split(",")
    assert sorted(names) == [APPROVER_A, "approver:erin"]
    # Carrying carol's decision makes it the primary one.
    carried_document = {**document, "approval": carried(third, files)}
    assert (await admit(gate, redis, files, carried_document)).approval == third
