"""Generate the AsyncAPI 3 document of every subject and message (drift-checked by a test).

The actions, results, chunks and escalation subjects carry AIP 1.0 Envelopes: their
messages are named by message type and their payload is the Envelope schema
(`schemas/json/aip.core.v1.*.json`); an Envelope carries its signature in `security`, so
the only NATS header left on them is JetStream's `Nats-Msg-Id`. The other subjects still
carry the internal types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.aip.envelope_schema import PUBLISHED
from schemas.export import AIP_EXPORTED, EXPORTED, render, render_envelope
from subjects.grammar import Subjects

DOC_PATH = Path(__file__).parent / "asyncapi.json"

# (channel id, address template, message, stream, what it is for, who sends)
_CHANNELS: tuple[tuple[str, str, str, str | None, str, str], ...] = (
    (
        "actions",
        "{prefix}.hermes.{endpoint}.actions",
        "aip.core.v1.action",
        "ACTIONS",
        "Actions for one endpoint (work queue), as signed AIP `aip.core.v1.action` "
        "Envelopes (the signature is the Envelope's `security.did` and `security.signature`, "
        "no header). Publishers set Nats-Msg-Id to {action_id}:{first 32 hex digits of the "
        "sha256 of the payload} (any other value is dead-lettered).",
        "publisher",
    ),
    (
        "delegations",
        "{prefix}.hermes.{endpoint}.delegations",
        "aip.agent.v1.delegation_request",
        "DELEGATIONS",
        "Delegation requests routed to agent:hermes_operator:{endpoint} (work queue), as "
        "signed AIP `aip.agent.v1.delegation_request` Envelopes (signed by a trusted gateway "
        "key, in `security`); Nats-Msg-Id {delegation action id}:{sha256 prefix of the "
        "payload}, as for Actions. The outcome is the delegation Action's signed "
        "`aip.core.v1.action_result`, whose `output.delegation_result` is the AIP "
        "DelegationResult.",
        "publisher",
    ),
    (
        "cancel",
        "{prefix}.hermes.{endpoint}.cancel",
        "aip.core.v1.cancel",
        None,
        "Core NATS request/reply: a signed AIP `aip.core.v1.cancel` Envelope (the requester "
        "is its `from`, vouched for by a trusted gateway key's signature in `security`). The "
        "reply is the Action's `aip.core.v1.action_result` (its terminal result once the "
        "cancel settles it, or at once if it had already ended) or an `aip.core.v1.error` "
        "Envelope (refused, or not settled within the wait), signed by the worker's "
        "response key and answering the Cancel (`in_response_to`).",
        "publisher",
    ),
    (
        "chunks",
        "{prefix}.hermes.{endpoint}.chunks.{action_id}",
        "aip.core.v1.stream_chunk",
        "CHUNKS",
        "Typed progress of one Action as unsigned AIP `aip.core.v1.stream_chunk` Envelopes, "
        "sequence 0,1,2…, each naming the sha256 of the previous one's bytes in its "
        "extension (`prev_sha256`) (Nats-Msg-Id {action_id}:{sequence}:{sha256 prefix}).",
        "worker",
    ),
    (
        "results",
        "{prefix}.hermes.{endpoint}.results.{action_id}",
        "aip.core.v1.action_result",
        "RESULTS",
        "The one result of an Action as an AIP `aip.core.v1.action_result` Envelope, signed "
        "by the worker's response key in `security`; its `last_chunk_sha256` anchors the "
        "chunk chain (Nats-Msg-Id {action_id}:result:{sha256 prefix}).",
        "worker",
    ),
    (
        "dlq",
        "{prefix}.hermes.{endpoint}.dlq",
        "aip.lifecycle.v1.action_status",
        "DLQ",
        "Each refused message as an AIP `aip.lifecycle.v1.action_status` Envelope in state "
        "`dead_lettered`, signed by the worker's response key; why, where from, the refused "
        "bytes' size and sha256 and their first AIPD_DLQ_KEEP_BYTES are in "
        "`extensions[\"org.aip-hermes-worker\"].dead_letter`.",
        "worker",
    ),
    (
        "audit",
        "{prefix}.hermes.{endpoint}.audit.{action_id}",
        "aip.audit.v1.receipt_chain",
        "AUDIT",
        "Redacted decision receipts of one Action, each an AIP Receipt in its own "
        "`aip.audit.v1.receipt_chain` Envelope, hash-chained (`previous_hash`); the Envelope "
        "that ends a segment is AIP-signed (Nats-Msg-Id = receipt_id).",
        "worker",
    ),
    (
        "egress",
        "{prefix}.hermes.{endpoint}.egress",
        "ChannelDeliveryAction",
        "EGRESS",
        "A normalized result or escalation bound for a persisted Hermes session (work queue, "
        "Nats-Msg-Id = delivery_id): the signed `aip.core.v1.action` Envelope of the "
        "delivery's `session_chat` Action. Worker to worker: the delivery runs as that "
        "Action, whose chunks and result are on the usual subjects.",
        "worker",
    ),
    (
        "inbound",
        "{prefix}.hermes.{endpoint}.inbound.{session_id}",
        "aip.channel.v1.message_created",
        "INBOUND",
        "Each message of a followed Hermes session (AIPD_CHANNEL_INGRESS_FILE), once, in id "
        "order, as a signed `aip.channel.v1.message_created` Envelope.",
        "worker",
    ),
    (
        "escalations",
        "{prefix}.hermes.{endpoint}.escalations",
        "aip.core.v1.escalation",
        "ESCALATIONS",
        "An Action's terminal state a human must decide, as an AIP `aip.core.v1.escalation` "
        "Envelope signed by the worker's response key, published once right after the "
        "fenced settle, before the result (Nats-Msg-Id = escalation_id, one per Action and "
        "approval generation). Resolve with `aip-hermes-worker escalations resolve`.",
        "worker",
    ),
    (
        "escalation_resolutions",
        "{prefix}.hermes.{endpoint}.escalations.resolved",
        "aip.core.v1.escalation_resolution",
        "ESCALATIONS",
        "Who resolved an escalation, how and why, as an AIP "
        "`aip.core.v1.escalation_resolution` Envelope signed by the person who resolved it "
        "(Nats-Msg-Id {escalation_id}:resolved); the write-once record is in Redis.",
        "publisher",
    ),
    (
        "runtime_queue",
        "{prefix}.runtime.queue.{action_id}",
        "aip.lifecycle.v1.action_status",
        "RUNTIME:QUEUE",
        "The AIP runtime's Action queue entry of a delegated child (last message = current), "
        "as an AIP `aip.lifecycle.v1.action_status` Envelope signed by the gateway key "
        "(extension `record: queue`: the child Action and the authorization context); read "
        "by the delegated-result resolver.",
        "publisher",
    ),
    (
        "runtime_lifecycle",
        "{prefix}.runtime.lifecycle.{action_id}",
        "aip.lifecycle.v1.action_status",
        "RUNTIME:LIFECYCLE",
        "The AIP runtime's lifecycle record and durable result (`result`, an ActionResult) of "
        "a delegated child, as an AIP `aip.lifecycle.v1.action_status` Envelope signed by "
        "the gateway key (extension `record: lifecycle`), written before the queue entry "
        "turns terminal; read by the resolver.",
        "publisher",
    ),
    (
        "runtime_open",
        "{prefix}.runtime.open.{shard}",
        "aip.lifecycle.v1.action_list",
        "RUNTIME:OPEN",
        "One shard (the first hex digit of a child's id) of the gateway's index of open "
        "delegated children (last message = current), as an AIP "
        "`aip.lifecycle.v1.action_list` Envelope signed by the gateway key: an ActionStatus "
        "per open child, `updated_at` when it was added; changed by compare-and-set "
        "(Nats-Expected-Last-Subject-Sequence, no Nats-Msg-Id) and read by the gateways' "
        "recovery sweep.",
        "publisher",
    ),
    (
        "manifest",
        "{prefix}.hermes.{endpoint}.manifest",
        "aip.discovery.v1.manifest_response",
        None,
        "Core NATS request/reply (also NATS micro $SRV): an `aip.discovery.v1.manifest_request` "
        "Envelope in, the signed `aip.discovery.v1.manifest_response` Envelope out (an "
        "`aip.core.v1.error` Envelope for a request that is not readable).",
        "worker",
    ),
)


#: The Nats-Msg-Id each AIP Envelope subject's publisher sets (JetStream's dedupe window;
#: `subjects.grammar`): the hash binds the dedupe slot to the exact bytes, so a forgery
#: published first cannot make the server drop the genuine message as its duplicate.
_MSG_IDS: dict[str, str] = {
    "aip.core.v1.action": "{action_id}:{first 32 hex digits of the sha256 of the payload}",
    "aip.core.v1.action_result": "{action_id}:result:{first 32 hex digits of the sha256 of "
    "the payload}",
    "aip.core.v1.stream_chunk": "{action_id}:{sequence}:{first 32 hex digits of the sha256 "
    "of the payload}",
    "aip.core.v1.escalation": "{escalation_id} (one per Action and approval generation; the "
    "Envelope's bytes are a function of the escalation)",
    "aip.core.v1.escalation_resolution": "{escalation_id}:resolved",
    "aip.channel.v1.message_created": "{endpoint}:{Hermes message id} (also the body's "
    "`delivery.dedupe_id`)",
    "aip.lifecycle.v1.action_status": "{action_id}:queue:create, {action_id}:queue:{state} "
    "or {action_id}:lifecycle:{state} (one per child, store and state); a DLQ entry: "
    "{dlq_id} (the entry's own id)",
    "aip.agent.v1.delegation_request": "{delegation action id}:{first 32 hex digits of "
    "the sha256 of the payload} (the delegation action id is `act_` + 32 hex digits derived "
    "from the delegation_id, `worker.delegation.action_id`)",
    "aip.audit.v1.receipt_chain": "{receipt_id} (our receipt's id; its `data.receipt_id`)",
}
_SIGNATURES: dict[str, str] = {
    "aip.core.v1.action": "Signed by the publisher (a trusted gateway key; unsigned ones "
    "are taken only where AIPD_ALLOW_UNSIGNED_ENVELOPES is on, in development)",
    "aip.core.v1.action_result": "Signed by the worker's response key",
    "aip.core.v1.stream_chunk": "Unsigned (the signed result anchors the chunks' hash chain)",
    "aip.core.v1.escalation": "Signed by the worker's response key",
    "aip.channel.v1.message_created": "Signed by the worker's response key (the follower's)",
    "aip.core.v1.escalation_resolution": "Signed by the person who resolved it (the key "
    "given to `escalations resolve --key`; Redis holds the write-once record)",
    "aip.lifecycle.v1.action_status": "Runtime records: signed by the gateway key (the only "
    "writer); a record no trusted gateway key signed is never evidence, whatever "
    "AIPD_ALLOW_UNSIGNED_ENVELOPES says. DLQ entries: signed by the worker's response key",
    "aip.agent.v1.delegation_request": "Signed by the publisher (a trusted gateway key; "
    "unsigned ones are taken only where AIPD_ALLOW_UNSIGNED_ENVELOPES is on, in development)",
    "aip.audit.v1.receipt_chain": "Unsigned, or signed when it ends a segment (the worker's "
    "response key; a gateway's or person's key for their own receipts)",
}


def _aip_message(message_type: str) -> dict[str, Any]:
    """The AsyncAPI message of an AIP Envelope on a subject."""
    headers: dict[str, Any] = {
        "type": "object",
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "description": f"JetStream deduplication id: {_MSG_IDS[message_type]}.",
            }
        },
    }
    if message_type in {"aip.core.v1.action", "aip.agent.v1.delegation_request"}:
        headers["properties"]["Nats-Msg-Id"]["description"] += (
            " Without it an Action is stored every time and deduplicated by its id in Redis"
            " alone; any other value is dead-lettered (`connector_host.replay`)."
        )
    else:  # workers always set it
        headers["required"] = ["Nats-Msg-Id"]
    return {
        "name": message_type,
        "title": f"{message_type} Envelope",
        "summary": PUBLISHED[message_type],
        "description": f"{_SIGNATURES[message_type]}. An AIP signature is the Envelope's "
        "own: Ed25519 over its canonical JSON without `security.signature`, with the key "
        "as a did:key in `security.did` (and `from.did`). There are no signature headers.",
        "contentType": "application/json",
        "headers": headers,
        "correlationId": {
            "description": "The Envelope's correlation id, copied from an Action into its "
            "answers.",
            "location": "$message.payload#/correlation_id",
        },
        "payload": {"$ref": f"#/components/schemas/{message_type}"},
    }


#: The egress queue's message: an `aip.core.v1.action` Envelope, under its own name because
#: its publisher, signer and Nats-Msg-Id are not the actions subject's.
_EGRESS_MESSAGE = "ChannelDeliveryAction"


def _egress_message() -> dict[str, Any]:
    """The AsyncAPI message of a channel delivery on the egress queue."""
    return {
        "name": _EGRESS_MESSAGE,
        "title": "aip.core.v1.action Envelope (channel delivery)",
        "summary": "A channel delivery: the `session_chat` Action that posts a result or "
        "escalation into a persisted Hermes session; its rule and source in "
        "`extensions[\"org.aip-hermes-worker\"].channel_delivery`.",
        "description": "Signed by the worker's response key (the worker whose settle queued "
        "it); the receiving worker runs it only when a trusted worker key signed it and its "
        "text is what the rule makes of the stored source. There are no signature headers.",
        "contentType": "application/json",
        "headers": {
            "type": "object",
            "properties": {
                "Nats-Msg-Id": {
                    "type": "string",
                    "description": "JetStream deduplication id: the delivery id (the Action's "
                    "id, derived from the rule and the source).",
                }
            },
            "required": ["Nats-Msg-Id"],
        },
        "payload": {"$ref": "#/components/schemas/aip.core.v1.action"},
    }


#: AIP Envelopes sent as core NATS requests (no stream, no Nats-Msg-Id), and their answers.
_REQUESTS: dict[str, str] = {
    "aip.core.v1.cancel": "Signed by the publisher (a trusted gateway key) as the requester "
    "(`from`); unsigned ones are taken only where AIPD_ALLOW_UNSIGNED_ENVELOPES is on. The "
    "reply (to the request's inbox) is an `aip.core.v1.action_result` or `aip.core.v1.error` "
    "Envelope signed by the worker's response key, with `in_response_to` the Cancel's "
    "`message_id`, `to` its `from` and its `correlation_id`",
}


def _request_message(message_type: str) -> dict[str, Any]:
    """The AsyncAPI message of an AIP Envelope sent as a core NATS request."""
    return {
        "name": message_type,
        "title": f"{message_type} Envelope",
        "summary": PUBLISHED[message_type],
        "description": f"{_REQUESTS[message_type]}. An AIP signature is the Envelope's own "
        "(`security`); there are no signature headers.",
        "contentType": "application/json",
        "correlationId": {
            "description": "The Envelope's correlation id, copied into the answer.",
            "location": "$message.payload#/correlation_id",
        },
        "payload": {"$ref": f"#/components/schemas/{message_type}"},
    }


def _stream_name(subjects: Subjects, stream: str) -> str:
    owner, _, kind = stream.rpartition(":")
    return subjects.runtime_stream_name(kind) if owner == "RUNTIME" else subjects.stream_name(kind)


def document(prefix: str = "aip") -> dict[str, Any]:
    subjects = Subjects(prefix)
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for name in EXPORTED:
        schemas[name] = json.loads(render(name))
    for message_type in AIP_EXPORTED:
        schemas[message_type] = json.loads(render_envelope(message_type))
    for channel_id, address, message, stream, description, sender in _CHANNELS:
        params = {
            p: {"description": f"the {p.replace('_', ' ')}"}
            for p in ("endpoint", "action_id", "session_id", "shard")
            if "{" + p + "}" in address
        }
        channel: dict[str, Any] = {
            "address": address.replace("{prefix}", prefix),
            "description": description
            + (f" Stream {_stream_name(subjects, stream)}." if stream else ""),
            "messages": {message: {"$ref": f"#/components/messages/{message}"}},
        }
        if params:
            channel["parameters"] = params
        channels[channel_id] = channel
        operations[f"{channel_id}_{'send' if sender == 'publisher' else 'receive'}"] = {
            "action": "send" if sender == "publisher" else "receive",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "summary": f"{sender} side of {channel_id}",
        }
        if message == _EGRESS_MESSAGE:
            messages[message] = _egress_message()
            continue
        if message in _MSG_IDS:
            messages[message] = _aip_message(message)
            continue
        if message in _REQUESTS:
            messages[message] = _request_message(message)
            continue
        messages[message] = {
            "name": message,
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{message}"},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "aip-hermes-worker",
            "version": "0.1.0",
            "description": "Subjects and messages between AIP publishers and Hermes workers.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": schemas},
    }


def render_document(prefix: str = "aip") -> str:
    return json.dumps(document(prefix), indent=2, sort_keys=True) + "\n"


def export(path: Path = DOC_PATH) -> Path:
    path.write_text(render_document(), encoding="utf-8")
    return path


def drifted(path: Path = DOC_PATH) -> bool:
    return not path.exists() or path.read_text(encoding="utf-8") != render_document()
