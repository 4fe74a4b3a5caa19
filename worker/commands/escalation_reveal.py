"""`escalations show --reveal`: the command behind an approval escalation, for its deciders.

What a paused run would execute is kept in its operator binding only sealed to each
authority member who may decide on it (`worker.operator.sealed_command`); the escalation
and the binding's `pending` prompt carry a digest. An approver opens it with their own seed
(`--key`), as the member they name (`--as`):

1. the approval authority file (`AIPD_APPROVAL_AUTHORITY_FILE`) must hold a current
   membership of that principal for the escalation's tenant that may decide on its
   capability, whose public key is the seed's; anyone else is refused (exit 1) and
   nothing is read;
2. a `command_revealed` receipt (who, which key, which escalation and generation, why) is
   filed in the source Action's audit chain, signed with the member's seed, and stored
   (PubAck) before the command is printed: no reveal goes unrecorded;
3. the command is opened from the binding with the seed. A prompt raised before the member
   held that key (or before this worker version) has nothing sealed to it: said so.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from schemas.audit import Receipt, ReceiptEvent
from schemas.escalation import Escalation
from subjects.grammar import Subjects
from worker.aip.signing import AipSigner
from worker.bus.publisher import receipt_headers
from worker.errors import NotAuthorized, ResolutionRefused, TrustConfigError
from worker.operator.binding import decode_binding
from worker.operator.sealed_command import open_sealed
from worker.settings import Settings
from worker.store.keys import binding_key
from worker.store.operator_store import OperatorStore
from worker.trust.authority import ApprovalAuthority
from worker.trust.signing import SIGNER_HEADER, read_seed_file, sign_envelope
from worker.wire.receipts import encode_receipt

#: Who files the receipt (`Receipt.worker_id`).
RECEIPT_AUTHOR = "escalations-reveal"


def check_member(
    settings: Settings, escalation: Escalation, *, as_principal: str, seed: bytes
) -> str:
    """The member's public key when `as_principal` may decide on this escalation and
    `seed` is its key; `ResolutionRefused` (exit 6, refused) otherwise."""
    if settings.approval_authority_file is None:
        raise TrustConfigError(
            "--reveal checks the approver against the approval authority: set "
            "AIPD_APPROVAL_AUTHORITY_FILE (--approval-authority-file)"
        )
    authority = ApprovalAuthority.load(
        settings.approval_authority_file, now_ms=int(time.time() * 1000)
    )
    try:
        match = authority.authorize(
            principal_id=as_principal,
            tenant_id=escalation.tenant_id,
            capability=escalation.capability,
            now_ms=int(time.time() * 1000),
        )
    except NotAuthorized as exc:
        raise ResolutionRefused(f"not revealed: {exc}") from None
    public_key = sign_envelope(b"", seed)[SIGNER_HEADER]
    if public_key != match.membership.public_key:
        raise ResolutionRefused(
            f"not revealed: --key is not the key of {as_principal}'s membership "
            f"({match.membership.public_key[:12]}…)"
        )
    return public_key


async def reveal(
    settings: Settings,
    redis: Any,
    escalation: Escalation,
    *,
    as_principal: str,
    key_file: Path,
    reason: str,
) -> dict[str, Any]:
    """The `reveal` part of `escalations show`: checked, receipted, then opened."""
    from worker.bus.connections import connect_nats_for_command

    approval = escalation.approval
    if approval is None:
        raise ResolutionRefused("not an approval escalation: there is no command to reveal")
    try:
        seed = read_seed_file(key_file, what="approver key file (--key)")
    except (OSError, ValueError) as exc:
        raise TrustConfigError(f"--key: {exc}") from None
    public_key = check_member(settings, escalation, as_principal=as_principal, seed=seed)
    stored = await OperatorStore.reader(redis).read(binding_key(approval.source_action_id))
    if stored.doc is None:
        raise ResolutionRefused("the run has no operator binding (expired?): nothing to reveal")
    binding = decode_binding(stored.doc)
    if binding.approval_generation != approval.approval_generation:
        raise ResolutionRefused(
            f"the run has moved on (approval generation {binding.approval_generation}, "
            f"the escalation's is {approval.approval_generation})"
        )
    sealed = binding.pending_command_sealed or {}
    if public_key not in sealed:
        raise ResolutionRefused(
            "nothing was sealed to this key for the pending prompt (the membership's key "
            "is newer than the prompt, or the worker that recorded it had no authority file)"
        )
    nc = await connect_nats_for_command(settings)
    try:
        await _file_receipt(
            nc.jetstream(), Subjects(settings.subject_prefix), escalation, seed,
            by=as_principal, public_key=public_key, reason=reason,
        )
    finally:
        await nc.close()
    command = open_sealed(sealed, public_key, seed)
    if command is None:
        raise ResolutionRefused("the sealed command does not open with this key")
    return {"command": command, "revealed_to": as_principal, "receipted": True}


async def _file_receipt(
    js: Any, subjects: Subjects, escalation: Escalation, seed: bytes, **details: str
) -> None:
    assert escalation.approval is not None
    source = escalation.approval.source_action_id
    now_ms = time.time_ns() // 1_000_000
    receipt = Receipt(
        receipt_id=f"{source}:command_revealed:{escalation.escalation_id}:{now_ms}:{os.getpid()}",
        event=ReceiptEvent.COMMAND_REVEALED,
        action_id=source,
        endpoint_id=escalation.endpoint_id,
        worker_id=RECEIPT_AUTHOR,
        ts_unix_ms=now_ms,
        details={
            "escalation_id": escalation.escalation_id,
            "approval_generation": escalation.approval.approval_generation,
            **details,
        },
    )
    data = encode_receipt(receipt, signer=AipSigner.from_nkey_seed(seed.strip()))[0]
    headers = receipt_headers()  # no Nats-Msg-Id: it says why
    await js.publish(subjects.audit(escalation.endpoint_id, source), data, headers=headers)
