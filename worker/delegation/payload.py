"""What Hermes receives for a delegation: the exact `aip_call` arguments and nothing to rewrite.

Spec "Route first-class delegation": the child Action is serialized as `aip_call_arguments`
with `id` renamed to `action_id` and `identity` removed (the authenticated MCP transport
supplies identity); the instructions require Hermes to call `aip_call` exactly once with
those arguments and forbid any other state-changing tool. The deployment's own system
instructions come first; the delegation rules are appended, never replaced by input.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.delegation import ChildAction, DelegationRequest
from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.operator.policy import HermesOperatorPolicy

PAYLOAD_KIND = "aip_delegated_call"

DELEGATION_INSTRUCTIONS = """\

This run is a first-class AIP delegation. The user message is a JSON object of kind
"aip_delegated_call". Its "aip_call_arguments" object is one exact AIP Action contract:
1. Call the `aip_call` tool exactly once, with "aip_call_arguments" as its arguments, byte for
   byte: do not add, remove, rename or change any field, and never replace its "action_id".
2. Do not call any other tool that changes state, and do not call `aip_call` again, even if
   the first call fails or times out.
3. Your final text is not the result: AIP reads the child Action's own result. Report only
   what the tool returned; never invent a result, an approval or an Action id.
"""


def aip_call_arguments(child: ChildAction) -> dict[str, Any]:
    """The child Action as `aip_call` takes it: `id` -> `action_id`, no `identity`."""
    document: dict[str, Any] = msgspec.to_builtins(child)
    document.pop("identity", None)
    arguments = {"action_id": document.pop("id")}
    arguments.update(document)
    return arguments


def delegated_payload(
    policy: HermesOperatorPolicy, request: DelegationRequest, session_id: str
) -> bytes:
    """The `POST /v1/runs` body of a delegation; refused when over `max_input_bytes`."""
    request_input = {
        "kind": PAYLOAD_KIND,
        "delegation_id": request.delegation_id,
        "delegate": request.delegate,
        "aip_call_arguments": aip_call_arguments(request.action),
    }
    serialized = msgspec.json.encode(request_input)
    if len(serialized) > policy.max_input_bytes:
        raise ConnectorError(
            ErrorCode.CONFIGURATION_OR_INPUT,
            f"serialized delegation input is {len(serialized)} bytes, over the "
            f"{policy.max_input_bytes}-byte policy limit",
        )
    body: dict[str, Any] = {
        "input": serialized.decode("utf-8"),
        "session_id": session_id,
        "instructions": policy.system_instructions + DELEGATION_INSTRUCTIONS,
    }
    if policy.model is not None:
        body["model"] = policy.model
    return msgspec.json.encode(body)
