"""The operator's whole contract as the manifest serves it on its subject (spec "Operation
contract"), the output it promises, and `mode` refused where a capability does not offer it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import msgspec

from schemas.action import Mode
from schemas.ids import json_schema
from schemas.operator import OperatorOutput
from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.testing.scenario import NEEDS_APPROVAL

OUTPUT_SCHEMA = json.loads(
    (Path(__file__).parents[2] / "schemas" / "json" / "OperatorOutput.json").read_text()
)
ONE_HOUR_MS = 3_600_000


def _entry(manifest: dict[str, Any], operation: str) -> dict[str, Any]:
    return next(e for e in manifest["capabilities"] if e["name"] == operation)


def _conforms(output: Any) -> None:
    """The output validates against the published schema and decodes as OperatorOutput."""
    jsonschema.validate(output, OUTPUT_SCHEMA, cls=jsonschema.Draft202012Validator)
    msgspec.convert(output, OperatorOutput, strict=True)


async def test_the_manifest_publishes_the_whole_operator_contract(stack: Stack) -> None:
    """The operator's capability in the AIP manifest (shared/reference/aip-1.0-wire.md
    §4.2 and §4.9): its binding, risk, approval and the whole CapabilityContract, with the
    deployment's own result retention as the idempotency TTL."""
    await stack.spawn("w1", AIPD_RESULT_TTL_MS=str(ONE_HOUR_MS))
    manifest = await stack.client.manifest(ENDPOINT)
    operator = _entry(manifest, "operator")
    assert operator["id"] == f"cap:hermes_agent:{ENDPOINT}:operator"
    (binding,) = operator["bindings"]
    assert (binding["method"], binding["path"], binding["streaming"]) == ("POST", "/v1/runs", True)
    assert (operator["kind"], operator["stability"]) == ("agent", "stable")
    assert (operator["risk"], operator["requires_human_approval"]) == ("high", True)
    contract = operator["contract"]
    assert contract["side_effects"] == [
        "read",
        "write",
        "send_message",
        "external_network",
        "code_execution",
    ]
    assert contract["data"] == {
        "sensitivity": "confidential",
        "contains_pii": True,
        "redaction_required": True,
    }
    assert contract["execution"] == {
        "supports_sync": True,
        "supports_async": True,
        "supports_streaming": True,
        "supports_cancel": True,
        "supports_retry": False,
        "expected_completion": "streaming",
        "retry_safety": "unsafe",
    }
    assert contract["sla"] == {
        "async_expected": True,
        "expected_latency_ms": 30_000,
        "timeout_ms": 900_000,
        "max_queue_delay_ms": 10_000,
        "availability_target": "99.9%",
    }
    assert "transaction" not in contract
    assert contract["compensation"] == {"mode": "rollback_not_supported", "requires_approval": True}
    # The deployment's own result retention, not a constant.
    assert contract["idempotency"] == {
        "requirement": "required",
        "collision_behavior": "return_original_result",
        "key_scope": "capability",
        "ttl_ms": ONE_HOUR_MS,
    }
    approval = contract["approval"]
    assert (approval["required"], approval["ttl_ms"]) == (True, 900_000)
    assert approval["evidence_requirements"] == ["reason", "input_snapshot", "policy_decision"]
    assert f"agent:hermes_operator:{ENDPOINT}" in manifest["compatibility"]["operator_principals"]
    output_schema = operator["output_schema"]
    required = output_schema["$defs"]["OperatorOutput"]["required"]
    assert set(required) == {"endpoint_id", "session_id", "source_action_id", "status"}
    # Published in JSON Schema's own regex dialect, like schemas/json/OperatorOutput.json.
    assert output_schema == json_schema(OperatorOutput)
    assert output_schema["$defs"] == OUTPUT_SCHEMA["$defs"]
    # A capability that does not stream does not say it does; a read needs no key.
    models = _entry(manifest, "models")
    assert models["contract"]["execution"]["supports_streaming"] is False
    assert models["contract"]["idempotency"]["requirement"] == "optional"
    assert "output_schema" not in models


async def test_every_operator_output_matches_the_published_output_schema(stack: Stack) -> None:
    await stack.spawn("w1")
    waiting, waiting_handle = await stack.operator(f"tidy the scratch file {NEEDS_APPROVAL}")
    paused = await waiting_handle.result(timeout_s=30)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    _conforms(paused.output)
    assert paused.output["pending_approval"] is not None
    resume, resume_handle = await stack.resume(waiting.id, "once")
    resumed = await resume_handle.result(timeout_s=30)
    assert resumed.status is ResultStatus.COMPLETED, resumed.error
    _conforms(resumed.output)
    assert resumed.output["source_action_id"] == waiting.id
    assert resume.id != waiting.id


async def test_a_mode_the_capability_does_not_offer_is_refused_before_anything_is_sent(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    refused = await (await stack.publish(stack.action("models", mode=Mode.STREAM))).result(
        timeout_s=30
    )
    assert refused.status is ResultStatus.FAILED
    assert refused.error is not None
    assert refused.error.code == "connector.hermes_agent.configuration_or_input"
    assert "does not offer mode 'stream'" in refused.error.message
    assert stack.fake is not None
    assert sum(stack.fake.stats().routes.values()) == 0
    # Every offered mode runs: a sync read, a streamed operator.
    read = await (await stack.publish(stack.action("models", mode=Mode.SYNC))).result(timeout_s=30)
    assert read.status is ResultStatus.COMPLETED, read.error
    _, handle = await stack.operator("stream this", mode=Mode.STREAM)
    streamed = await handle.result(timeout_s=30)
    assert streamed.status is ResultStatus.COMPLETED, streamed.error
    _conforms(streamed.output)
