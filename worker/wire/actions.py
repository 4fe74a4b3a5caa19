"""The Action subject's wire: an internal `schemas.action.Action` as a signed AIP 1.0
`aip.core.v1.action` Envelope, and back (shared/reference/aip-1.0-wire.md §1.2, §7.1).

The mapping (docs/publishing.md "Action" has the table):

* `capability` → `capability_id`, mode `stream` → `streaming`; `id`, `input`,
  `idempotency_key`, `timeout_ms` keep their names.
* `identity` → `IdentityContext`: the principal is `human_actor` when its AIP kind is
  `human`, else `service_account`, a Principal `{id, kind}`. AIP kinds are a closed set, so
  a kind outside it is sent as `human` (`user`) or `service` (anything else) and our own
  word travels in the Principal's `auth_context.principal_kind`; `authentication_issuer`
  and `credential_revision` go to `auth_context.issuer` / `.credential_revision`, the
  tenant to `tenant.id`.
* `trace.trace_id` → `observability.trace_id`; `trace.correlation_id` ⇄ the Envelope's
  `correlation_id`; `memory` → `memory_context`; `conversation`, `federation`, `callback`,
  `observability`, `compliance`, `transaction` must be the AIP typed (closed) objects.
* `approval` is the AIP `ApprovalDecision` itself (`body.action.approval`, `approved`
  only): a claim the worker checks against the durable signed record, never authority.
* No AIP field yet: `created_at_unix_ms`, `deadline_unix_ms` and `delegation` travel in the
  Envelope's `extensions["org.aip-hermes-worker"]` under those names. An Envelope without
  `created_at_unix_ms` (an AIP client knows nothing of it) is taken as created at its
  `sent_at`.

Decoding also holds the result to the internal Action's own constraints (the id form
`act_` + 32 hex, the capability grammar, `timeout_ms` ≤ 86 400 000, bounded text), and
every failure is an `EnvelopeRejected` with the code the DLQ records.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import msgspec

from schemas.action import Action, Identity, Mode
from schemas.aip.action import Action as AipAction
from schemas.aip.action import Mode as AipMode
from schemas.delegation import ChildAction
from worker.aip.canonical import canonical_bytes, loads
from worker.aip.envelope import PRINCIPAL_KINDS, format_timestamp
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    invalid,
    open_envelope,
    open_payload,
    seal,
    timestamp_ms,
)

A = TypeVar("A", bound=Action)

MESSAGE_TYPE: Final = "aip.core.v1.action"
#: The `from` Principal of an Action a gateway key signs, unless the publisher names
#: another: the AIP runtime in front of the workers, as a service. What the worker trusts is
#: the signing key (`security.did`), never this id.
GATEWAY_SENDER: Final[Mapping[str, str]] = {"id": "service:aip-gateway", "kind": "service"}
_TYPES: Final = frozenset({MESSAGE_TYPE})

#: Our Action facts with no AIP field: extension keys of the same names.
EXTENSION_FIELDS: Final = ("created_at_unix_ms", "deadline_unix_ms", "delegation")
#: Internal objects that must be AIP typed objects of the same name on the wire.
_TYPED_OBJECTS: Final = ("conversation", "federation", "callback", "compliance", "transaction")

_MODE_TO_AIP: Final = {Mode.SYNC: "sync", Mode.ASYNC: "async", Mode.STREAM: "streaming"}
_MODE_FROM_AIP: Final = {
    AipMode.SYNC: Mode.SYNC,
    AipMode.ASYNC: Mode.ASYNC,
    AipMode.STREAMING: Mode.STREAM,
}


def aip_principal_kind(kind: str) -> str:
    """The AIP Principal kind our identity's `principal_kind` travels as."""
    if kind in PRINCIPAL_KINDS:
        return kind
    return "human" if kind == "user" else "service"


def _identity_context(action: Action) -> dict[str, Any]:
    return identity_context(action.identity)


def identity_context(identity: Identity) -> dict[str, Any]:
    """The AIP IdentityContext of our Identity (the mapping in this module's docstring)."""
    kind = aip_principal_kind(identity.principal_kind)
    auth_context: dict[str, Any] = {}
    if identity.authentication_issuer is not None:
        auth_context["issuer"] = identity.authentication_issuer
    if identity.credential_revision is not None:
        auth_context["credential_revision"] = identity.credential_revision
    if kind != identity.principal_kind:
        auth_context["principal_kind"] = identity.principal_kind
    principal: dict[str, Any] = {"id": identity.principal_id, "kind": kind}
    if auth_context:
        principal["auth_context"] = auth_context
    context: dict[str, Any] = {"human_actor" if kind == "human" else "service_account": principal}
    if identity.tenant_id is not None:
        context["tenant"] = {"id": identity.tenant_id}
    return context


def aip_action_body(action: Action) -> dict[str, Any]:
    """The AIP Action of `action` in upstream's serialized form (what is signed);
    EnvelopeRejected (`schema.envelope.invalid`) when an object it carries is not the AIP
    typed object of its name."""
    body: dict[str, Any] = {
        "id": action.id,
        "capability_id": action.capability,
        "input": action.input,
        "mode": _MODE_TO_AIP[action.mode],
        "identity": _identity_context(action),
    }
    optional = {
        "idempotency_key": action.idempotency_key,
        "timeout_ms": action.timeout_ms,
        "memory_context": action.memory,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    if action.approval is not None:
        body["approval"] = msgspec.to_builtins(action.approval)
    for name in _TYPED_OBJECTS:
        value = getattr(action, name)
        if value is not None:
            body[name] = value
    observability = dict(action.observability or {})
    trace_id = action.trace.trace_id if action.trace else None
    if trace_id is not None:
        if observability.get("trace_id", trace_id) != trace_id:
            raise invalid("trace.trace_id and observability.trace_id differ")
        observability["trace_id"] = trace_id
    if observability:
        body["observability"] = observability
    try:
        typed = msgspec.convert(body, AipAction, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the Action is not an AIP Action: {exc}") from None
    payload: dict[str, Any] = msgspec.to_builtins(typed)
    return payload


def action_extension(action: Action) -> dict[str, Any]:
    """Our facts of `action` with no AIP field, as the Envelope extension carries them."""
    extension: dict[str, Any] = {"created_at_unix_ms": action.created_at_unix_ms}
    if action.deadline_unix_ms is not None:
        extension["deadline_unix_ms"] = action.deadline_unix_ms
    if action.delegation is not None:  # written as AIP writes objects: an absent member omitted
        fields = msgspec.to_builtins(action.delegation).items()
        extension["delegation"] = {key: item for key, item in fields if item is not None}
    return extension


def encode_action(
    action: Action,
    *,
    signer: AipSigner | None,
    sender: Mapping[str, Any],
    message_id: str | None = None,
    sent_at: str | None = None,
) -> bytes:
    """The wire bytes of `action`: an `aip.core.v1.action` Envelope (canonical JSON) from
    `sender` (a Principal `{id, kind}`), signed by `signer` (None: unsigned, for a
    deployment that accepts unsigned Envelopes in development only).

    `message_id` defaults to `msg_` + the Action id's 32 hex digits and `sent_at` to its
    `created_at_unix_ms`, and Ed25519 signatures are deterministic: the bytes are a pure
    function of the Action and the key, so publishing the same Action again (a retry, a
    recovery re-send) sends the same message under the same content-bound `Nats-Msg-Id`.

    EnvelopeRejected (`schema.envelope.invalid`) for an Action that cannot travel."""
    correlation_id = action.trace.correlation_id if action.trace else None
    try:
        return seal(
            MESSAGE_TYPE,
            aip_action_body(action),
            sender=sender,
            signer=signer,
            correlation_id=correlation_id,
            extension=action_extension(action),
            message_id=message_id or f"msg_{action.id.removeprefix('act_')}",
            sent_at=sent_at or timestamp_of_ms(action.created_at_unix_ms),
        )
    except AipWireError as exc:
        raise invalid(f"the Action cannot be sealed: {exc}") from None


def timestamp_of_ms(unix_ms: int) -> str:
    """Unix ms as the RFC 3339 UTC text an Envelope's `sent_at` takes; EnvelopeRejected
    for an instant past year 9999.

    Every receipt, chunk and result Envelope names its time this way (about ten per
    Action), and `format_timestamp`'s strftime was a quarter of a receipt's framing CPU:
    the text up to the second is cached per second (`_second_text`, the same strftime),
    the millisecond fraction appended as `format_timestamp` trims it."""
    seconds, millis = divmod(unix_ms, 1000)
    try:
        head = _second_text(seconds)
    except (ValueError, OverflowError, OSError):
        raise invalid(f"created_at_unix_ms {unix_ms} is not a representable time") from None
    if not millis:
        return f"{head}Z"
    return f"{head}.{f'{millis:03d}'.rstrip('0')}Z"


@functools.lru_cache(maxsize=64)  # the receipts of one Action fall within a few seconds
def _second_text(seconds: int) -> str:
    """`…THH:MM:SS` of a whole Unix second, exactly as `format_timestamp` writes it."""
    return format_timestamp(datetime.fromtimestamp(seconds, UTC)).removesuffix("Z")


def _identity(context: Any) -> dict[str, Any]:
    """Our Identity's fields from the AIP IdentityContext (as builtins)."""
    if not isinstance(context, dict):
        raise invalid("body.action.identity is required (whose Action it is)")
    actors = [context[slot] for slot in ("human_actor", "service_account") if slot in context]
    if len(actors) != 1:
        raise invalid(
            "body.action.identity must name exactly one of human_actor and service_account"
        )
    principal = actors[0]
    auth = principal.get("auth_context")
    if auth is None:
        auth = {}
    if not isinstance(auth, dict):
        raise invalid("identity principal's auth_context is not an object")
    identity: dict[str, Any] = {
        "principal_id": principal["id"],
        "principal_kind": auth.get("principal_kind", principal["kind"]),
    }
    if auth.get("principal_kind") is not None and (
        aip_principal_kind(str(auth["principal_kind"])) != principal["kind"]
    ):
        raise invalid("auth_context.principal_kind does not travel as the Principal's kind")
    tenant = context.get("tenant")
    if tenant is not None:
        identity["tenant_id"] = tenant["id"]
    for ours, theirs in (
        ("authentication_issuer", "issuer"),
        ("credential_revision", "credential_revision"),
    ):
        if auth.get(theirs) is not None:
            identity[ours] = auth[theirs]
    return identity


def internal_fields(
    typed: AipAction,
    *,
    extension: Mapping[str, Any],
    sent_at: str,
    correlation_id: Any,
) -> dict[str, Any]:
    """The internal Action's fields (builtins, not yet validated) of a decoded AIP Action,
    given our extension facts of it and its Envelope's `sent_at` and `correlation_id`: the
    one mapping of an Action, also for the child inside a DelegationRequest."""
    aip: dict[str, Any] = msgspec.to_builtins(typed)
    unknown = sorted(set(extension) - set(EXTENSION_FIELDS))
    if unknown:
        raise invalid(f"unknown Action extension keys: {', '.join(unknown)[:200]}")
    fields: dict[str, Any] = {
        "id": aip["id"],
        "capability": aip["capability_id"],
        "input": aip["input"],
        "identity": _identity(aip.get("identity")),
        "created_at_unix_ms": extension.get("created_at_unix_ms", timestamp_ms(sent_at)),
        "mode": _MODE_FROM_AIP[typed.mode or AipMode.ASYNC].value,
    }
    for ours, theirs in (
        ("idempotency_key", "idempotency_key"),
        ("timeout_ms", "timeout_ms"),
        ("memory", "memory_context"),
        *((name, name) for name in _TYPED_OBJECTS),
    ):
        if aip.get(theirs) is not None:
            fields[ours] = aip[theirs]
    observability = dict(aip.get("observability") or {})
    trace_id = observability.pop("trace_id", None)
    if observability:
        fields["observability"] = observability
    trace = {
        name: value
        for name, value in (("trace_id", trace_id), ("correlation_id", correlation_id))
        if value is not None
    }
    if trace:
        fields["trace"] = trace
    for name in ("deadline_unix_ms", "delegation"):
        if extension.get(name) is not None:
            fields[name] = extension[name]
    if typed.approval is not None:
        if typed.approval.decision != "approved":
            raise invalid("body.action.approval must be an approved decision (AIP §1.2)")
        fields["approval"] = aip["approval"]
    return fields


def _internal(opened: Opened, typed: AipAction) -> dict[str, Any]:
    """The internal Action's fields of an opened Action Envelope, with where it arrived."""
    fields = internal_fields(
        typed,
        extension=opened.extension,
        sent_at=opened.envelope["sent_at"],
        correlation_id=opened.envelope.get("correlation_id"),
    )
    sender = opened.sender
    fields["received"] = {
        "message_id": opened.message_id,
        **({"sender": dict(sender)} if sender is not None else {}),
    }
    return fields


def decode_action(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[Action, Opened]:
    """The internal Action an `aip.core.v1.action` Envelope carries, and the opened
    Envelope (its `verified` says who signed it: which keys to trust is the caller's).

    EnvelopeRejected: `envelope.decode.invalid` for bytes that are not one JSON object,
    `schema.envelope.invalid` for a frame, body or Action the AIP rules or ours refuse,
    `connector_host.authentication` for a signature that is present and does not verify."""
    return _decode(data, max_bytes, Action)


def decode_child_action(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[ChildAction, Opened]:
    """As `decode_action`, for an executor of any AIP capability (a gateway route that is
    not a Hermes endpoint's): the Action may name any `cap:…` id."""
    return _decode(data, max_bytes, ChildAction)


def _decode(data: bytes, max_bytes: int, into: type[A]) -> tuple[A, Opened]:
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)
    typed = open_payload(opened, MESSAGE_TYPE)
    assert isinstance(typed, AipAction)
    try:
        action = msgspec.convert(_internal(opened, typed), into, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(f"the Action: {exc}") from None
    return action, opened


def decode_action_content(data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES) -> Action:
    """The Action an Envelope carries, its signature set aside unchecked: for an operator
    who re-publishes a dead-lettered Action under their own signature (`dlq replay`) and
    so vouches for its content themself. Everything else is checked as `decode_action`
    checks it (EnvelopeRejected)."""
    if len(data) > max_bytes:
        return decode_action(data, max_bytes=max_bytes)[0]  # refused for its size
    try:
        envelope = loads(data)
    except AipWireError:
        return decode_action(data, max_bytes=max_bytes)[0]  # refused as undecodable
    if isinstance(envelope, dict):
        security = envelope.get("security")
        if isinstance(security, dict):
            envelope["security"] = {
                key: value for key, value in security.items() if key not in {"signature", "did"}
            }
        sender = envelope.get("from")
        if isinstance(sender, dict):
            envelope["from"] = {key: value for key, value in sender.items() if key != "did"}
    try:
        unsigned = canonical_bytes(envelope)
    except AipWireError:
        unsigned = data
    return decode_action(unsigned, max_bytes=max_bytes)[0]


def sign_action_envelope(
    data: bytes, *, signer: AipSigner, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> bytes:
    """An Action Envelope (signed or not) signed again by `signer`, keeping its
    `message_id` and the sender's `{id, kind}` (`GATEWAY_SENDER` when it names none): what
    `aip-hermes sign --kind action` prints for a publisher that prepared the Envelope
    elsewhere. EnvelopeRejected when `data` is not an Action Envelope the workers decode."""
    action, opened = decode_action(data, max_bytes=max_bytes)
    sender = opened.sender
    principal = (
        {key: value for key, value in sender.items() if key != "did"}
        if sender is not None
        else dict(GATEWAY_SENDER)
    )
    return encode_action(action, signer=signer, sender=principal, message_id=opened.message_id)


def claimed_action_id(data: bytes) -> str | None:
    """The Action id an Envelope *claims* (`body.action.id`), read without trusting
    anything: for the DLQ entry of an Envelope refused before its body was decoded."""
    try:
        envelope = loads(data)
    except AipWireError:
        return None
    body = envelope.get("body") if isinstance(envelope, dict) else None
    action = body.get("action") if isinstance(body, dict) else None
    claimed = action.get("id") if isinstance(action, dict) else None
    return claimed if isinstance(claimed, str) else None


__all__ = [
    "EXTENSION_FIELDS",
    "GATEWAY_SENDER",
    "MESSAGE_TYPE",
    "action_extension",
    "aip_action_body",
    "aip_principal_kind",
    "claimed_action_id",
    "decode_action",
    "decode_action_content",
    "decode_child_action",
    "encode_action",
    "identity_context",
    "internal_fields",
    "sign_action_envelope",
    "timestamp_of_ms",
]
