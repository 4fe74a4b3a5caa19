"""The conformance report: pytest outcomes of the family-tagged tests in, the 13 checks of
upstream's connector kit out (shared/reference/aip-1.0-wire.md §5.1 rules, §5.2 shape).

Why the rules are copied exactly: a check's `name`, `passed` and `detail` are the part a
reader compares with another connector's run of the kit, so the pass, fail and
not-applicable details are printed in upstream's formats (its `{:?}` of a list of ids is
`["a", "b"]`). Everything this project adds (which test proved which assertion, against
which Hermes) sits in `evidence`, beside them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from worker.conformance.families import (
    ADMISSION_CHECK,
    BEHAVIOR_PREFIX,
    DETERMINISTIC,
    FAMILIES,
    LIVE,
    UPSTREAM_COMMIT,
    why_required,
)

Provider = Literal["deterministic", "live"]
Outcome = Literal["passed", "failed", "skipped"]
#: Where a test's Hermes was: the project's fake 0.19.0 double or a real hermes-agent 0.19.0.
HermesKind = Literal["fake", "real"]

ARTIFACT_PREFIX: Final = "test://aip-hermes-worker"
#: Why a family nothing requires is not applicable (upstream's Hermes wording where it has one).
NOT_APPLICABLE: Final[Mapping[str, str]] = {
    "transaction_lifecycle": "the manifest declares no transaction contract or compensation "
    "operation",
    "webhook_security": "the connector publishes no inbound webhook profile",
}


@dataclass(frozen=True, slots=True)
class Tag:
    """One `@pytest.mark.aip_family(family, assertions=[...])` of a test."""

    family: str
    assertions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """What one tagged pytest node did: its id, result, Hermes and the ids it recorded."""

    nodeid: str
    outcome: Outcome
    hermes: HermesKind
    tags: tuple[Tag, ...]
    #: Ids the test recorded with `record_property("aip_artifact", id)` (Action ids, …).
    recorded: tuple[str, ...] = ()

    @property
    def ran(self) -> bool:
        return self.outcome != "skipped"


@dataclass(slots=True)
class _Family:
    family: str
    nodes: list[NodeOutcome] = field(default_factory=list)

    def proving(self, assertion: str) -> list[NodeOutcome]:
        return [
            n
            for n in self.nodes
            if n.ran and any(t.family == self.family and assertion in t.assertions for t in n.tags)
        ]


def rust_list(ids: Sequence[str]) -> str:
    """A list of ids as upstream's `{:?}` prints a `Vec<&str>`."""
    return "[" + ", ".join(f'"{i}"' for i in ids) + "]"


def _source(provider: Provider, family: _Family) -> str:
    """`IsolatedLiveProvider` only when every required assertion passed on a real Hermes."""
    if provider == "deterministic":
        return DETERMINISTIC
    live = all(
        any(n.outcome == "passed" and n.hermes == "real" for n in family.proving(a))
        for a in FAMILIES[family.family]
    )
    return LIVE if live else DETERMINISTIC


def _free_detail(provider: Provider, family: _Family) -> str:
    if provider == "deterministic":
        return "pytest outcomes of the tagged tests against the fake Hermes 0.19.0 double"
    double_only = [
        a
        for a in FAMILIES[family.family]
        if family.proving(a) and not any(n.hermes == "real" for n in family.proving(a))
    ]
    text = (
        "pytest outcomes of the tagged tests, on real Hermes 0.19.0 where a test has a real variant"
    )
    return (
        f"{text}; only on the fake Hermes double: {','.join(double_only)}" if double_only else text
    )


def _behavior_check(
    manifest: Mapping[str, Any], provider: Provider, family: _Family
) -> dict[str, Any]:
    name = BEHAVIOR_PREFIX + family.family
    required_ids = FAMILIES[family.family]
    required = why_required(manifest, family.family)
    ran = [n for n in family.nodes if n.ran]
    node_rows = [
        {
            "nodeid": n.nodeid,
            "outcome": n.outcome,
            "hermes": n.hermes,
            "assertions": sorted(
                {a for t in n.tags if t.family == family.family for a in t.assertions}
            ),
        }
        for n in family.nodes
    ]
    if not ran:
        why = NOT_APPLICABLE.get(family.family, "no capability of the manifest requires it")
        if family.nodes:
            why = "every tagged test was skipped"
        elif required is not None:
            why = "no test of this project is tagged with this family"
        passed = required is None
        detail = (
            f"not applicable: {why}"
            if passed
            else f"published connector contract requires this scenario: {why}"
        )
        evidence: dict[str, Any] = {
            "executed": False,
            "source": DETERMINISTIC,
            "assertions": {},
            "artifacts": [],
            "detail": why,
        }
        return {
            "name": name,
            "passed": passed,
            "detail": detail,
            "required_because": required,
            "evidence": {**evidence, "nodes": node_rows},
        }
    assertions = {
        a: all(n.outcome == "passed" for n in family.proving(a))
        for a in required_ids
        if family.proving(a)
    }
    artifacts = [n.nodeid for n in ran] + [
        f"{ARTIFACT_PREFIX}/{family.family}/{r}" for n in ran for r in n.recorded
    ]
    source = _source(provider, family)
    free = _free_detail(provider, family)
    missing = [a for a in required_ids if a not in assertions]
    failed = [a for a in required_ids if assertions.get(a) is False]
    artifacts_valid = bool(artifacts) and all(a.strip() for a in artifacts)
    passed = not missing and not failed and artifacts_valid
    detail = (
        f"{source}; artifacts={','.join(artifacts)}; {free}"
        if passed
        else (
            f"missing={rust_list(missing)}; failed={rust_list(failed)}; "
            f"artifacts_valid={str(artifacts_valid).lower()}; {free}"
        )
    )
    return {
        "name": name,
        "passed": passed,
        "detail": detail,
        "required_because": required,
        "evidence": {
            "executed": True,
            "source": source,
            "assertions": assertions,
            "artifacts": artifacts,
            "detail": free,
            "nodes": node_rows,
        },
    }


def build_report(
    *,
    manifest: Mapping[str, Any],
    manifest_digest: str,
    connector_id: str,
    admission_issues: Sequence[str],
    provider: Provider,
    outcomes: Iterable[NodeOutcome],
) -> dict[str, Any]:
    """The whole report: admission first, then the twelve families in the kit's order."""
    families = {f: _Family(f) for f in FAMILIES}
    # Sorted: xdist reports nodes in finishing order, and a retained report should not
    # change with it.
    for node in sorted(outcomes, key=lambda n: n.nodeid):
        for family in {t.family for t in node.tags}:
            families[family].nodes.append(node)
    admission = {
        "name": ADMISSION_CHECK,
        "passed": not admission_issues,
        "detail": connector_id if not admission_issues else "; ".join(admission_issues),
        "evidence": {
            "capabilities": len(manifest.get("capabilities") or []),
            "issues": list(admission_issues),
        },
    }
    checks = [admission] + [_behavior_check(manifest, provider, families[f]) for f in FAMILIES]
    return {
        "report": "aip-connector-conformance",
        "upstream": {
            "repository": "getaip/core",
            "commit": UPSTREAM_COMMIT,
            "kit": "crates/aip-conformance/src/lib.rs",
        },
        "connector_id": connector_id,
        "provider": provider,
        "manifest_digest": manifest_digest,
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
    }
