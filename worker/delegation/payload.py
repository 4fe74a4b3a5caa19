"""What Hermes receives for a delegation: the exact `aip_call` arguments and nothing to rewrite.

Spec "Route first-class delegation": the child Action is serialized as `aip_call_arguments`,
the AIP Action with `id` renamed to `action_id` and `identity` removed (the authenticated MCP
transport supplies identity), as the reference `aip_call` takes it; the instructions require
Hermes to call `aip_call` exactly once with those arguments and forbid any other
state-changing tool. The deployment's own system
instructions come first; the delegation rules are appended, never replaced by input.
"""

from __future__ import annotations

from typing import Any

from schemas.delegation import ChildAction, DelegationRequest
from worker.gateway.facade import EXTENSION_KEY
from worker.operator.policy import HermesOperatorPolicy
from worker.operator.start import run_body
from worker.wire.actions import action_extension, aip_action_body

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
    """The child Action as the reference `aip_call` takes it: the AIP Action's fields at the
    top level, `id` -> `action_id`, no `identity`, and our facts with no AIP field
    (`created_at_unix_ms`, `delegation`, …) under `extensions["org.aip-hermes-worker"]`."""
    body = aip_action_body(child)
    body.pop("identity", None)
    arguments = {"action_id": body.pop("id"), **body}
    arguments["extensions"] = {EXTENSION_KEY: action_extension(child)}
    return arguments


def delegated_payload(
    policy: HermesOperatorPolicy, request: DelegationRequest, session_id: str
) -> bytes:
    """The `POST /v1/runs` body of a delegation; refused when over `max_input_bytes`."""
    request_input: dict[str, Any] = {
        "kind": PAYLOAD_KIND,
        "delegation_id": request.delegation_id,
        "delegate": request.delegate,
        "aip_call_arguments": aip_call_arguments(request.action),
    }
    return run_body(
        policy,
        request_input,
        session_id,
        what="delegation",
        extra_instructions=DELEGATION_INSTRUCTIONS,
    )
