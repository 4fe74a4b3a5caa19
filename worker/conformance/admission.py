"""`connector.atomic_manifest_admission`: the whole manifest checked in one step, the way
upstream's discovery service admits a connector's manifest (`DiscoveryService::admit_manifest`
in `crates/aip-discovery@82c3354`, shared/reference/aip-1.0-wire.md §1.14 and §5.1), with
each capability's implementation support read off the operation the runtime registered for it.

Why: a manifest can promise what the runtime does not do (a streaming or cancellable contract
on an operation that never streams, an approval the gate does not hold). Admission compares
the published contract with the registry that serves it, so the report's first check fails
when the two drift, and names every issue at once rather than the first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from worker.operations.base import OperationSpec, Registry


@dataclass(frozen=True, slots=True)
class Support:
    """What the implementation behind one capability does (upstream's
    `CapabilityImplementationSupport`), derived from its registered OperationSpec."""

    invocation: bool
    cancellation: bool
    streaming: bool
    retry: bool
    transaction: bool
    reconciliation: bool
    compensation: bool
    approval: bool
    credentials: bool


def support_of(spec: OperationSpec) -> Support:
    """The runtime's facts for one registered operation: every execution runs as a task the
    pipeline cancels on a cancel intent (worker/pipeline), streams only where the spec
    streams, is retried only under the read retry policy (worker/operations/retry.py, reads
    only), passes the approval gate when the spec requires approval, and reads its Hermes key
    from the endpoint's key file (a handle, never a value). No transaction, reconciliation
    or compensation operation exists."""
    return Support(
        invocation=True,
        cancellation=True,
        streaming=spec.streaming,
        retry=spec.read_only,
        transaction=False,
        reconciliation=False,
        compensation=False,
        approval=spec.approval_required,
        credentials=True,
    )


@dataclass(frozen=True, slots=True)
class Issue:
    """One admission issue, printed as upstream prints it: `code at path: message`."""

    code: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.code} at {self.path}: {self.message}"


def _duplicates(values: list[Any]) -> bool:
    return len({repr(v) for v in values}) != len(values)


def _structure(manifest: Mapping[str, Any], issues: list[Issue]) -> None:
    if not str(manifest.get("manifest_version") or "").strip():
        issues.append(Issue("manifest.version.empty", "/manifest_version", "must not be empty"))
    profiles = list(manifest.get("profiles") or [])
    if not profiles:
        issues.append(Issue("manifest.profiles.empty", "/profiles", "one profile is required"))
    if _duplicates(profiles):
        issues.append(Issue("manifest.profile.duplicate", "/profiles", "profiles repeat"))
    seen: set[str] = set()
    for index, capability in enumerate(manifest.get("capabilities") or []):
        path = f"/capabilities/{index}"
        if capability["id"] in seen:
            issues.append(Issue("manifest.capability.duplicate", f"{path}/id", "id repeats"))
        seen.add(capability["id"])
        if not str(capability.get("name") or "").strip():
            issues.append(Issue("manifest.capability.name_empty", f"{path}/name", "empty name"))
        _contract(capability.get("contract"), f"{path}/contract", issues)


def _contract(terms: Mapping[str, Any] | None, path: str, issues: list[Issue]) -> None:
    if terms is None:
        return
    execution = terms["execution"]
    if not (
        execution["supports_sync"] or execution["supports_async"] or execution["supports_streaming"]
    ):
        issues.append(
            Issue("contract.execution.no_completion_mode", f"{path}/execution", "no mode")
        )
    if _duplicates(list(terms["side_effects"])):
        issues.append(Issue("contract.side_effect.duplicate", f"{path}/side_effects", "repeat"))
    if terms["idempotency"].get("ttl_ms") == 0:
        issues.append(Issue("contract.idempotency.invalid_ttl", f"{path}/idempotency", "ttl 0"))
    approval = terms.get("approval")
    if approval is not None and approval.get("minimum_distinct_principals", 1) == 0:
        issues.append(
            Issue(
                "contract.approval.invalid_distinct_principals",
                f"{path}/approval/minimum_distinct_principals",
                "must be greater than zero",
            )
        )
    compensation = terms.get("compensation")
    if (
        compensation is not None
        and compensation["mode"] == "supported"
        and not compensation.get("compensation_capability_id")
    ):
        issues.append(
            Issue(
                "contract.compensation.capability_missing",
                f"{path}/compensation",
                "supported compensation needs a compensation capability id",
            )
        )


def _remote_refs(schema: Any) -> list[str]:
    """Every `$ref` that is not a fragment of the schema itself (upstream forbids them)."""
    found: list[str] = []
    pending = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                found.append(ref)
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found


def _schemas(
    manifest: Mapping[str, Any], compile_schema: Callable[[Any], None], issues: list[Issue]
) -> None:
    for index, capability in enumerate(manifest.get("capabilities") or []):
        for key in ("input_schema", "output_schema"):
            schema = capability.get(key)
            if schema is None:
                continue
            path = f"/capabilities/{index}/{key}"
            if not isinstance(schema, (dict, bool)):
                issues.append(Issue("schema.invalid_root", path, "not an object or boolean"))
                continue
            for ref in _remote_refs(schema):
                issues.append(
                    Issue("schema.remote_reference_forbidden", path, f"reference `{ref}`")
                )
            try:
                compile_schema(schema)
            except Exception as exc:  # the validator's own error type varies by library
                issues.append(Issue("schema.compile_failed", path, str(exc).splitlines()[0]))


def _bindings(manifest: Mapping[str, Any], issues: list[Issue]) -> None:
    declared = set(manifest.get("profiles") or [])
    for index, capability in enumerate(manifest.get("capabilities") or []):
        profiles = [binding["profile"] for binding in capability.get("bindings") or []]
        for number, profile in enumerate(profiles):
            path = f"/capabilities/{index}/bindings/{number}/profile"
            if profiles.count(profile) > 1:
                issues.append(Issue("manifest.binding.duplicate", path, f"{profile} twice"))
            if profile not in declared:
                issues.append(
                    Issue("manifest.binding.profile_undeclared", path, f"{profile} undeclared")
                )


#: contract claim → the Support field that must back it.
_CLAIMS: tuple[tuple[str, Callable[[Mapping[str, Any]], bool]], ...] = (
    ("cancellation", lambda t: bool(t["execution"]["supports_cancel"])),
    ("streaming", lambda t: bool(t["execution"]["supports_streaming"])),
    ("retry", lambda t: bool(t["execution"]["supports_retry"])),
    ("transaction", lambda t: t.get("transaction") is not None),
    (
        "reconciliation",
        lambda t: "reconcile" in ((t.get("transaction") or {}).get("supported_modes") or []),
    ),
    ("compensation", lambda t: (t.get("compensation") or {}).get("mode") == "supported"),
    ("approval", lambda t: bool((t.get("approval") or {}).get("required"))),
    ("credentials", lambda t: bool((t.get("credentials") or {}).get("required"))),
)


def _implementation(manifest: Mapping[str, Any], registry: Registry, issues: list[Issue]) -> None:
    for index, capability in enumerate(manifest.get("capabilities") or []):
        path = f"/capabilities/{index}"
        operation = registry.operations.get(capability["name"])
        if operation is None:
            if capability.get("kind") != "resource":
                issues.append(Issue("implementation.missing", path, "no registered implementation"))
            continue
        support = support_of(operation.spec)
        terms = capability.get("contract")
        if terms is None:
            continue
        for claim, claimed in _CLAIMS:
            if claimed(terms) and not getattr(support, claim):
                issues.append(
                    Issue(
                        "implementation.claim_unsupported",
                        path,
                        f"capability claims `{claim}` but its implementation does not support it",
                    )
                )


def admit(
    manifest: Mapping[str, Any],
    registry: Registry,
    *,
    compile_schema: Callable[[Any], None],
) -> list[Issue]:
    """Every issue of `manifest` against the rules and the registry serving it; empty when
    the manifest is admitted. `compile_schema` raises for a JSON Schema that does not compile
    (Draft 2020-12, as upstream compiles them)."""
    issues: list[Issue] = []
    _structure(manifest, issues)
    _schemas(manifest, compile_schema, issues)
    _bindings(manifest, issues)
    _implementation(manifest, registry, issues)
    return issues
