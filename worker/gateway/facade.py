"""The reference MCP facade's shapes (aip-1.0-wire.md §6.1; upstream `aip-mcp-server`): the
six tools' input schemas, their argument checks, and the AIP objects they answer with.

One module for the shapes so the MCP tools (worker/gateway/mcp_app.py) and the native
binding's answers (worker/gateway/aip_answers.py) build the same ActionStatus and
ActionResult of a record. The arguments are the reference's, at the top level:
`aip_call` takes the Action's fields (`capability_id`, `input`, `action_id`, `mode`, …, with
`context` as a fallback container for any of them); the lifecycle tools take `action_id`
and their flags. Each schema is closed (`additionalProperties: false`): a misspelt field is
a clear tool error instead of a silently dropped one. What the gateway does not serve
(`include_receipts`, `include_receipt`, `include_terminal_events`, a non-empty
`delegation_chain`) is refused when asked for, never ignored.

The answers are the reference's: a read is `{message_type, body: {<body key>: …}}`; a
settled `aip_call` is the ActionResult mapped as upstream maps it (content, `isError` when
the status is not `completed`, the output as `structuredContent`, the error under
`_meta["org.getaip/aip"]`); an `aip_call` still running is `{action_id, ack}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import jsonschema

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.gateway.chunk_reads import Link
from worker.wire.actions import timestamp_of_ms

#: The `_meta` key of AIP facts on an MCP result (upstream `aip_extension_meta`).
META_KEY: Final = "org.getaip/aip"
#: Our Action facts with no AIP field travel in this `extensions` key of `aip_call` (the
#: Envelope extension of worker/wire/actions.py: `created_at_unix_ms`, `deadline_unix_ms`,
#: `delegation`).
EXTENSION_KEY: Final = "org.aip-hermes-worker"
STATUS_TYPE: Final = "aip.lifecycle.v1.action_status"
RESULT_TYPE: Final = "aip.core.v1.action_result"
EVENTS_TYPE: Final = "aip.lifecycle.v1.action_events"
#: The longest `wait_ms` a status or result read takes (the reference's bound).
MAX_WAIT_MS: Final = 30_000
#: The Action fields `aip_call` takes at the top level (or inside `context`).
ACTION_FIELDS: Final = (
    "capability_id",
    "input",
    "action_id",
    "mode",
    "idempotency_key",
    "timeout_ms",
    "conversation",
    "memory_context",
    "delegation_chain",
    "federation",
    "callback",
    "observability",
    "compliance",
    "approval",
    "transaction",
)

_OBJECT: Final = {"type": "object"}
_ACTION_ID: Final = {"type": "string", "pattern": "^act_[0-9a-f]{32}$"}
_WAIT: Final = {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS}
_FLAG: Final = {"type": "boolean", "default": False}
_TENANT: Final = {"type": "string", "description": "The tenant the caller expects."}

_ACTION_PROPERTIES: Final[dict[str, Any]] = {
    "capability_id": {"type": "string", "minLength": 1, "maxLength": 512},
    "input": {"description": "The capability's input (default {})."},
    "action_id": {
        **_ACTION_ID,
        "description": "Your id for this Action (act_ + 32 hex); the same id again returns "
        "the same Action.",
    },
    "mode": {"type": "string", "enum": ["sync", "async", "streaming"]},
    "idempotency_key": {"type": "string", "maxLength": 256},
    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 86_400_000},
    "conversation": _OBJECT,
    "memory_context": {},
    "delegation_chain": {"type": "array", "items": _OBJECT},
    "federation": _OBJECT,
    "callback": _OBJECT,
    "observability": _OBJECT,
    "compliance": _OBJECT,
    "approval": _OBJECT,
    "transaction": _OBJECT,
}


def _closed(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    """A closed object schema: every field it takes is listed."""
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        schema["required"] = list(required)
    return schema


INPUT_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    "aip_capabilities": _closed(
        {
            "capability_id": {"type": "string"},
            "profile": {"type": "string"},
            "query": {"type": "string"},
            "include_schemas": {"type": "boolean", "default": False},
            "include_contracts": {"type": "boolean", "default": False},
            "include_bindings": {"type": "boolean", "default": True},
            "cursor": {"type": "string", "pattern": "^[0-9]{1,9}$"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
        }
    ),
    "aip_call": _closed(
        {
            **_ACTION_PROPERTIES,
            "context": _closed(
                {k: v for k, v in _ACTION_PROPERTIES.items() if k != "capability_id"}
            ),
            "extensions": _closed({EXTENSION_KEY: _OBJECT}),
        },
        "capability_id",
    ),
    "aip_action_status": _closed(
        {
            "action_id": _ACTION_ID,
            "tenant_id": _TENANT,
            "include_result": _FLAG,
            "include_receipts": _FLAG,
            "include_chunks": _FLAG,
            "wait_ms": _WAIT,
        },
        "action_id",
    ),
    "aip_action_result": _closed(
        {
            "action_id": _ACTION_ID,
            "tenant_id": _TENANT,
            "wait_ms": _WAIT,
            "include_receipt": _FLAG,
            "include_terminal_events": _FLAG,
        },
        "action_id",
    ),
    "aip_action_events": _closed(
        {
            "action_id": _ACTION_ID,
            "tenant_id": _TENANT,
            "cursor": {"type": "string", "pattern": "^[0-9]{1,12}$"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
            "kinds": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "kind": {"type": "string", "minLength": 1},
            "include_chunks": _FLAG,
            "follow": _FLAG,
        },
        "action_id",
    ),
    "aip_action_cancel": _closed(
        {"action_id": _ACTION_ID, "reason": {"type": "string"}}, "action_id"
    ),
}

#: One validator per tool, built once (a sync burst decodes thousands of calls).
_VALIDATORS: Final = {
    name: jsonschema.Draft202012Validator(schema) for name, schema in INPUT_SCHEMAS.items()
}

DESCRIPTIONS: Final = {
    "aip_capabilities": (
        "List the AIP capabilities this deployment serves you, one page at a time (`cursor` "
        "from the answer's `next_cursor`, null on the last page; `limit`). Filter by exact "
        "`capability_id`, by `query` (text in the id, name or description) or by binding "
        "`profile`. Input schemas are left out unless `include_schemas` is true: ask for "
        "them with a `capability_id`."
    ),
    "aip_call": (
        "Create and run one AIP Action as you (your credential is the identity; never send "
        "one). The Action's fields are the arguments: `capability_id`, `input`, optional "
        "`action_id` (act_ + 32 hex, yours to reuse with the other tools), `mode` (sync "
        "waits for the result; async returns an ack at once), `timeout_ms`, ... The answer "
        "is the Action's result, or `{action_id, ack}` while it runs."
    ),
    "aip_action_status": (
        "The AIP ActionStatus of an Action you created (`include_result`, `include_chunks`; "
        "`wait_ms` waits up to 30 s for it to end)."
    ),
    "aip_action_result": (
        "The AIP ActionResult of an Action you created once it ended (its ActionStatus "
        "before; `wait_ms` waits up to 30 s)."
    ),
    "aip_action_events": (
        "The events (and with `include_chunks` the stream chunks) of an Action you created, "
        "from `cursor` (the answer's `cursor`), filtered by `kinds`; `follow` waits for more."
    ),
    "aip_action_cancel": (
        "Cancel an Action you created: the answer is its ActionResult once the cancel "
        "settles it, else its ActionStatus."
    ),
}


def invalid(message: str) -> ConnectorError:
    return ConnectorError(ErrorCode.SCHEMA_ENVELOPE_INVALID, message)


def check_arguments(tool: str, arguments: object) -> dict[str, Any]:
    """`arguments` held to the tool's input schema; a clear `schema.envelope.invalid` error
    naming the first offending field otherwise."""
    if not isinstance(arguments, dict):
        raise invalid(f"{tool} takes a JSON object of arguments")
    error = jsonschema.exceptions.best_match(_VALIDATORS[tool].iter_errors(arguments))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "arguments"
        raise invalid(f"{tool}: {where}: {error.message[:300]}")
    return arguments


def action_fields(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The Action fields of checked `aip_call` arguments: the top level, then `context`
    for any field the top level does not carry (the reference's fallback)."""
    context = arguments.get("context") or {}
    fields = {name: arguments[name] for name in ACTION_FIELDS if name in arguments}
    for name, value in context.items():
        fields.setdefault(name, value)
    if fields.get("delegation_chain"):
        raise invalid(
            "delegation_chain is not served by aip_call here: a delegated child arrives as a "
            "DelegationRequest (docs/delegation.md)"
        )
    fields.pop("delegation_chain", None)
    return fields


def extension_fields(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Our extension facts of an `aip_call` (`extensions["org.aip-hermes-worker"]`)."""
    extensions = arguments.get("extensions") or {}
    ours = extensions.get(EXTENSION_KEY) or {}
    return dict(ours)


# --- answers -----------------------------------------------------------------------------


def action_result(action_id: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """The AIP ActionResult of a settled child (a ChildResult's builtins), named by the
    caller's Action id."""
    payload: dict[str, Any] = {"action_id": action_id, "status": result["status"]}
    if result.get("output") is not None:
        payload["output"] = result["output"]
    error = result.get("error")
    if isinstance(error, Mapping):
        payload["error"] = {
            "code": str(error.get("code", ErrorCode.ERROR.value)),
            "message": str(error.get("message", ""))[:1024],
            "category": str(error.get("category", "connector")),
            "retryable": bool(error.get("retryable", False)),
            "details": {"uncertain_outcome": bool(error.get("uncertain_outcome", False))},
        }
    return payload


def action_status(
    action_id: str,
    view: Mapping[str, Any],
    *,
    with_result: bool,
    chunks: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The AIP ActionStatus of a record view (our states are AIP state names)."""
    status: dict[str, Any] = {
        "action_id": action_id,
        "state": view["state"],
        "updated_at": timestamp_of_ms(int(view["updated_at_unix_ms"])),
        "capability_id": view["capability"],
    }
    result = view.get("result")
    if result is not None:
        status["result_status"] = result["status"]
        settled = result.get("settled_at_unix_ms")
        if isinstance(settled, int):
            status["completed_at"] = timestamp_of_ms(settled)
        if with_result:
            status["result"] = action_result(action_id, result)
    if chunks:
        status["chunks"] = list(chunks)
    return status


def read_answer(message_type: str, body_key: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A read tool's `structuredContent`, as the reference facade wraps a read body."""
    return {"message_type": message_type, "body": {body_key: dict(body)}}


def summary_text(structured: Mapping[str, Any]) -> str:
    """The text content beside a read's `structuredContent`, as the reference writes it:
    the object is the structured content (Hermes hands both to the model, so repeating the
    object as text would double what it reads)."""
    message_type = structured.get("message_type")
    return f"AIP {message_type}" if isinstance(message_type, str) else "AIP tool result"


def chunk_of(action_id: str, link: Link) -> dict[str, Any]:
    """The AIP StreamChunk of a chain link, named by the requester's Action id (the bus's
    chunk as published: `sequence` from 0, `kind`, `data`, `part`)."""
    return {**link.body, "action_id": action_id}


def chunk_event(action_id: str, link: Link, verified: bool) -> dict[str, Any]:
    """The AIP Event of one chunk of the Action's chain, the same on every read: id from
    the chunk's hash, kind `stream_chunk.{kind}`, time the chunk's; `data` the StreamChunk's
    fields, its hash and its predecessor's, and whether the chain was checked against the
    Action's signed result."""
    data = {key: value for key, value in link.body.items() if key != "action_id"}
    data["sha256"] = link.sha256
    if link.prev_sha256 is not None:
        data["prev_sha256"] = link.prev_sha256
    data["verified"] = verified
    return {
        "id": f"evt_{link.sha256[:32]}",
        "kind": f"stream_chunk.{link.body['kind']}",
        "occurred_at": timestamp_of_ms(int(link.document["ts_unix_ms"])),
        "action_id": action_id,
        "data": data,
    }


def events_page(
    action_id: str,
    links: Sequence[Link],
    *,
    cursor: int,
    limit: int,
    kinds: frozenset[str],
    verified: bool,
    terminal: bool,
    include_chunks: bool,
) -> dict[str, Any]:
    """One AIP ActionEvents page, for every way in (MCP `aip_action_events`, the bindings'
    `action_events_request`): up to `limit` chunks from sequence `cursor` whose event kind
    `kinds` names (all when empty), as Events (and StreamChunks with `include_chunks`).
    `cursor` is where the next page starts (past every chunk looked at, wanted or not),
    absent once an ended Action's last page was given."""
    events: list[dict[str, Any]] = []
    chunks: list[dict[str, Any]] = []
    following = cursor
    for link in links:
        if link.seq < cursor:
            continue
        if len(events) == limit:
            break
        following = link.seq + 1
        event = chunk_event(action_id, link, verified)
        if kinds and event["kind"] not in kinds:
            continue
        events.append(event)
        if include_chunks:
            chunks.append(chunk_of(action_id, link))
    page: dict[str, Any] = {"action_id": action_id, "events": events, "terminal": terminal}
    if chunks:
        page["chunks"] = chunks
    at_end = not links or following > links[-1].seq
    if not (terminal and at_end):
        page["cursor"] = str(following)
    return page


def call_answer(
    action_id: str, result: Mapping[str, Any] | None, *, state: str, duplicate: bool = False
) -> dict[str, Any]:
    """The MCP result fields (`content` text, `isError`, `structuredContent`, `_meta`) of
    an `aip_call`: the settled ActionResult mapped as the reference maps it, or
    `{action_id, ack}` while the Action runs."""
    meta: dict[str, Any] = {"action_id": action_id}
    if duplicate:  # the same id and contract again: the Action that id already names
        meta["duplicate"] = True
    if result is None:
        status = "queued" if state == "queued" else "accepted"
        ack = {"action_id": action_id, "status": status}
        return {
            "text": json.dumps({"action_id": action_id, "ack": ack}),
            "is_error": False,
            "structured": {"action_id": action_id, "ack": ack},
            "meta": {META_KEY: meta},
        }
    payload = action_result(action_id, result)
    output = payload.get("output")
    error = payload.get("error")
    meta["status"] = payload["status"]
    if error is not None:
        meta["error"] = error
    if output is not None:
        text = json.dumps(output, ensure_ascii=False)
    elif error is not None:
        text = json.dumps({"error": error}, ensure_ascii=False)
    else:
        text = json.dumps({"status": payload["status"]})
    return {
        "text": text,
        "is_error": error is not None or payload["status"] != "completed",
        "structured": output if isinstance(output, dict) else None,
        "meta": {META_KEY: meta},
    }
