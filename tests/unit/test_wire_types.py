"""Schema round trip and rejection (docs/publishing.md, wire types): strict, unknown fields
rejected, sized."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from schemas import ActionResult, ResultStatus, StreamChunk, encode, new_action_id
from schemas.chunk import ChunkKind, DoneChunk, make_chunk
from schemas.errors import CODE_RULES, EnvelopeRejected, ErrorCode, InvalidEndpointId
from subjects.grammar import Subjects, normalize_endpoint_id
from tests.aip_actions import SENDER, action_envelope, canonical
from worker.wire.actions import decode_action, encode_action


def _envelope(**action_changes: object) -> dict[str, Any]:
    """An unsigned Action Envelope built from the AIP rules (`tests/aip_actions.py`), its
    `body.action` changed by `action_changes`."""
    envelope = action_envelope(endpoint="hermes-1", principal="user:alice")
    envelope["from"] = dict(SENDER)
    del envelope["body"]["action"]["mode"]  # absent: the default
    envelope["body"]["action"].update(action_changes)
    return envelope


def test_action_round_trips_and_defaults_to_async_mode() -> None:
    action, opened = decode_action(canonical(_envelope()))
    assert action.mode == "async"
    assert action.received is not None
    assert action.received.message_id == opened.message_id
    again, _ = decode_action(encode_action(action, signer=None, sender=SENDER))
    assert msgspec.structs.replace(again, received=None) == msgspec.structs.replace(
        action, received=None
    )


def _late() -> dict[str, Any]:
    envelope = _envelope()
    envelope["extensions"] = {"org.aip-hermes-worker": {"created_at_unix_ms": "1"}}
    return envelope


@pytest.mark.parametrize(
    ("envelope", "code"),
    [
        (_envelope(surprise=1), "schema.envelope.invalid"),
        (_late(), "schema.envelope.invalid"),
        (_envelope(id="act_short"), "schema.envelope.invalid"),
        (_envelope(capability_id="cap:other:hermes-1:models"), "schema.envelope.invalid"),
        (_envelope(mode="eventually"), "schema.envelope.invalid"),
        (_envelope(mode="stream"), "schema.envelope.invalid"),  # AIP says `streaming`
        (_envelope(timeout_ms=86_400_001), "schema.envelope.invalid"),
        (
            _envelope(identity={"human_actor": {"id": "", "kind": "human"}}),
            "schema.envelope.invalid",
        ),
    ],
)
def test_invalid_actions_are_refused_with_the_envelope_code(
    envelope: dict[str, Any], code: str
) -> None:
    with pytest.raises(EnvelopeRejected) as refused:
        decode_action(canonical(envelope))
    assert refused.value.code == code


def test_size_is_checked_before_parsing() -> None:
    payload = canonical(_envelope(input={"x": "y" * 2000}))
    with pytest.raises(EnvelopeRejected, match="limit"):
        decode_action(payload, max_bytes=1024)


def test_malformed_json_and_deep_nesting_are_decode_errors() -> None:
    for payload in (b"{", b"\xff", b"[" * 100_000):
        with pytest.raises(EnvelopeRejected) as refused:
            decode_action(payload)
        assert refused.value.code in ("envelope.decode.invalid", "schema.envelope.invalid")


def test_chunks_are_a_tagged_union_on_kind() -> None:
    chunk = make_chunk(
        ChunkKind.DONE, action_id=new_action_id(), endpoint_id="h1", seq=3, ts_unix_ms=5
    )
    data = encode(chunk)
    assert msgspec.json.decode(data)["kind"] == "done"
    back = msgspec.json.decode(data, type=StreamChunk)
    assert isinstance(back, DoneChunk)
    assert back.kind is ChunkKind.DONE


def test_every_code_has_a_rule_and_unsafe_temporaries_are_uncertain() -> None:
    assert set(CODE_RULES) == set(ErrorCode)
    rule = CODE_RULES[ErrorCode.REMOTE_TEMPORARY]
    assert rule.retryable(read_only=True)
    assert not rule.retryable(read_only=False)
    assert rule.uncertain_outcome(read_only=False)
    assert not rule.uncertain_outcome(read_only=True)
    assert CODE_RULES[ErrorCode.OPERATOR_OUTCOME_UNKNOWN].uncertain_outcome(read_only=True)


def test_result_status_values_are_the_wire_contract() -> None:
    assert {s.value for s in ResultStatus} == {
        "completed",
        "failed",
        "cancelled",
        "requires_human",
    }
    assert "error" in ActionResult.__struct_fields__


def test_endpoint_ids_normalize_or_are_refused() -> None:
    assert normalize_endpoint_id(" Hermes.1 ") == "hermes-1"
    with pytest.raises(InvalidEndpointId):
        normalize_endpoint_id("--")
    subjects = Subjects()
    action_id = new_action_id()
    assert subjects.chunks("h1", action_id) == f"aip.hermes.h1.chunks.{action_id}"
    assert subjects.stream_name("actions") == "AIP_HERMES_ACTIONS"
    with pytest.raises(ValueError, match="action id"):
        subjects.results("h1", "act_x.>")


def test_the_manifest_publishes_the_endpoints_tenant_binding() -> None:
    """A bound endpoint's AIP manifest carries its tenant in
    `compatibility.tenant_bound_endpoints` and the expiry in our extension (the gateway
    lists it only to that tenant); an unbound one lists no binding: it serves every tenant
    when shared, none carrying a tenant otherwise."""
    from worker.control import manifest_of
    from worker.endpoints import Endpoint, EndpointDescriptor
    from worker.settings import Settings
    from worker.wiring import build_registry

    registry = build_registry(Settings(hermes_endpoints="h1=http://127.0.0.1:1"))

    def wire(descriptor: EndpointDescriptor) -> dict[str, Any]:
        manifest = manifest_of(
            registry,
            Endpoint(descriptor=descriptor, api_key=None),
            actions_subject="aip.hermes.h1.actions",
        )
        built: dict[str, Any] = msgspec.to_builtins(manifest)
        return built

    bound = wire(
        EndpointDescriptor(
            id="h1", url="http://127.0.0.1:1", tenant_id="tenant-a", tenant_expires_at_unix_ms=5
        )
    )
    assert bound["compatibility"]["tenant_bound_endpoints"] == [
        {"endpoint_id": "h1", "tenant_id": "tenant-a"}
    ]
    assert bound["extensions"]["org.aip-hermes-worker"]["tenant_expires_at_unix_ms"] == 5
    assert bound["capabilities"]
    unbound = wire(EndpointDescriptor(id="h1", url="http://127.0.0.1:1"))
    assert unbound["compatibility"]["tenant_bound_endpoints"] == []
    assert unbound["extensions"]["org.aip-hermes-worker"]["shared"] is False
    assert "tenant_expires_at_unix_ms" not in unbound["extensions"]["org.aip-hermes-worker"]
    shared = wire(EndpointDescriptor(id="h1", url="http://127.0.0.1:1", shared=True))
    assert shared["compatibility"]["tenant_bound_endpoints"] == []
    assert shared["extensions"]["org.aip-hermes-worker"]["shared"] is True


@pytest.mark.parametrize(
    ("bound", "expires", "shared", "tenant", "admitted"),
    [
        (None, None, False, None, True),
        (None, None, False, "tenant-b", False),
        (None, None, True, None, True),
        (None, None, True, "tenant-b", True),
        ("tenant-a", None, False, "tenant-a", True),
        ("tenant-a", None, False, "tenant-b", False),
        ("tenant-a", None, False, None, False),
        ("tenant-a", 1_001, False, "tenant-a", True),
        ("tenant-a", 1_000, False, "tenant-a", False),
    ],
)
async def test_a_tenant_binding_admits_what_the_workers_tenancy_check_admits(
    bound: str | None, expires: int | None, shared: bool, tenant: str | None, admitted: bool
) -> None:
    """The gateway's predicate and the worker's admission check agree, case by case."""
    from worker.endpoints import Endpoint, EndpointDescriptor
    from worker.errors import ConnectorError
    from worker.trust.tenancy import binding_admits, check_endpoint_tenant

    class At1000:
        async def now_ms(self) -> int:
            return 1_000

    descriptor = EndpointDescriptor(
        id="h1",
        url="http://127.0.0.1:1",
        tenant_id=bound,
        tenant_expires_at_unix_ms=expires,
        shared=shared,
    )
    checked = check_endpoint_tenant(Endpoint(descriptor=descriptor, api_key=None), tenant, At1000())
    if admitted:
        await checked
    else:
        with pytest.raises(ConnectorError) as refused:
            await checked
        assert refused.value.code is ErrorCode.TENANT_MISMATCH
    assert binding_admits(bound, expires, tenant, 1_000, shared=shared) is admitted
