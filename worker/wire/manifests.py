"""The manifest subject's wire: an AIP `aip.discovery.v1.manifest_request` Envelope in, a
signed `aip.discovery.v1.manifest_response` Envelope (body key `manifest`) out
(shared/reference/aip-1.0-wire.md §1.14, §4.2 to §4.4, §7.11; docs/publishing.md "Manifest").

Each capability is built from the operation's spec (its input type and description) and its
catalog row (worker/operations/catalog.py: kind, risk, stability, approval and the whole
CapabilityContract), so the manifest says what the runtime enforces. The manifest-level
values follow the reference connector's (§4.3) with this project's binding: the native NATS
profile (its actions subject in `compatibility.native_nats.subject`, as the conformance rule
asks) and the connector profile; `agent` is the Principal the worker signs as, the one a
connector host binds a manifest's agent to. Our facts with no AIP field (the worker version,
when the tenant binding expires, whether a shared endpoint admits several tenants) go in the
manifest's `extensions["org.aip-hermes-worker"]`, under the same signature.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from schemas.aip.common import Principal
from schemas.aip.manifest import Capability, Manifest, ManifestFilter, ManifestRequest
from schemas.aip.messages import open_body
from schemas.errors import BodyError, EnvelopeRejected, ErrorCode, ProtocolError
from schemas.ids import json_schema
from worker.aip.signing import AipSigner
from worker.operations.base import OperationSpec
from worker.operations.catalog import BY_NAME, CONNECTOR_ID, CONNECTOR_PROFILE, contract
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    EXTENSION_KEY,
    Opened,
    open_envelope,
    seal,
)
from worker.wire.results import error_to_aip, worker_principal

MANIFEST_REQUEST_TYPE: Final = "aip.discovery.v1.manifest_request"
MANIFEST_RESPONSE_TYPE: Final = "aip.discovery.v1.manifest_response"
ERROR_TYPE: Final = "aip.core.v1.error"
MANIFEST_VERSION: Final = "aip-manifest/v1"
NATIVE_NATS_PROFILE: Final = "aip.native.nats.v1"
PROFILES: Final = (NATIVE_NATS_PROFILE, CONNECTOR_PROFILE)
#: The pinned Hermes API server this connector drives.
HERMES_API: Final = "hermes-agent api_server 0.19.0"
#: How Hermes authenticates this worker (none for `health`, Hermes' one unprotected route).
BEARER_AUTH: Final = {"scheme": "bearer", "source": "endpoint.api_key"}


@dataclass(frozen=True, slots=True)
class EndpointFacts:
    """What the manifest of one endpoint says beyond its capabilities."""

    endpoint_id: str
    #: `aip.hermes.{endpoint}.actions`: where Actions for it are published.
    actions_subject: str
    worker_version: str
    tenant_id: str | None = None
    tenant_expires_at_unix_ms: int | None = None
    shared: bool = False
    max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
    #: How long this deployment replays a result for a repeated key (`AIPD_RESULT_TTL_MS`
    #: or the idempotency TTL): the `ttl_ms` of every required idempotency; None keeps the
    #: catalog's (the reference connector's 24 h).
    idempotency_ttl_ms: int | None = None


def capability_id_of(endpoint_id: str, name: str) -> str:
    return f"cap:hermes_agent:{endpoint_id}:{name}"


def input_schema_of(input_type: Any) -> dict[str, Any]:
    """The JSON Schema of an operation's input with its object at the root (AIP wants an
    object schema, §1.14): msgspec's `$ref` to the root definition is inlined, the nested
    definitions stay under `$defs`."""
    schema = dict(json_schema(input_type))
    ref = schema.pop("$ref", None)
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        schema = {**schema["$defs"][ref.removeprefix("#/$defs/")], **schema}
    return schema


def capability_of(
    spec: OperationSpec, endpoint_id: str, *, idempotency_ttl_ms: int | None = None
) -> Capability:
    """The AIP Capability of one operation on one endpoint; KeyError for an operation the
    catalog does not hold (it would have no contract to publish)."""
    row = BY_NAME[spec.name]
    terms = contract(row)
    if idempotency_ttl_ms is not None and terms.idempotency.requirement == "required":
        idempotency = msgspec.structs.replace(terms.idempotency, ttl_ms=idempotency_ttl_ms)
        terms = msgspec.structs.replace(terms, idempotency=idempotency)
    output_schema = spec.contract.output_schema if spec.contract is not None else None
    return Capability(
        id=capability_id_of(endpoint_id, spec.name),
        name=spec.name,
        kind=row.kind,
        input_schema=input_schema_of(spec.input_type),
        output_schema=output_schema,
        description=spec.description or None,
        risk=row.risk,
        stability="stable" if row.stable else "experimental",
        auth=None if spec.name == "health" else dict(BEARER_AUTH),
        bindings=[
            {
                "profile": CONNECTOR_PROFILE,
                "system": CONNECTOR_ID,
                "endpoint_id": endpoint_id,
                "operation": spec.name,
                "method": row.method,
                "path": row.path,
                "streaming": spec.streaming,
            }
        ],
        requires_human_approval=row.approval,
        contract=terms,
    )


def build_manifest(specs: Iterable[OperationSpec], facts: EndpointFacts) -> Manifest:
    """The whole manifest of one endpoint."""
    endpoint_id = facts.endpoint_id
    capabilities = [
        capability_of(spec, endpoint_id, idempotency_ttl_ms=facts.idempotency_ttl_ms)
        for spec in specs
    ]
    bound = (
        [{"endpoint_id": endpoint_id, "tenant_id": facts.tenant_id}]
        if facts.tenant_id is not None
        else []
    )
    ours: dict[str, Any] = {"worker_version": facts.worker_version, "shared": facts.shared}
    if facts.tenant_expires_at_unix_ms is not None:
        ours["tenant_expires_at_unix_ms"] = facts.tenant_expires_at_unix_ms
    return Manifest(
        manifest_version=MANIFEST_VERSION,
        agent=msgspec.convert(worker_principal(endpoint_id), Principal),
        profiles=list(PROFILES),
        capabilities=capabilities,
        security={
            "transport": "nats",
            "envelope_signatures": "ed25519 (did:key)",
            "tenant_binding": facts.tenant_id is not None,
        },
        limits={"max_envelope_bytes": facts.max_envelope_bytes},
        compatibility={
            "system": CONNECTOR_ID,
            "api": HERMES_API,
            "native_nats": {"subject": facts.actions_subject},
            "endpoints": [endpoint_id],
            "tenant_bound_endpoints": bound,
            "operations": [capability.name for capability in capabilities],
            "operator_principals": [worker_principal(endpoint_id)["id"]],
        },
        extensions={EXTENSION_KEY: ours},
    )


def _matches(capability: Capability, wanted: ManifestFilter) -> bool:
    terms = capability.contract
    if wanted.capability_ids and capability.id not in wanted.capability_ids:
        return False
    if wanted.profiles and not any(b["profile"] in wanted.profiles for b in capability.bindings):
        return False
    if wanted.risk and capability.risk not in wanted.risk:
        return False
    effects = terms.side_effects if terms is not None else []
    if wanted.side_effects and not set(effects) & set(wanted.side_effects):
        return False
    if (
        wanted.requires_approval is not None
        and bool(capability.requires_human_approval) != wanted.requires_approval
    ):
        return False
    streams = terms is not None and terms.execution.supports_streaming
    if wanted.supports_streaming is not None and streams != wanted.supports_streaming:
        return False
    transactional = terms is not None and terms.transaction is not None
    return wanted.supports_transactions is None or transactional == wanted.supports_transactions


def select(manifest: Manifest, request: ManifestRequest) -> Manifest:
    """`manifest` with only the capabilities `request` asks for: all of them for an empty
    request; none when it names only profiles this connector does not serve."""
    if request.profiles and not set(request.profiles) & set(manifest.profiles):
        return msgspec.structs.replace(manifest, capabilities=[])
    if request.filter is None:
        return manifest
    wanted = request.filter
    kept = [c for c in manifest.capabilities if _matches(c, wanted)]
    return msgspec.structs.replace(manifest, capabilities=kept)


def decode_manifest_request(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[ManifestRequest, Opened]:
    """The request in `data` and its Envelope (its signature, when it has one, verified).

    EnvelopeRejected for anything else (`envelope.decode.invalid`, `schema.envelope.invalid`
    or `connector_host.authentication` for a signature that does not verify)."""
    opened = open_envelope(
        data, message_types=frozenset({MANIFEST_REQUEST_TYPE}), max_bytes=max_bytes
    )
    try:
        body = open_body(MANIFEST_REQUEST_TYPE, opened.envelope["body"])
    except BodyError as exc:
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, str(exc)) from None
    assert isinstance(body, ManifestRequest)
    return body, opened


def encode_manifest_request(
    request: ManifestRequest | None = None,
    *,
    sender: Mapping[str, Any],
    signer: AipSigner | None,
) -> bytes:
    """A manifest request Envelope (an absent `request`: the whole manifest)."""
    payload = msgspec.to_builtins(request if request is not None else ManifestRequest())
    return seal(MANIFEST_REQUEST_TYPE, payload, sender=sender, signer=signer)


def _reply_frame(opened: Opened | None) -> dict[str, Any]:
    if opened is None:
        return {}
    frame: dict[str, Any] = {"in_response_to": opened.message_id}
    if opened.sender is not None:
        frame["to"] = dict(opened.sender)
    correlation = opened.envelope.get("correlation_id")
    if isinstance(correlation, str):
        frame["correlation_id"] = correlation
    return frame


def encode_manifest_response(
    manifest: Manifest, *, endpoint_id: str, signer: AipSigner | None, request: Opened | None
) -> bytes:
    """The signed `manifest_response` Envelope answering `request` (the AIP reply recipe:
    `in_response_to` its message id, `to` its sender, its correlation id copied)."""
    return seal(
        MANIFEST_RESPONSE_TYPE,
        msgspec.to_builtins(manifest),
        sender=worker_principal(endpoint_id),
        signer=signer,
        **_reply_frame(request),
    )


def encode_manifest_error(
    error: ProtocolError, *, endpoint_id: str, signer: AipSigner | None, request: Opened | None
) -> bytes:
    """A signed `aip.core.v1.error` Envelope: why a manifest request was not answered."""
    return seal(
        ERROR_TYPE,
        {"error": error_to_aip(error)},
        sender=worker_principal(endpoint_id),
        signer=signer,
        **_reply_frame(request),
    )


def decode_manifest_response(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[Manifest, Opened]:
    """The manifest in a reply and its Envelope (signature verified when present; which keys
    to trust is the caller's decision). A worker's `aip.core.v1.error` answer is raised as
    EnvelopeRejected with its code and message; anything else unreadable likewise."""
    opened = open_envelope(
        data, message_types=frozenset({MANIFEST_RESPONSE_TYPE, ERROR_TYPE}), max_bytes=max_bytes
    )
    try:
        body = open_body(opened.message_type, opened.envelope["body"])
    except BodyError as exc:
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, str(exc)) from None
    if not isinstance(body, Manifest):
        error = getattr(body, "error", None)
        code = getattr(error, "code", "unknown")
        message = getattr(error, "message", "")
        raise EnvelopeRejected(
            ErrorCode.SCHEMA_ENVELOPE_INVALID, f"manifest request refused: {code}: {message}"
        )
    return body, opened


def extension_of_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Our facts of a manifest (as builtins): worker version, binding expiry, shared."""
    extensions = manifest.get("extensions")
    ours = extensions.get(EXTENSION_KEY) if isinstance(extensions, Mapping) else None
    return dict(ours) if isinstance(ours, Mapping) else {}


def bound_tenant_of(manifest: Mapping[str, Any]) -> str | None:
    """The tenant the manifest's endpoint is bound to (`compatibility.tenant_bound_endpoints`)."""
    compatibility = manifest.get("compatibility")
    bound = (
        compatibility.get("tenant_bound_endpoints") if isinstance(compatibility, Mapping) else None
    )
    for entry in bound if isinstance(bound, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("tenant_id"), str):
            return str(entry["tenant_id"])
    return None


def operation_of(capability: Mapping[str, Any]) -> str | None:
    """The connector operation a manifest capability binds to (its connector binding)."""
    for binding in capability.get("bindings") or []:
        if isinstance(binding, Mapping) and binding.get("profile") == CONNECTOR_PROFILE:
            operation = binding.get("operation")
            return operation if isinstance(operation, str) else None
    return None


def endpoint_of(capability: Mapping[str, Any]) -> str | None:
    """The endpoint a manifest capability binds to (its connector binding)."""
    for binding in capability.get("bindings") or []:
        if isinstance(binding, Mapping) and binding.get("profile") == CONNECTOR_PROFILE:
            endpoint = binding.get("endpoint_id")
            return endpoint if isinstance(endpoint, str) else None
    return None


__all__ = [
    "ERROR_TYPE",
    "MANIFEST_REQUEST_TYPE",
    "MANIFEST_RESPONSE_TYPE",
    "MANIFEST_VERSION",
    "PROFILES",
    "EndpointFacts",
    "bound_tenant_of",
    "build_manifest",
    "capability_of",
    "decode_manifest_request",
    "decode_manifest_response",
    "encode_manifest_error",
    "encode_manifest_request",
    "encode_manifest_response",
    "endpoint_of",
    "extension_of_manifest",
    "operation_of",
    "select",
]
