"""Spec "Apply operator policy bounds" and "Submit a direct objective" (provider payload)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from operator_support import Harness, error_code, objective

from schemas.errors import ErrorCode
from worker.errors import PolicyError
from worker.operator.binding import session_id_for
from worker.operator.policy import (
    BOUNDS,
    BUILTIN_INSTRUCTIONS,
    MAX_INSTRUCTIONS_BYTES,
    HermesOperatorPolicy,
)
from worker.settings import Settings
from worker.testing.fake_hermes import FakeHermes

SPEC_DEFAULTS = {
    "delegation_enabled": False,
    "delegation_requires_approval": True,
    "model": None,
    "timeout_ms": 900_000,
    "poll_interval_ms": 250,
    "max_events": 4_096,
    "max_input_bytes": 1_048_576,
    "max_delegation_depth": 16,
    "start_claim_ttl_ms": 60_000,
    "cancel_grace_ms": 15_000,
    "capability_prefixes": (),
    "scope_prefixes": (),
}


def test_defaults_are_the_spec_table() -> None:
    for policy in (HermesOperatorPolicy(), HermesOperatorPolicy.from_settings(Settings())):
        for name, value in SPEC_DEFAULTS.items():
            assert getattr(policy, name) == value, name
        assert policy.system_instructions == BUILTIN_INSTRUCTIONS


def test_bounds_are_the_spec_table() -> None:
    assert dict((name, (low, high)) for name, low, high in BOUNDS) == {
        "timeout_ms": (1_000, 86_400_000),
        "poll_interval_ms": (10, 60_000),
        "max_events": (1, 100_000),
        "max_input_bytes": (1_024, 16_777_216),
        "max_delegation_depth": (1, 128),
        "start_claim_ttl_ms": (1_000, 300_000),
        "cancel_grace_ms": (1_000, 300_000),
        "max_concurrent_runs": (1, 1_000),
    }


@pytest.mark.parametrize(("name", "low", "high"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_every_bound_accepts_its_ends_and_rejects_beyond_them(
    name: str, low: int, high: int
) -> None:
    for ok in (low, high):
        _with(name, ok).validate()
    for bad in (low - 1, high + 1):
        with pytest.raises(PolicyError, match=name):
            _with(name, bad).validate()


def _with(name: str, value: int) -> HermesOperatorPolicy:
    changes: dict[str, Any] = {name: value}
    return dataclasses.replace(HermesOperatorPolicy(), **changes)


def test_builtin_instructions_govern_ids_reuse_and_fabrication() -> None:
    text = BUILTIN_INSTRUCTIONS
    assert "assigned by the AIP server" in text
    assert "never reuse the enclosing operator Action id" in text
    assert "Never fabricate" in text
    assert "approval" in text
    assert 0 < len(text.encode()) <= MAX_INSTRUCTIONS_BYTES


def test_instructions_must_be_non_empty_and_at_most_131072_bytes(tmp_path: Path) -> None:
    with pytest.raises(PolicyError):
        HermesOperatorPolicy(system_instructions="  ").validate()
    with pytest.raises(PolicyError):
        HermesOperatorPolicy(system_instructions="x" * (MAX_INSTRUCTIONS_BYTES + 1)).validate()
    HermesOperatorPolicy(system_instructions="x" * MAX_INSTRUCTIONS_BYTES).validate()

    mounted = tmp_path / "instructions.txt"
    mounted.write_text("Deployment rules: use AIP tools only.")
    policy = HermesOperatorPolicy.from_settings(Settings(hermes_operator_instructions_file=mounted))
    assert policy.system_instructions == "Deployment rules: use AIP tools only."
    for content in (b"", b"x" * (MAX_INSTRUCTIONS_BYTES + 1), b"\xff\xfe"):
        mounted.write_bytes(content)
        with pytest.raises(PolicyError):
            HermesOperatorPolicy.from_settings(Settings(hermes_operator_instructions_file=mounted))


def test_delegation_stays_disabled_without_both_explicit_allowlists() -> None:
    for caps, scopes in (((), ()), (("cap:support:",), ()), ((), ("support.",))):
        with pytest.raises(PolicyError, match="allowlists"):
            HermesOperatorPolicy(
                delegation_enabled=True, capability_prefixes=caps, scope_prefixes=scopes
            ).validate()
    policy = HermesOperatorPolicy(
        delegation_enabled=True, capability_prefixes=("cap:support:",), scope_prefixes=("*",)
    )
    policy.validate()
    assert policy.allows_capability("cap:support:case.get")
    assert not policy.allows_capability("cap:billing:refund")
    assert policy.allows_scope("anything")  # `*` is the explicit unrestricted opt-in


def test_empty_or_oversized_prefixes_are_rejected() -> None:
    for prefix in ("", "p" * 513):
        with pytest.raises(PolicyError, match="prefixes"):
            HermesOperatorPolicy(capability_prefixes=(prefix,)).validate()


async def test_policy_is_validated_again_before_each_run(
    harness: Harness, fake: FakeHermes
) -> None:
    harness.operation.policy = dataclasses.replace(harness.policy, poll_interval_ms=5)
    outcome, _ = await harness.run(harness.action(objective("anything")))

    assert error_code(outcome) == ErrorCode.OPERATOR_POLICY.value
    assert fake.stats().count("POST /v1/runs") == 0


async def test_provider_payload_is_the_governed_objective_with_deployment_choices(
    harness: Harness, fake: FakeHermes
) -> None:
    h = harness.with_policy(model="deployment/model-route", system_instructions="Govern it.")
    action = h.action(
        objective(
            "summarize case",
            context={"case_id": "case-1"},
            candidate_capabilities=["cap:support:case.get"],
            constraints={"allow_mutations": False},
        )
    )
    await h.run(action)

    (start,) = [r for r in fake.requests() if r.route == "POST /v1/runs"]
    body = start.body
    assert body["session_id"] == session_id_for(action.id) == f"aip-operator-{action.id}"
    assert body["instructions"] == "Govern it."
    assert body["model"] == "deployment/model-route"
    sent = json.loads(body["input"])
    assert sent == {
        "kind": "aip_operator_objective",
        "operator_action_id": action.id,
        "objective": "summarize case",
        "context": {"case_id": "case-1"},
        "candidate_capabilities": ["cap:support:case.get"],
        "constraints": {"allow_mutations": False},
    }
    headers = {name.lower(): value for name, value in start.headers.items()}
    assert headers["idempotency-key"] == action.idempotency_key  # trusted projection only


async def test_oversized_input_is_refused_before_a_binding_or_request(
    harness: Harness, fake: FakeHermes
) -> None:
    action = harness.action(objective("x" * 2_000_000))
    outcome, _ = await harness.run(action)

    assert error_code(outcome) == ErrorCode.CONFIGURATION_OR_INPUT.value
    assert await harness.binding(action.id) is None
    assert fake.stats().count("POST /v1/runs") == 0
