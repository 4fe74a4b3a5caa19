"""The vocabulary of the connector conformance report, as upstream's kit names it
(shared/reference/aip-1.0-wire.md §5.1, `crates/aip-conformance/src/lib.rs@82c3354`): the
twelve behaviour families in the kit's order, the assertion ids each requires, the two
evidence sources, and which families a manifest makes required.

Why a module of its own: the pytest marker (tests tag themselves with a family and its
assertion ids), the report builder and the manifest rules must all spell these names
byte-identically to upstream, or a report could not be compared with another connector's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from worker.errors import UnknownFamily

#: The upstream commit the names, rules and detail formats were taken from.
UPSTREAM_COMMIT: Final = "82c335499d0b40e17973ce92bf3a112fc5737080"
ADMISSION_CHECK: Final = "connector.atomic_manifest_admission"
BEHAVIOR_PREFIX: Final = "connector.behavior."

#: The evidence sources (`ConnectorEvidenceSource`), printed as upstream's variant names.
DETERMINISTIC: Final = "DeterministicProviderDouble"
LIVE: Final = "IsolatedLiveProvider"

#: family id → its required assertion ids, in the kit's order.
FAMILIES: Final[Mapping[str, tuple[str, ...]]] = {
    "identity_credentials": (
        "transport_actor_bound",
        "tenant_isolated",
        "credential_handle_opaque",
    ),
    "schema_enforcement": ("invalid_input_rejected", "invalid_output_rejected"),
    "idempotency_duplicates": ("duplicate_suppressed", "collision_rejected", "delivery_id_stable"),
    "retry_exhaustion": (
        "retryable_error_preserved",
        "backoff_observed",
        "exhaustion_dead_lettered",
    ),
    "cancellation_races": (
        "before_dispatch_cancelled",
        "in_flight_cancelled",
        "late_cancel_preserved_terminal",
    ),
    "streaming_backpressure": ("ordered_chunks", "bounded_backpressure", "terminal_chunk_unique"),
    "errors_uncertain_outcomes": (
        "protocol_fields_preserved",
        "uncertain_outcome_reconciled",
        "error_secrets_redacted",
    ),
    "approval_lifecycle": (
        "authority_verified",
        "quorum_enforced",
        "evidence_persisted",
        "resume_once",
    ),
    "transaction_lifecycle": (
        "plan_before_commit",
        "provider_operation_checkpointed",
        "reconcile_before_retry",
        "compensation_governed",
    ),
    "audit_redaction": (
        "receipts_emitted",
        "audit_correlated",
        "sensitive_fields_redacted",
        "raw_secret_absent",
    ),
    "webhook_security": ("signature_verified", "skew_rejected", "replay_rejected"),
    "restart_reconnect": (
        "state_recovered",
        "duplicate_effect_prevented",
        "reconnect_cursor_resumed",
    ),
}

#: Upstream's webhook profile id (`aip_profile_webhook::PROFILE_ID@e6222fc`).
WEBHOOK_PROFILE: Final = "aip.http.webhook.v1"
#: Families every manifest with a capability requires.
ALWAYS: Final = frozenset(
    {
        "identity_credentials",
        "schema_enforcement",
        "errors_uncertain_outcomes",
        "audit_redaction",
        "restart_reconnect",
    }
)


def check_tag(family: str, assertions: tuple[str, ...]) -> None:
    """Raise UnknownFamily unless `family` and every one of `assertions` are the kit's."""
    if family not in FAMILIES:
        raise UnknownFamily(f"unknown AIP conformance family {family!r}")
    unknown = [a for a in assertions if a not in FAMILIES[family]]
    if unknown or not assertions:
        raise UnknownFamily(f"family {family!r} has no assertion ids {unknown or '(none given)'}")


def why_required(manifest: Mapping[str, Any], family: str) -> str | None:
    """What in the manifest requires `family` (upstream's `connector_scenario_required`), or
    None when nothing does and the family may be not applicable."""
    capabilities = manifest.get("capabilities") or []
    contracts = [c["contract"] for c in capabilities if c.get("contract")]
    if family in ALWAYS:
        return "the manifest has capabilities" if capabilities else None
    if family == "webhook_security":
        return (
            "the manifest declares the webhook profile"
            if WEBHOOK_PROFILE in (manifest.get("profiles") or [])
            else None
        )
    rules: dict[str, tuple[str, Any]] = {
        "idempotency_duplicates": (
            "a contract requires idempotency",
            lambda t: t["idempotency"]["requirement"] == "required",
        ),
        "retry_exhaustion": (
            "a contract supports retry",
            lambda t: t["execution"]["supports_retry"],
        ),
        "cancellation_races": (
            "a contract supports cancel",
            lambda t: t["execution"]["supports_cancel"],
        ),
        "streaming_backpressure": (
            "a contract supports streaming",
            lambda t: t["execution"]["supports_streaming"],
        ),
        "approval_lifecycle": (
            "a contract requires approval",
            lambda t: bool((t.get("approval") or {}).get("required")),
        ),
        "transaction_lifecycle": (
            "a contract has a transaction object",
            lambda t: t.get("transaction") is not None,
        ),
    }
    reason, rule = rules[family]
    return reason if any(rule(terms) for terms in contracts) else None
