"""The conformance report builder (worker/conformance/report.py) against upstream's rules
(shared/reference/aip-1.0-wire.md §5.1): node outcomes in, the 13 checks out, with upstream's
names and detail formats; plus the committed reports (docs/conformance/*/conformance.json)
name only test nodes that exist, so a renamed or deleted test cannot leave a report citing
it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from worker.conformance.admission import admit
from worker.conformance.families import FAMILIES
from worker.conformance.report import NodeOutcome, Tag, build_report
from worker.operations.base import Registry

ROOT = Path(__file__).resolve().parents[2]
REPORTS = sorted((ROOT / "docs" / "conformance").glob("*/conformance.json"))
UPSTREAM_ORDER = [
    "connector.atomic_manifest_admission",
    "connector.behavior.identity_credentials",
    "connector.behavior.schema_enforcement",
    "connector.behavior.idempotency_duplicates",
    "connector.behavior.retry_exhaustion",
    "connector.behavior.cancellation_races",
    "connector.behavior.streaming_backpressure",
    "connector.behavior.errors_uncertain_outcomes",
    "connector.behavior.approval_lifecycle",
    "connector.behavior.transaction_lifecycle",
    "connector.behavior.audit_redaction",
    "connector.behavior.webhook_security",
    "connector.behavior.restart_reconnect",
]


def _contract(**execution: bool) -> dict[str, Any]:
    flags = {
        "supports_sync": True,
        "supports_async": False,
        "supports_streaming": False,
        "supports_cancel": False,
        "supports_retry": False,
    }
    return {
        "side_effects": ["read"],
        "idempotency": {"requirement": "optional"},
        "execution": {**flags, **execution},
    }


#: A manifest whose one capability requires the five always-required families and retry.
MANIFEST = {
    "manifest_version": "aip-manifest/v1",
    "profiles": ["aip.native.nats.v1"],
    "capabilities": [
        {"id": "cap:x:models", "name": "models", "contract": _contract(supports_retry=True)}
    ],
}


def _node(nodeid: str, outcome: str, family: str, *assertions: str, **kw: Any) -> NodeOutcome:
    return NodeOutcome(nodeid, outcome, kw.get("hermes", "fake"), (Tag(family, assertions),))  # type: ignore[arg-type]


def _report(*nodes: NodeOutcome, provider: str = "deterministic") -> dict[str, Any]:
    return build_report(
        manifest=MANIFEST,
        manifest_digest="sha256:00",
        connector_id="hermes-agent",
        admission_issues=[],
        provider=provider,  # type: ignore[arg-type]
        outcomes=nodes,
    )


def _check(report: dict[str, Any], family: str) -> dict[str, Any]:
    (check,) = [c for c in report["checks"] if c["name"] == f"connector.behavior.{family}"]
    return check


def test_the_report_has_upstreams_thirteen_checks_in_order() -> None:
    report = _report()
    assert [c["name"] for c in report["checks"]] == UPSTREAM_ORDER
    assert report["checks"][0] == {
        "name": "connector.atomic_manifest_admission",
        "passed": True,
        "detail": "hermes-agent",
        "evidence": {"capabilities": 1, "issues": []},
    }


def test_a_family_whose_every_assertion_passed_prints_the_source_and_artifacts() -> None:
    report = _report(
        _node("t.py::a", "passed", "schema_enforcement", "invalid_input_rejected"),
        _node("t.py::b", "passed", "schema_enforcement", "invalid_output_rejected"),
    )
    check = _check(report, "schema_enforcement")
    assert check["passed"] is True
    assert check["detail"] == (
        "DeterministicProviderDouble; artifacts=t.py::a,t.py::b; "
        "pytest outcomes of the tagged tests against the fake Hermes 0.19.0 double"
    )
    evidence = check["evidence"]
    assert evidence["executed"] is True
    assert evidence["source"] == "DeterministicProviderDouble"
    assert evidence["assertions"] == {
        "invalid_input_rejected": True,
        "invalid_output_rejected": True,
    }


def test_a_failed_test_fails_its_assertion_and_a_missing_one_is_named() -> None:
    report = _report(
        _node("t.py::ok", "passed", "retry_exhaustion", "retryable_error_preserved"),
        _node("t.py::also", "passed", "retry_exhaustion", "backoff_observed"),
        _node("t.py::broken", "failed", "retry_exhaustion", "backoff_observed"),
    )
    check = _check(report, "retry_exhaustion")
    assert check["passed"] is False
    assert check["detail"] == (
        'missing=["exhaustion_dead_lettered"]; failed=["backoff_observed"]; '
        "artifacts_valid=true; pytest outcomes of the tagged tests against the fake Hermes "
        "0.19.0 double"
    )
    assert check["evidence"]["assertions"] == {
        "retryable_error_preserved": True,
        "backoff_observed": False,
    }
    assert report["passed"] is False


def test_skipped_tests_prove_nothing() -> None:
    check = _check(
        _report(_node("t.py::s", "skipped", "identity_credentials", "tenant_isolated")),
        "identity_credentials",
    )
    assert check["passed"] is False
    assert check["detail"] == (
        "published connector contract requires this scenario: every tagged test was skipped"
    )


def test_only_a_family_the_manifest_does_not_require_is_not_applicable() -> None:
    report = _report()
    assert _check(report, "transaction_lifecycle")["detail"] == (
        "not applicable: the manifest declares no transaction contract or compensation operation"
    )
    assert _check(report, "webhook_security")["passed"] is True
    assert _check(report, "cancellation_races") == {
        "name": "connector.behavior.cancellation_races",
        "passed": True,
        "detail": "not applicable: no capability of the manifest requires it",
        "required_because": None,
        "evidence": {
            "executed": False,
            "source": "DeterministicProviderDouble",
            "assertions": {},
            "artifacts": [],
            "detail": "no capability of the manifest requires it",
            "nodes": [],
        },
    }
    retry = _check(report, "retry_exhaustion")
    assert (retry["passed"], retry["required_because"]) == (False, "a contract supports retry")
    assert retry["detail"] == (
        "published connector contract requires this scenario: "
        "no test of this project is tagged with this family"
    )


def test_live_is_claimed_only_when_every_assertion_passed_on_real_hermes() -> None:
    both = _report(
        _node(
            "t.py::a[real]", "passed", "schema_enforcement", "invalid_input_rejected", hermes="real"
        ),
        _node("t.py::b[fake]", "passed", "schema_enforcement", "invalid_output_rejected"),
        _node(
            "t.py::b[real]",
            "passed",
            "schema_enforcement",
            "invalid_output_rejected",
            hermes="real",
        ),
        provider="live",
    )
    assert _check(both, "schema_enforcement")["detail"].startswith("IsolatedLiveProvider; ")
    half = _report(
        _node(
            "t.py::a[real]", "passed", "schema_enforcement", "invalid_input_rejected", hermes="real"
        ),
        _node("t.py::b", "passed", "schema_enforcement", "invalid_output_rejected"),
        provider="live",
    )
    check = _check(half, "schema_enforcement")
    assert check["evidence"]["source"] == "DeterministicProviderDouble"
    assert check["detail"].endswith("only on the fake Hermes double: invalid_output_rejected")


def test_recorded_ids_become_artifacts_of_the_family() -> None:
    node = NodeOutcome(
        "t.py::a", "passed", "fake", (Tag("schema_enforcement", ("invalid_input_rejected",)),),
        recorded=("act_1",),
    )  # fmt: skip
    check = _check(_report(node), "schema_enforcement")
    assert check["evidence"]["artifacts"] == [
        "t.py::a",
        "test://aip-hermes-worker/schema_enforcement/act_1",
    ]


def test_admission_names_a_claim_the_registry_does_not_back() -> None:
    from worker.operations.registry import default_registry

    registry: Registry = default_registry()
    manifest = {
        **MANIFEST,
        "capabilities": [
            {
                "id": "cap:x:models",
                "name": "models",
                "kind": "tool",
                "input_schema": {"type": "object"},
                "bindings": [{"profile": "aip.native.nats.v1"}, {"profile": "other"}],
                "contract": _contract(supports_streaming=True, supports_retry=True),
            },
            {"id": "cap:x:nothing", "name": "nothing", "kind": "tool", "input_schema": True},
        ],
    }
    issues = [str(i) for i in admit(manifest, registry, compile_schema=lambda _: None)]
    assert issues == [
        "manifest.binding.profile_undeclared at /capabilities/0/bindings/1/profile: "
        "other undeclared",
        "implementation.claim_unsupported at /capabilities/0: capability claims `streaming` "
        "but its implementation does not support it",
        "implementation.missing at /capabilities/1: no registered implementation",
    ]


@pytest.mark.parametrize("report", REPORTS, ids=[p.parent.name for p in REPORTS])
def test_a_committed_report_names_only_existing_test_nodes(report: Path) -> None:
    document = json.loads(report.read_text())
    assert [c["name"] for c in document["checks"]] == UPSTREAM_ORDER
    for check in document["checks"][1:]:
        family = check["name"].removeprefix("connector.behavior.")
        assert set(check["evidence"]["assertions"]) <= set(FAMILIES[family])
        for node in check["evidence"]["nodes"]:
            path, _, name = node["nodeid"].partition("::")
            function = re.sub(r"\[.*\]$", "", name)
            source = (ROOT / path).read_text()
            assert re.search(rf"^(async )?def {function}\(", source, re.M), node["nodeid"]
            assert "aip_family" in source, node["nodeid"]


def test_reports_are_committed() -> None:
    assert [p.parent.name for p in REPORTS] == ["deterministic", "live"]
