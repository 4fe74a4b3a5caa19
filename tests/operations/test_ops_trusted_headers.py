"""Provider requests carry the trusted projection and the key, and nothing from `input`
(connector overview, "Trusted Execution Projection")."""

from __future__ import annotations

import pytest
from ops_harness import HermesServer, Invoke

from schemas.codec import convert_input
from schemas.errors import EnvelopeRejected
from worker.operations.base import Registry

PROJECTION = {
    "x-aip-principal-id": "user:alice",
    "x-aip-tenant-id": "tenant-a",
    "x-aip-authentication-issuer": "https://issuer.example",
    "x-aip-trace-id": "trace-1",
    "x-aip-correlation-id": "corr-1",
    "x-aip-delegation-chain": "user:alice,agent:x",
}


@pytest.mark.parametrize(
    ("name", "input_value", "route"),
    [
        ("models", {}, "GET /v1/models"),
        ("session_create", {"title": "X-AIP-Principal-Id: root"}, "POST /api/sessions"),
        (
            "chat",
            {"messages": [{"role": "user", "content": "Idempotency-Key: forged"}]},
            "POST /v1/chat/completions",
        ),
        ("run_start", {"input": "X-AIP-Tenant-Id: other"}, "POST /v1/runs"),
    ],
)
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.aip_family("identity_credentials", assertions=["transport_actor_bound"])
@pytest.mark.aip_family("idempotency_duplicates", assertions=["delivery_id_stable"])
async def test_requests_carry_exactly_the_trusted_projection(
    invoke: Invoke, hermes: HermesServer, name: str, input_value: dict, route: str
) -> None:
    fake = hermes.require_fake()
    fake.reset()
    result = await invoke(name, input_value, idempotency_key="idem-envelope-1")
    (seen,) = [r for r in fake.requests() if r.route == route]
    headers = {k.lower(): v for k, v in seen.headers.items()}
    for header, value in PROJECTION.items():
        assert headers[header] == value
    assert headers["idempotency-key"] == "idem-envelope-1"
    assert headers["x-aip-deadline-unix-ms"] == str(result.ctx.deadline_unix_ms())
    assert headers["authorization"] == f"Bearer {hermes.api_key}"
    aip = {k for k in headers if k.startswith("x-aip-") or k == "idempotency-key"}
    assert aip == set(PROJECTION) | {"idempotency-key", "x-aip-deadline-unix-ms"}
    assert not any(k.startswith("x-hermes-") for k in headers)


@pytest.mark.parametrize(
    ("name", "input_value"),
    [
        ("models", {"headers": {"X-AIP-Principal-Id": "root"}}),
        ("run_start", {"input": "x", "headers": {"Authorization": "Bearer x"}}),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "extra_headers": {}}),
        ("session_chat", {"session_id": "s1", "message": "x", "X-Hermes-Session-Key": "k"}),
        ("responses", {"input": "x", "idempotency_key": "forged"}),
    ],
)
def test_input_has_no_way_to_name_a_header(
    registry: Registry, name: str, input_value: dict
) -> None:
    operation = registry.get(name)
    assert operation is not None
    with pytest.raises(EnvelopeRejected):
        convert_input(input_value, operation.spec.input_type)
