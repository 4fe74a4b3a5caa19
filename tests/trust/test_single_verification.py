"""One Ed25519 verification per delivery: the runtime verifies the envelope to decide DLQ
or not, then hands that result to admission instead of verifying the same bytes again."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from trust_support import UNGOVERNED, action_document, encode_action, endpoint

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.store.stores import Stores
from worker.testing.identities import USER_UNTENANTED, TrustFiles
from worker.trust import gate as gate_module
from worker.trust.gate import TrustGate

TARGET = endpoint("hermes-a")


async def test_admission_reuses_the_runtimes_verification(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    action, payload = encode_action(
        action_document(endpoint=TARGET.id, principal=USER_UNTENANTED, tenant=None)
    )
    headers = trust_files.sign(payload)
    calls: list[bytes] = []
    real = gate_module.verify_envelope

    def counting(data: bytes, hdrs: object, keys: object) -> str:
        calls.append(data)
        return real(data, hdrs, keys)  # type: ignore[arg-type]

    monkeypatch.setattr(gate_module, "verify_envelope", counting)
    signer = gate.verify_signature(payload, headers)
    decision = await gate.admit_verified(
        action=action, signer=signer, endpoint=TARGET, spec=UNGOVERNED, stores=Stores.over(redis)
    )
    assert decision.signer == signer == trust_files.public_key
    assert calls == [payload]


async def test_without_the_flag_admission_still_verifies(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    action, payload = encode_action(
        action_document(endpoint=TARGET.id, principal=USER_UNTENANTED, tenant=None)
    )
    with pytest.raises(ConnectorError) as caught:
        await gate.admit(
            action=action,
            payload=payload,
            headers={},
            endpoint=TARGET,
            spec=UNGOVERNED,
            stores=Stores.over(redis),
        )
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION
