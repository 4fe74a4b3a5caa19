"""One Ed25519 verification per delivery: the runtime opens the Action Envelope (which
verifies its signature) to decide DLQ or not, then hands the trusted signer to admission
instead of verifying the same bytes again."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from trust_support import UNGOVERNED, action_document, encode_action, endpoint

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.store.stores import Stores
from worker.testing.identities import USER_UNTENANTED, TrustFiles
from worker.trust.gate import TrustGate
from worker.wire import envelopes
from worker.wire.actions import decode_action

TARGET = endpoint("hermes-a")


async def test_admission_reuses_the_runtimes_verification(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, payload = encode_action(
        action_document(endpoint=TARGET.id, principal=USER_UNTENANTED, tenant=None), trust_files
    )
    calls: list[Any] = []
    real = envelopes.verify_checked  # what open_envelope verifies with

    def counting(data: Any, **kwargs: Any) -> Any:
        calls.append(data)
        return real(data, **kwargs)

    monkeypatch.setattr(envelopes, "verify_checked", counting)
    action, opened = decode_action(payload)
    signer = gate.verify_action_signer(opened.verified)
    decision = await gate.admit_verified(
        action=action, signer=signer, endpoint=TARGET, spec=UNGOVERNED, stores=Stores.over(redis)
    )
    assert decision.signer == signer == trust_files.public_key
    assert len(calls) == 1


async def test_without_the_flag_admission_still_verifies(
    gate: TrustGate, redis: Redis
) -> None:
    _, payload = encode_action(
        action_document(endpoint=TARGET.id, principal=USER_UNTENANTED, tenant=None)
    )  # unsigned
    with pytest.raises(ConnectorError) as caught:
        await gate.admit(
            payload=payload, endpoint=TARGET, spec=UNGOVERNED, stores=Stores.over(redis)
        )
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION
