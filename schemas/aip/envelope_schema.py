"""The JSON Schema (2020-12) of an AIP 1.0 Envelope of one message type, as this project
publishes it: the Envelope frame, described here from shared/reference/aip-1.0-wire.md §1.1
(nothing of upstream's schema text is copied), around the payload's closed type from
`schemas/aip/` and our extension object from `schemas.aip.extensions`.

The published shape is the one a signer must send, so it is closed and written once:

- **Closed.** Every object that declares properties refuses others
  (`additionalProperties: false`), as upstream's hardened schemas do. The free slots stay
  free (§1.0.3): `trace`, the keys of `security` and `extensions` besides ours, `input`,
  `memory_context`, `output`, `data`, a ProtocolError's `details` and `source`, ….
- **Absent, never null.** Upstream's schema lets an optional field be `null`, but upstream
  verifies a signature over its *re-serialization* of the typed Envelope, which omits it: a
  body signed with a `null` in it fails there. So an optional AIP field here is absent or
  a value, never `null` (a free value's inner nulls are its own); likewise an optional
  list is absent or has items, since an empty one is omitted too (`schemas.aip._base`).
- **One message type.** `message_type` is a `const` and `body` has exactly the one key of
  that type.
- **Our subject's Action.** The Action is held to what the actions subject's reader
  requires beyond AIP (the internal `schemas.action.Action`'s constraints): an `identity`
  (whose Action it is), an `act_` + 32 hex id, an AIP capability id (a Hermes endpoint's
  workers take only `cap:hermes_agent:{endpoint}:{operation}`, a gateway route's executor
  any `cap:…`), and a `timeout_ms` within the internal bound.

Our extension object follows our internal types: it lives in a free slot that every
verifier signs as given, so a `null` there is harmless and allowed where the writer may
write one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from schemas.action import Action as InternalAction
from schemas.aip.common import Principal
from schemas.aip.extensions import (
    ALWAYS_CARRIED,
    EXTENSION_KEY,
    EXTENSIONS,
    REUSED_FIELD_DESCRIPTIONS,
    HermesChannel,
    HermesMessageFacts,
    IngressDeliveryFacts,
)
from schemas.aip.json_schema import json_schema as aip_json_schema
from schemas.aip.messages import BODY_KEYS, PAYLOAD_TYPES
from schemas.delegation import ANY_CAPABILITY_PATTERN
from schemas.ids import json_schema as wire_json_schema

#: The message types this project puts on its subjects, with what each one is for.
PUBLISHED: Final[Mapping[str, str]] = {
    "aip.core.v1.action": "An Action on `aip.hermes.{endpoint}.actions`: run one capability "
    "of one Hermes endpoint. Signed by the publisher (the gateway key). Also a channel "
    "delivery on the work queue `aip.hermes.{endpoint}.egress`: the `session_chat` Action "
    "that posts a result or escalation into a persisted Hermes session, signed by a "
    "worker's response key, its rule and source in our extension's `channel_delivery`.",
    "aip.core.v1.action_result": "The one result of an Action on "
    "`aip.hermes.{endpoint}.results.{action_id}`, signed by the worker's response key.",
    "aip.core.v1.stream_chunk": "One piece of an Action's progress on "
    "`aip.hermes.{endpoint}.chunks.{action_id}`; unsigned, hash-chained by "
    "`prev_sha256`, the chain anchored by the signed result's `last_chunk_sha256`.",
    "aip.core.v1.escalation": "An Action's terminal state a human must decide, on "
    "`aip.hermes.{endpoint}.escalations`, signed by the worker's response key; its "
    "`message_id` is `msg_` + the escalation id's 32 hex digits.",
    "aip.core.v1.escalation_resolution": "Who resolved an escalation, how and why, on "
    "`aip.hermes.{endpoint}.escalations.resolved`, signed by the person who resolved it "
    "(their approver key); `in_response_to` is the escalation's `message_id`.",
    "aip.core.v1.error": "A failure answered as an Envelope of its own "
    "(`body.error.error` is the ProtocolError).",
    "aip.core.v1.cancel": "A request on `aip.hermes.{endpoint}.cancel` (core NATS "
    "request/reply) to cancel one Action, signed by the publisher (the gateway key) as the "
    "requester (`from`); answered by an `action_result` or an `error` Envelope signed by the "
    "worker's response key.",
    "aip.channel.v1.message_created": "One message of a followed Hermes session on "
    "`aip.hermes.{endpoint}.inbound.{session_id}` (channel ingress), once, in id order, "
    "signed by the worker's response key; the Hermes message's facts in `message`, how it "
    "was delivered in `delivery`.",
    "aip.agent.v1.delegation_request": "A request on `aip.hermes.{endpoint}.delegations` "
    "that the Hermes operator of `agent:hermes_operator:{endpoint}` make one exact child "
    "Action through `aip_call`; signed by the publisher (the gateway key). The requested "
    "scope list is `metadata.scopes` (`scope` is that list joined by single spaces).",
    "aip.agent.v1.delegation_result": "The answer of the gateway's delegation route "
    "(`AIPD_AIP_DELEGATION_SUBJECT`, core NATS request/reply) to a signed "
    "`delegation_request`: what became of the delegation, signed by the gateway key, "
    "`in_response_to` the request's `message_id`; `accepted` (no `result`) when it was "
    "still running at the route's timeout.",
    "aip.audit.v1.receipt_chain": "One audit receipt on "
    "`aip.hermes.{endpoint}.audit.{action_id}`: a chain of one AIP Receipt (`chain_id` the "
    "Action id, `root_hash` the sha256 of the receipt's `hash`), our receipt's fields in its "
    "`data`; each names the `hash` of the one before it (`previous_hash`) and the Envelope "
    "that ends a segment is signed by the worker's response key (or a gateway's or "
    "person's key for their own receipts).",
    "aip.lifecycle.v1.action_status": "An ActionStatus a consumer acts on, of two kinds. "
    "A record of the AIP runtime's stores a delegated child is verified against, signed by "
    "the gateway key: its queue entry on `aip.runtime.queue.{action_id}` (`extensions` "
    "`record: queue`: the child Action and the authorization context) or its lifecycle record "
    "with the durable result on `aip.runtime.lifecycle.{action_id}` (`record: lifecycle`, "
    "`result` an ActionResult); the last message per subject is the current record. Or a DLQ "
    "entry on `aip.hermes.{endpoint}.dlq`: state `dead_lettered`, signed by the worker's "
    "response key; the refused message (its size, sha256, first bytes) and why are in "
    "`extensions[\"org.aip-hermes-worker\"].dead_letter`.",
    "aip.lifecycle.v1.action_list": "One shard of the gateway's index of open delegated "
    "children on `aip.runtime.open.{shard}` (the first hex digit of the child's id; the last "
    "message per subject is the shard): an ActionStatus per open child, state `accepted` and "
    "`updated_at` the time it was added, the whole shard one page (`total_size` its length); "
    "signed by the gateway key.",
    "aip.discovery.v1.manifest_request": "A request on `aip.hermes.{endpoint}.manifest` for "
    "the endpoint's manifest, optionally filtered (`filter.capability_ids`, `risk`, ...).",
    "aip.discovery.v1.manifest_response": "The endpoint's AIP manifest answered on "
    "`aip.hermes.{endpoint}.manifest`, signed by the worker's response key; our facts with "
    "no AIP field are in `manifest.extensions[\"org.aip-hermes-worker\"]`.",
}

#: RFC 3339 date-time as the Envelope rules read it (`worker.aip.envelope`): upper-case `T`
#: and `Z`, 1 to 9 fraction digits, an offset `Z` or ±hh:mm.
RFC3339_PATTERN: Final = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})$"
)
#: 64 signature bytes as padded standard base64.
SIGNATURE_PATTERN: Final = r"^[A-Za-z0-9+/]{86}==$"

_SCHEMA_KEYWORDS: Final = frozenset({"type", "$ref", "anyOf", "oneOf", "enum", "const"})


def schema_id(message_type: str) -> str:
    return f"https://aip-hermes-worker/schemas/{message_type}.json"


def envelope_schema(message_type: str) -> dict[str, Any]:
    """The JSON Schema document of an Envelope of `message_type` (one of PUBLISHED)."""
    if message_type not in PUBLISHED:
        raise KeyError(f"{message_type} is not a message type this project publishes")
    payload = aip_json_schema(PAYLOAD_TYPES[message_type])
    defs: dict[str, Any] = {}
    _merge(defs, payload["$defs"])
    _merge(defs, aip_json_schema(Principal)["$defs"])
    for definition in defs.values():
        _absent_never_null(definition)
    if message_type == "aip.core.v1.action":
        _our_action_rules(defs["Action"])
    if message_type == "aip.core.v1.cancel":
        _our_cancel_rules(defs["CancelTarget"])
    if message_type == "aip.channel.v1.message_created":
        _our_channel_rules(defs)
    extensions: dict[str, Any] = {
        "description": "Free vendor and profile extensions, one key per namespace"
        + (f"; ours is `{EXTENSION_KEY}`." if message_type in EXTENSIONS else "."),
        "type": "object",
    }
    extension_type = EXTENSIONS.get(message_type)
    if extension_type is not None:
        extension = wire_json_schema(extension_type)
        for name, fields in REUSED_FIELD_DESCRIPTIONS.items():
            for field, description in fields.items():
                if name in extension["$defs"]:
                    extension["$defs"][name]["properties"][field]["description"] = description
        _merge(defs, extension["$defs"])
        extensions["properties"] = {
            EXTENSION_KEY: {
                "description": "This project's facts with no AIP field (closed).",
                "$ref": extension["$ref"],
            }
        }
        if message_type in ALWAYS_CARRIED:
            extensions["required"] = [EXTENSION_KEY]
    body_key = BODY_KEYS[message_type]
    properties: dict[str, Any] = {
        "aip_version": {"description": "The AIP version: always `1.0`.", "const": "1.0"},
        "message_type": {
            "description": "The message type; it names the one key of `body`.",
            "const": message_type,
        },
        "message_id": {
            "description": "Unique message id (`msg_` + 32 hex); a receiver claims it once.",
            "type": "string",
            "minLength": 1,
        },
        "sent_at": {
            "description": "When it was sent: RFC 3339, written in UTC ending in `Z`.",
            "type": "string",
            "format": "date-time",
            "pattern": RFC3339_PATTERN,
        },
        "body": {
            "description": f"The payload, under its one key `{body_key}`.",
            "type": "object",
            "properties": {
                body_key: {
                    "description": f"The {payload['$ref'].rsplit('/', 1)[1]}.",
                    "$ref": payload["$ref"],
                }
            },
            "required": [body_key],
            "additionalProperties": False,
        },
        "session_id": {"description": "The active session (`sess_…`).", "type": "string"},
        "correlation_id": {
            "description": "Request correlation (`corr_…`), copied into every answer.",
            "type": "string",
        },
        "in_response_to": {
            "description": "The `message_id` of the request this answers.",
            "type": "string",
        },
        "idempotency_key": {
            "description": "Envelope idempotency key; non-empty.",
            "type": "string",
            "minLength": 1,
        },
        "from": {
            "description": "The sender; on a signed Envelope, the signer, with its `did`.",
            "$ref": "#/$defs/Principal",
        },
        "to": {"description": "The recipient.", "$ref": "#/$defs/Principal"},
        "trace": {"description": "Free trace metadata (e.g. W3C trace context)."},
        "security": {
            "description": "The signature block (free besides the keys described): "
            "Ed25519 over the canonical JSON of the Envelope without `security.signature`.",
            "type": "object",
            "properties": {
                "did": {
                    "description": "The signer's `did:key` (Ed25519).",
                    "type": "string",
                    "pattern": "^did:key:z[1-9A-HJ-NP-Za-km-z]+$",
                },
                "signature": {
                    "description": "The signature: 64 bytes, standard base64 with padding.",
                    "type": "string",
                    "pattern": SIGNATURE_PATTERN,
                },
            },
        },
        "extensions": extensions,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id(message_type),
        "title": f"{message_type} Envelope",
        "description": PUBLISHED[message_type],
        "type": "object",
        "properties": properties,
        "required": ["aip_version", "message_type", "message_id", "sent_at", "body"]
        + (["extensions"] if message_type in ALWAYS_CARRIED else []),
        "additionalProperties": False,
        "$defs": defs,
    }


def _our_action_rules(definition: dict[str, Any]) -> None:
    """The AIP Action as the actions subject takes it (module docstring), its constraints
    read from the internal Action's own schema so the two cannot drift apart."""
    internal = wire_json_schema(InternalAction)["$defs"]["Action"]["properties"]
    properties = definition["properties"]
    properties["id"]["pattern"] = internal["id"]["pattern"]
    # Any AIP capability id: the same Envelope reaches a gateway route's executor (any
    # `cap:…`); a Hermes endpoint's workers take only `cap:hermes_agent:{endpoint}:{op}`
    # and dead-letter any other (`schemas.ids.CAPABILITY_PATTERN`, checked on decode).
    properties["capability_id"]["pattern"] = ANY_CAPABILITY_PATTERN.replace("\\Z", "$")
    (bounded,) = [option for option in internal["timeout_ms"]["anyOf"] if "maximum" in option]
    properties["timeout_ms"]["maximum"] = bounded["maximum"]
    definition["required"] = [*definition["required"], "identity"]
    properties["identity"]["oneOf"] = [
        {"required": ["human_actor"]},
        {"required": ["service_account"]},
    ]
    definition["description"] += (
        " On the actions subject it needs an `identity` (exactly one of `human_actor` and "
        "`service_account`), an `act_` + 32 hex id and a capability id (a Hermes endpoint's "
        "workers take only `cap:hermes_agent:{endpoint}:{operation}`; a gateway route's "
        "executor any `cap:…`)."
    )


def _our_cancel_rules(definition: dict[str, Any]) -> None:
    """The Cancel target as the cancel subject takes it: an Action, by its `act_` + 32 hex
    id (connector hosts accept only the action form)."""
    internal = wire_json_schema(InternalAction)["$defs"]["Action"]["properties"]
    definition["properties"]["action"]["pattern"] = internal["id"]["pattern"]
    definition["required"] = ["action"]
    definition["not"] = {"required": ["session"]}
    definition["description"] += " On the cancel subject: always `action`, an `act_` + 32 hex id."


def _our_channel_rules(defs: dict[str, Any]) -> None:
    """A ChannelMessage as the inbound subject carries it: AIP's free `message`, `delivery`
    and `Conversation.channel` hold this project's closed, described objects
    (`schemas.aip.extensions`), and the thread names its session in `external_refs`."""
    slots = (
        (defs["ChannelMessage"], "message", HermesMessageFacts),
        (defs["ChannelMessage"], "delivery", IngressDeliveryFacts),
        (defs["Conversation"], "channel", HermesChannel),
    )
    for definition, name, facts in slots:
        schema = wire_json_schema(facts)
        _merge(defs, schema["$defs"])
        prop = definition["properties"][name]
        definition["properties"][name] = {
            "description": prop["description"],
            "$ref": schema["$ref"],
        }
    message = defs["ChannelMessage"]
    message["required"] = sorted({*message["required"], "delivery"})
    message["properties"]["parts"].update(minItems=1, maxItems=1)
    message["description"] += (
        " On the inbound subject: `message`, `delivery` and the conversation's `channel` are "
        "this project's objects, and `parts` holds one part: `text`, or `tool_result` for a "
        "tool's answer."
    )
    defs["Conversation"]["required"] = sorted({*defs["Conversation"]["required"], "external_refs"})


def _merge(into: dict[str, Any], defs: Mapping[str, Any]) -> None:
    for name, definition in defs.items():
        if name in into and into[name] != definition:
            raise ValueError(f"two different definitions named {name}")
        into[name] = definition


def _absent_never_null(definition: dict[str, Any]) -> None:
    """An AIP object's optional fields as a signer must write them (module docstring)."""
    required = set(definition.get("required", ()))
    for name, prop in (definition.get("properties") or {}).items():
        if name in required:
            continue
        if prop.get("default", ...) is None:
            del prop["default"]
        if prop.get("type") == "array" and prop.get("default") == []:
            del prop["default"]  # an empty list is omitted, so a written one has items
            prop.setdefault("minItems", 1)
        options = prop.get("anyOf")
        if options is not None and {"type": "null"} in options:
            rest = [option for option in options if option != {"type": "null"}]
            del prop["anyOf"]
            if len(rest) == 1:
                prop.update(rest[0])
            else:
                prop["anyOf"] = rest
        elif not _SCHEMA_KEYWORDS & set(prop):  # a free value: anything but null
            prop["not"] = {"type": "null"}
