"""Trusted execution projection: provider headers from verified fields only, never injected."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from trust_support import UNGOVERNED, action_document, encode_action, endpoint, now_ms

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.store.stores import Stores
from worker.testing.identities import ISSUER, TENANT_A, USER_A, TrustFiles
from worker.trust.gate import TrustGate
from worker.trust.identities import IdentityDirectory
from worker.trust.projection import PROJECTED_HEADERS, trusted_projection


def verified(files: TrustFiles) -> Any:
    identity = IdentityDirectory.load(files.identity_file, now_ms=now_ms()).get(USER_A)
    assert identity is not None
    return identity


def test_headers_come_from_verified_fields_and_never_from_input(trust_files: TrustFiles) -> None:
    document = action_document(
        input={
            "_aip": {"principal_id": "user:root", "tenant_id": "tenant-z", "trace_id": "evil"},
            "X-AIP-Principal-Id": "user:root",
        },
        deadline_unix_ms=1_900_000_000_000,
        delegation={"delegation_id": "dlg-1", "chain": ["user:alice", "agent:hermes_operator:a"]},
    )
    action, _ = encode_action(document)
    headers = trusted_projection(action, verified(trust_files))
    assert headers == {
        "X-AIP-Principal-Id": USER_A,
        "X-AIP-Tenant-Id": TENANT_A,
        "X-AIP-Authentication-Issuer": ISSUER,
        "X-AIP-Trace-Id": "trace-1",
        "X-AIP-Correlation-Id": "corr-1",
        "X-AIP-Deadline-Unix-Ms": "1900000000000",
        "X-AIP-Delegation-Chain": "user:alice,agent:hermes_operator:a",
        "Idempotency-Key": "idem-1",
    }
    assert set(headers) <= set(PROJECTED_HEADERS)
    assert "opaque-credential" not in repr(headers)


def test_the_runtime_deadline_wins_and_absent_fields_are_omitted(trust_files: TrustFiles) -> None:
    document = action_document(timeout_ms=5_000)
    del document["trace"], document["idempotency_key"]
    action, _ = encode_action(document)
    headers = trusted_projection(action, verified(trust_files))
    assert headers["X-AIP-Deadline-Unix-Ms"] == str(action.created_at_unix_ms + 5_000)
    assert not {"X-AIP-Trace-Id", "Idempotency-Key", "X-AIP-Delegation-Chain"} & set(headers)
    tighter = trusted_projection(action, verified(trust_files), deadline_unix_ms=42)
    assert tighter["X-AIP-Deadline-Unix-Ms"] == "42"


INJECTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("crlf-trace", {"trace": {"trace_id": "t\r\nX-AIP-Principal-Id: user:root"}}, "Trace-Id"),
    ("lf-correlation", {"trace": {"correlation_id": "c\nx"}}, "Correlation-Id"),
    ("nul-idempotency", {"idempotency_key": "k\x00"}, "Idempotency-Key"),
    ("del-idempotency", {"idempotency_key": "k\x7f"}, "Idempotency-Key"),
    ("tab-trace", {"trace": {"trace_id": "a\tb"}}, "Trace-Id"),
    ("non-ascii", {"idempotency_key": "clé"}, "Idempotency-Key"),
    ("trailing-space", {"idempotency_key": "key "}, "Idempotency-Key"),
    ("comma-in-chain", {"delegation": {"delegation_id": "d", "chain": ["a,b"]}}, "Chain"),
    (
        "oversized-chain",
        {"delegation": {"delegation_id": "d", "chain": ["p" * 300, "q" * 300]}},
        "Chain",
    ),
    ("crlf-chain", {"delegation": {"delegation_id": "d", "chain": ["a\r\nb"]}}, "Chain"),
]


@pytest.mark.parametrize(
    ("fields", "header"), [(f, h) for _, f, h in INJECTIONS], ids=[n for n, _, _ in INJECTIONS]
)
async def test_unsafe_header_values_refuse_the_action_before_any_request(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, fields: dict[str, Any], header: str
) -> None:
    _, payload = encode_action(action_document(**fields), trust_files)
    with pytest.raises(ConnectorError) as caught:
        await gate.admit(
            payload=payload,
            endpoint=endpoint(),
            spec=UNGOVERNED,
            stores=Stores.over(redis),
        )
    assert caught.value.code is ErrorCode.CONFIGURATION_OR_INPUT
    assert header in caught.value.message
    assert "\r" not in caught.value.message
    assert "\n" not in caught.value.message


def test_a_512_byte_value_passes_and_513_is_refused(trust_files: TrustFiles) -> None:
    identity = verified(trust_files)
    ok, _ = encode_action(action_document(idempotency_key="k" * 512))
    assert trusted_projection(ok, identity)["Idempotency-Key"] == "k" * 512
    chain = ["p" * 256, "q" * 256]  # 513 bytes once joined
    too_long, _ = encode_action(action_document(delegation={"delegation_id": "d", "chain": chain}))
    with pytest.raises(ConnectorError, match="over 512 bytes"):
        trusted_projection(too_long, identity)
