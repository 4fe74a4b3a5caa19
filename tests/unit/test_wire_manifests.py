"""The manifest subject's wire (`worker/wire/manifests.py`, docs/publishing.md "Manifest"):
a hand-built `aip.discovery.v1.manifest_request` Envelope (PyNaCl-signed, canonical form
written by the rules in `tests/aip_actions.py`) is answered by a `manifest_response`
Envelope whose signature is verified here with PyNaCl, whose bytes validate against the
exported schema (the `jsonschema` library, a validator this project did not write), and whose
manifest is checked against the conformance rules of shared/reference/aip-1.0-wire.md §1.14
("What a connector's manifest must contain") and the capability table of §4.2.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import nacl.signing
import pytest
from jsonschema import Draft202012Validator

from schemas.errors import EnvelopeRejected, ErrorCode
from tests.aip_actions import SENDER, canonical, did_of, sign
from worker.aip.signing import AipSigner
from worker.control import manifest_of
from worker.endpoints import Endpoint, EndpointDescriptor
from worker.settings import Settings
from worker.wire.manifests import (
    decode_manifest_request,
    encode_manifest_error,
    encode_manifest_response,
    select,
)
from worker.wiring import build_registry

SEED = bytes(range(32))
WORKER_KEY = nacl.signing.SigningKey(SEED)
SIGNER = AipSigner.from_seed(SEED)
CALLER_KEY = nacl.signing.SigningKey(bytes(range(32, 64)))
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"
OURS = "org.aip-hermes-worker"
#: Upstream's 35 operation names (§4.2), in its table's order.
UPSTREAM_35 = [
    "health",
    "health_detailed",
    "models",
    "capabilities",
    "skills",
    "toolsets",
    "chat",
    "chat_stream",
    "responses",
    "responses_stream",
    "response_get",
    "response_delete",
    "run_start",
    "run_status",
    "run_events",
    "run_approval",
    "run_stop",
    "operator",
    "sessions_list",
    "session_create",
    "session_get",
    "session_patch",
    "session_delete",
    "session_messages",
    "session_fork",
    "session_chat",
    "session_chat_stream",
    "jobs_list",
    "job_create",
    "job_get",
    "job_update",
    "job_delete",
    "job_pause",
    "job_resume",
    "job_run",
]
#: The rows §4.2 gives `send_message` without approval: upstream's own connector publishes
#: them so (a turn sends a message to the model; nobody approves a chat turn), which the
#: approval rule of `enterprise.capability_contract` flags; this project keeps upstream's value.
SEND_WITHOUT_APPROVAL = {
    "chat", "chat_stream", "responses", "responses_stream", "session_chat",
    "session_chat_stream",
}  # fmt: skip


#: §4.2's read-only set (its 14 `low` rows): side effects `read` and `external_network`,
#: idempotency optional, which the idempotency rule (every effect but `read` is mutating)
#: flags in upstream's own connector too.
READS = {
    "health", "health_detailed", "models", "capabilities", "skills", "toolsets",
    "response_get", "run_status", "run_events", "sessions_list", "session_get",
    "session_messages", "jobs_list", "job_get",
}  # fmt: skip


@pytest.fixture(scope="module")
def registry() -> Any:
    return build_registry(Settings(hermes_endpoints="h1=http://127.0.0.1:1"))


def _manifest(registry: Any, **descriptor: Any) -> Any:
    endpoint = Endpoint(
        descriptor=EndpointDescriptor(id="h1", url="http://127.0.0.1:1", **descriptor),
        api_key=None,
    )
    return manifest_of(registry, endpoint, actions_subject="aip.hermes.h1.actions")


def _request(body: dict[str, Any], *, signed: bool = True) -> tuple[dict[str, Any], bytes]:
    """A manifest request Envelope written from the rules (§1.1, §1.14), not by our codec."""
    envelope: dict[str, Any] = {
        "aip_version": "1.0",
        "message_type": "aip.discovery.v1.manifest_request",
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "correlation_id": "corr-manifest-1",
        "body": {"manifest_request": body},
    }
    if signed:
        envelope = sign(envelope, CALLER_KEY)
    else:
        envelope["from"] = dict(SENDER)
    return envelope, canonical(envelope)


def _answer(registry: Any, body: dict[str, Any], **descriptor: Any) -> dict[str, Any]:
    asked, opened = decode_manifest_request(_request(body)[1])
    data = encode_manifest_response(
        select(_manifest(registry, **descriptor), asked),
        endpoint_id="h1",
        signer=SIGNER,
        request=opened,
    )
    answer: dict[str, Any] = json.loads(data)
    return answer


def _verify_with_pynacl(envelope: dict[str, Any]) -> None:
    """§2.2: Ed25519 over the canonical Envelope without `security.signature`, by the key
    `security.did` names."""
    unsigned = copy.deepcopy(envelope)
    signature = base64.b64decode(unsigned["security"].pop("signature"))
    assert unsigned["security"]["did"] == did_of(WORKER_KEY)
    assert unsigned["from"]["did"] == did_of(WORKER_KEY)
    WORKER_KEY.verify_key.verify(canonical(unsigned), signature)


def test_the_answer_is_a_signed_manifest_response_replying_to_the_request(
    registry: Any,
) -> None:
    request, data = _request({})
    asked, opened = decode_manifest_request(data)
    raw = encode_manifest_response(
        select(_manifest(registry), asked), endpoint_id="h1", signer=SIGNER, request=opened
    )
    answer = json.loads(raw)
    assert raw == canonical(answer)  # the wire bytes are the canonical form
    _verify_with_pynacl(answer)
    assert answer["message_type"] == "aip.discovery.v1.manifest_response"
    assert list(answer["body"]) == ["manifest"]
    assert answer["in_response_to"] == request["message_id"]
    assert answer["to"] == request["from"]
    assert answer["correlation_id"] == "corr-manifest-1"
    assert answer["from"]["id"] == "agent:hermes_operator:h1"
    validator = Draft202012Validator(
        json.loads((SCHEMAS / "aip.discovery.v1.manifest_response.json").read_text())
    )
    assert sorted(e.message for e in validator.iter_errors(answer)) == []
    request_schema = json.loads((SCHEMAS / "aip.discovery.v1.manifest_request.json").read_text())
    assert list(Draft202012Validator(request_schema).iter_errors(request)) == []


def test_a_tampered_answer_fails_pynacl_verification(registry: Any) -> None:
    answer = _answer(registry, {})
    answer["body"]["manifest"]["capabilities"][0]["risk"] = "critical"
    with pytest.raises(nacl.exceptions.BadSignatureError):
        _verify_with_pynacl(answer)


def test_the_manifest_meets_the_connector_conformance_rules(registry: Any) -> None:
    """§1.14 "What a connector's manifest must contain", rule by rule, read off the JSON."""
    manifest = _answer(registry, {})["body"]["manifest"]
    assert manifest["manifest_version"] == "aip-manifest/v1"
    assert manifest["agent"] == {"id": "agent:hermes_operator:h1", "kind": "agent"}
    assert manifest["profiles"] == ["aip.native.nats.v1", "aip.connector.hermes_agent.v1"]
    # Each declared profile has its compatibility data: native NATS names its subject.
    assert manifest["compatibility"]["native_nats"]["subject"] == "aip.hermes.h1.actions"
    assert "hermes-agent" in json.dumps(manifest["compatibility"])
    capabilities = manifest["capabilities"]
    by_name = {c["name"]: c for c in capabilities}
    ids = [c["id"] for c in capabilities]
    assert len(ids) == len(set(ids)) == 35 <= 512
    assert len(canonical(manifest)) <= 4 * 1024 * 1024
    approval_gaps, idempotency_gaps = set(), set()
    for capability in capabilities:
        terms = capability["contract"]
        name = capability["name"]
        assert name.strip()
        assert isinstance(capability["input_schema"], dict)
        assert capability["input_schema"]["type"] == "object", name
        assert terms["side_effects"], name
        effects = set(terms["side_effects"])
        # Upstream's check counts every effect but `read` as mutating (external_network too).
        if effects - {"read"} and terms["idempotency"]["requirement"] != "required":
            idempotency_gaps.add(name)
        visible = {"send_message", "delete", "financial", "legal", "medical", "identity"}
        if effects & visible and not terms.get("approval", {}).get("required"):
            approval_gaps.add(name)
        data = terms["data"]
        if data["contains_pii"] or data["sensitivity"] in ("restricted", "regulated"):
            assert data["redaction_required"], name
        if "approval" in terms:
            assert terms["approval"]["evidence_requirements"], name
            assert capability["requires_human_approval"] is terms["approval"]["required"]
        assert "transaction" not in terms, name
    # The two rules upstream's own Hermes connector does not meet, kept as upstream publishes
    # them (docs/capabilities.md "Where the manifest departs from the conformance rules"):
    # turns send messages without approval, and reads reach the network without a key.
    assert approval_gaps == SEND_WITHOUT_APPROVAL
    assert idempotency_gaps == READS
    for name in READS:
        assert by_name[name]["contract"]["side_effects"] == ["read", "external_network"]


def test_the_capabilities_are_upstreams_35_with_their_bindings(registry: Any) -> None:
    manifest = _answer(registry, {})["body"]["manifest"]
    by_name = {c["name"]: c for c in manifest["capabilities"]}
    assert sorted(by_name) == sorted(UPSTREAM_35)
    for name, capability in by_name.items():
        assert capability["id"] == f"cap:hermes_agent:h1:{name}"
        (binding,) = capability["bindings"]
        assert binding["profile"] == "aip.connector.hermes_agent.v1"
        assert (binding["operation"], binding["endpoint_id"]) == (name, "h1")
        assert binding["method"] in ("GET", "POST", "PATCH", "DELETE")
        assert binding["path"].startswith(("/v1/", "/api/", "/health"))
        assert capability["kind"] in ("agent", "tool", "workflow")
        assert capability["stability"] in ("stable", "experimental")
        execution = capability["contract"]["execution"]
        # A streaming twin completes streaming; its sync sibling never streams.
        if name in ("chat_stream", "responses_stream", "session_chat_stream"):
            assert execution["expected_completion"] == "streaming"
            assert binding["streaming"] is True
        if name in ("chat", "responses", "session_chat"):
            assert execution["expected_completion"] == "sync"
            assert execution["supports_streaming"] is False
            assert binding["streaming"] is False
    # Spot values of §4.2's table, as written there.
    assert (by_name["run_start"]["kind"], by_name["skills"]["stability"]) == (
        "workflow", "experimental",
    )  # fmt: skip
    assert by_name["job_pause"]["requires_human_approval"] is True
    assert by_name["operator"]["contract"]["sla"]["timeout_ms"] == 900_000
    assert "code_execution" in by_name["operator"]["contract"]["side_effects"]
    assert by_name["operator"]["output_schema"]
    assert "auth" not in by_name["health"]
    assert by_name["models"]["auth"] == {"scheme": "bearer", "source": "endpoint.api_key"}
    assert manifest["extensions"][OURS]["worker_version"]


def test_a_filter_selects_capabilities(registry: Any) -> None:
    def names(body: dict[str, Any]) -> list[str]:
        manifest = _answer(registry, body)["body"]["manifest"]
        # An empty list is left out, as upstream serializes it.
        return sorted(c["name"] for c in manifest.get("capabilities", []))

    assert names({"filter": {"capability_ids": ["cap:hermes_agent:h1:chat"]}}) == ["chat"]
    assert names({"filter": {"capability_ids": ["cap:hermes_agent:h2:chat"]}}) == []
    streaming = names({"filter": {"supports_streaming": True}})
    assert "chat_stream" in streaming
    assert "chat" not in streaming
    approval = names({"filter": {"requires_approval": True}})
    assert "run_start" in approval
    assert "models" not in approval
    assert names({"filter": {"risk": ["high"], "side_effects": ["delete"]}}) == [
        "job_delete", "response_delete", "session_delete",
    ]  # fmt: skip
    assert names({"filter": {"supports_transactions": True}}) == []
    assert names({"profiles": ["aip.native.http.v1"]}) == []
    assert len(names({})) == 35


def test_the_tenant_binding_is_in_compatibility_and_its_expiry_in_our_extension(
    registry: Any,
) -> None:
    manifest = _answer(registry, {}, tenant_id="tenant-a", tenant_expires_at_unix_ms=5)
    body = manifest["body"]["manifest"]
    assert body["compatibility"]["tenant_bound_endpoints"] == [
        {"endpoint_id": "h1", "tenant_id": "tenant-a"}
    ]
    assert body["extensions"][OURS]["tenant_expires_at_unix_ms"] == 5
    assert body["security"]["tenant_binding"] is True


def test_an_unsigned_request_is_answered_and_a_bad_one_is_refused_typed(
    registry: Any,
) -> None:
    _, data = _request({}, signed=False)
    asked, opened = decode_manifest_request(data)
    assert opened.verified is None
    assert asked.filter is None
    forged, _ = _request({})
    forged["correlation_id"] = "changed after signing"
    with pytest.raises(EnvelopeRejected) as refused:
        decode_manifest_request(canonical(forged))
    assert refused.value.code is ErrorCode.HOST_AUTHENTICATION
    for bad in (b"", b"{}", canonical({**_request({})[0], "message_type": "aip.core.v1.cancel"})):
        with pytest.raises(EnvelopeRejected):
            decode_manifest_request(bad)
    unknown_filter, _ = _request({"filter": {"colour": "red"}}, signed=False)
    with pytest.raises(EnvelopeRejected):
        decode_manifest_request(canonical(unknown_filter))


def test_a_refusal_is_a_signed_error_envelope() -> None:
    from worker.errors import protocol_error

    error = protocol_error(ErrorCode.SCHEMA_ENVELOPE_INVALID, "not a manifest request")
    answer = json.loads(encode_manifest_error(error, endpoint_id="h1", signer=SIGNER, request=None))
    _verify_with_pynacl(answer)
    assert answer["message_type"] == "aip.core.v1.error"
    assert answer["body"]["error"]["error"]["code"] == ErrorCode.SCHEMA_ENVELOPE_INVALID.value
    msgspec.json.encode(answer)
