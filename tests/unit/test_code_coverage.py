"""Every code of the troubleshooting spec's tables is either one this worker emits
(`schemas.errors.ErrorCode`) or listed in docs/runbook.md's "Codes not applicable here"
table with its reason; and every emitted code has its row in the runbook.

The spec's list is copied here (spec/troubleshooting.md, "Diagnose trust and routing in
order", the host-code table, "Interpret provider failures", "Look up base connector
codes", "Resolve stream failures", "Resolve operator failures", "Resolve delegated-result
failures"), so the test does not depend on the spec being checked out beside the repo.
`connector_host.response_signing` is left out: signed responses bring it.
"""

from __future__ import annotations

import re
from pathlib import Path

from schemas.errors import ErrorCode

RUNBOOK = Path(__file__).parents[2] / "docs" / "runbook.md"
NOT_APPLICABLE_HEADING = "## Codes not applicable here"

SPEC_CODES = frozenset(
    {
        # Pre-envelope rejections.
        "schema.envelope.invalid",
        "envelope.decode.invalid",
        # Trust and routing, in order, and the common host codes.
        "connector_host.authentication",
        "connector_host.replay",
        "connector_host.route_mismatch",
        "connector_host.credential_revision_denied",
        "connector_host.credential_revision_unavailable",
        "connector_host.approval_authorization_conflict",
        "connector_host.approval_authorization_unavailable",
        "connector_host.not_ready",
        "connector_host.capacity",
        "connector_host.execution",
        # Base connector codes (and the provider-failure table).
        "connector.hermes_agent.configuration_or_input",
        "connector.hermes_agent.tenant_mismatch",
        "connector.hermes_agent.missing_credential",
        "connector.hermes_agent.authentication",
        "connector.hermes_agent.remote_temporary",
        "connector.hermes_agent.remote_rejected",
        "connector.hermes_agent.transport",
        "connector.hermes_agent.stream_publication",
        "connector.hermes_agent.cancelled",
        "connector.hermes_agent.deadline_exceeded",
        "connector.hermes_agent.operator_outcome_unknown",
        "connector.hermes_agent.operator_state",
        "connector.hermes_agent.operator_policy",
        "connector.hermes_agent.error",
        # Stream results.
        "connector.hermes_agent.stream_truncated",
        "connector.hermes_agent.stream_incomplete",
        "connector.hermes_agent.stream_failed",
        # Operator results.
        "connector.hermes_agent.operator_start_rejected",
        "connector.hermes_agent.operator_failed",
        "connector.hermes_agent.approval_outcome_unknown",
        "connector.hermes_agent.cancellation_outcome_unknown",
        # Delegated results.
        "connector.hermes_agent.delegated_result_not_ready",
        "connector.hermes_agent.delegated_execution_not_observed",
        "connector.hermes_agent.delegated_action_contract_mismatch",
        "connector.hermes_agent.delegated_identity_unverified",
        "connector.hermes_agent.delegated_identity_mismatch",
        "connector.hermes_agent.delegated_identity_integrity",
        "connector.hermes_agent.delegated_tenant_mismatch",
        "connector.hermes_agent.delegated_tenant_expired",
        "connector.hermes_agent.delegated_result_integrity",
        "connector.hermes_agent.delegated_result_resolver_missing",
    }
)
EMITTED = frozenset(code.value for code in ErrorCode)
_ROW = re.compile(r"^\| `(?P<code>[a-z_.]+)` \| (?P<reason>.*) \|$")


def _not_applicable() -> dict[str, str]:
    """The runbook's not-applicable table: code -> reason."""
    text = RUNBOOK.read_text(encoding="utf-8")
    assert NOT_APPLICABLE_HEADING in text
    section = text.split(NOT_APPLICABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match is not None:
            rows[match["code"]] = match["reason"].strip()
    return rows


def test_every_spec_code_is_emitted_or_listed_as_not_applicable() -> None:
    accounted = EMITTED | set(_not_applicable())
    assert sorted(SPEC_CODES - accounted) == []


def test_a_not_applicable_code_is_not_also_emitted_and_says_why() -> None:
    not_applicable = _not_applicable()
    assert not_applicable, "the runbook's not-applicable table has no rows"
    assert sorted(set(not_applicable) & EMITTED) == []
    assert sorted(set(not_applicable) - SPEC_CODES) == []
    for code, reason in not_applicable.items():
        assert len(reason) > 40, code


def test_every_emitted_code_has_a_runbook_row() -> None:
    text = RUNBOOK.read_text(encoding="utf-8").split(NOT_APPLICABLE_HEADING, 1)[0]
    rows = {
        code
        for line in text.splitlines()
        if line.startswith("| `")
        for code in re.findall(r"`([a-z_]+\.[a-z_.]+)`", line.split(" | ", 1)[0])
    }
    assert sorted(EMITTED - rows) == []



ROOT = Path(__file__).parents[2]
#: Where ErrorCode is defined: a reference there is the definition, not an emission.
DEFINITION = ROOT / "schemas" / "errors.py"


def _sources(*folders: str) -> str:
    """Every Python source under `folders`, except the definition and this file (whose
    spec list names every code)."""
    skip = {DEFINITION.resolve(), Path(__file__).resolve()}
    return "\n".join(
        path.read_text(encoding="utf-8")
        for folder in folders
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.resolve() not in skip
    )


def _unreferenced(text: str) -> list[str]:
    """The codes `text` names neither as `ErrorCode.NAME` nor as their quoted value."""
    return sorted(
        code.value
        for code in ErrorCode
        if f"ErrorCode.{code.name}" not in text
        and re.search(rf"[\"'`]{re.escape(code.value)}[\"'`]", text) is None
    )


def test_every_emitted_code_is_raised_by_the_worker_and_exercised_by_a_test() -> None:
    """The tests above only see that a code is *defined*; one defined but never emitted
    would pass them. Each must be referenced in the code that emits it (worker/, and the
    shared decoder in schemas/) and in tests/, where a path emitting it is checked."""
    assert _unreferenced(_sources("worker", "schemas")) == []
    assert _unreferenced(_sources("tests")) == []
