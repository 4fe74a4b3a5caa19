"""Items 8 and 9: delegation routed to two isolated Hermes instances, and Hermes' tool use
through the authenticated gateway.

A delegation to `agent:hermes_operator:A` must reach Hermes A only, which calls `aip_call`
over MCP as its own principal; the gateway dispatches the exact child, a capability of the
*other* instance B (`cap:hermes_agent:B:models`), which B's workers execute and settle. The
delegation's result is that child's verified native result; both Actions keep their
receipts. A delegation published on the wrong endpoint's subject is refused before any run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from schemas.audit import ReceiptEvent
from schemas.delegation import DELEGATE_PREFIX, DelegationRequest
from schemas.errors import ErrorCode
from schemas.ids import capability_id
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import envelope_msg_id
from worker.delegation.action_id import delegation_action_id
from worker.errors import McpHttpRefused
from worker.gateway.mcp_client import call_tool
from worker.operator.binding import session_id_for
from worker.qualify.deployment import Deployment, Evidence
from worker.qualify.items import Context, expect
from worker.qualify.operator_items import cite, count

#: The child every delegation asks for: a read of the other instance.
CHILD_OPERATION = "models"


async def _delegated(
    d: Deployment, evidence: Evidence, delegate: str, other: str
) -> tuple[DelegationRequest, ActionResult]:
    """Delegate the other instance's model list to `delegate`; its verified result."""
    request = d.delegation(delegate, capability_id(other, CHILD_OPERATION), {})
    await d.approve(request.action)
    handle = await d.delegate(request)
    evidence.action(handle.action_id)
    evidence.action(request.action.id)
    result = await handle.result(timeout_s=d.qualify.qualify_timeout_s)
    output = result.output if isinstance(result.output, dict) else {}
    operator = output.get("operator") or {}
    evidence.run(operator.get("run_id"))
    if operator.get("run_id"):
        d.runs.add((delegate, operator["run_id"]))
    expect(
        result.status is ResultStatus.COMPLETED,
        f"delegation {request.delegation_id} to {delegate} ended {result.status.value} "
        f"{result.error.code.value if result.error else ''}",
    )
    return request, result


def _child(result: ActionResult) -> dict[str, Any]:
    output = result.output if isinstance(result.output, dict) else {}
    delegation = output.get("delegation_result")
    child = delegation.get("result") if isinstance(delegation, dict) else None
    return child if isinstance(child, dict) else {}


async def _tool_call_principal(
    d: Deployment, evidence: Evidence, endpoint_id: str, child_id: str
) -> list[str]:
    receipts = await cite(d, evidence, endpoint_id, child_id, ReceiptEvent.TOOL_CALL)
    return [
        str(r.details.get("principal_id"))
        for r in receipts
        if r.event is ReceiptEvent.TOOL_CALL and r.details.get("tool") == "aip_call"
    ]


async def routed_to_each_instance(ctx: Context, evidence: Evidence) -> str:
    first, second = ctx.endpoints(2)
    d = ctx.deployment
    pairs = ((first, second), (second, first))
    done = await asyncio.gather(*(_delegated(d, evidence, a, b) for a, b in pairs))
    for (delegate, other), (request, result) in zip(pairs, done, strict=True):
        child = _child(result)
        expect(
            child.get("action_id") == request.action.id,
            f"delegation to {delegate} returned child {child.get('action_id')}, "
            f"not {request.action.id}",
        )
        principals = await _tool_call_principal(d, evidence, other, request.action.id)
        expect(
            principals == [DELEGATE_PREFIX + delegate],
            f"the child {request.action.id} was created by {principals}, "
            f"not by {DELEGATE_PREFIX + delegate} alone",
        )
        runs = await d.user_turns(
            other, session_id_for(delegation_action_id(request.delegation_id))
        )
        expect(runs is None, f"Hermes {other} ran the delegation meant for {delegate}")
    # The same request for `second`, published on `first`'s subject.
    stray = d.delegation(second, capability_id(first, CHILD_OPERATION), {})
    action_id = delegation_action_id(stray.delegation_id)
    evidence.action(action_id)
    payload = d.client.seal_delegation(stray)
    headers = {"Nats-Msg-Id": envelope_msg_id(action_id, payload)}
    await d.nc.jetstream().publish(d.client.subjects.delegations(first), payload, headers=headers)
    refused = await d.client.handle(first, action_id).result(timeout_s=d.qualify.qualify_timeout_s)
    code = refused.error.code if refused.error else None
    expect(
        code is ErrorCode.HOST_ROUTE_MISMATCH,
        f"a delegation for {second} on {first}'s subject ended {refused.status.value} {code}",
    )
    for endpoint_id in (first, second):
        runs = await d.user_turns(endpoint_id, session_id_for(action_id))
        expect(runs is None, f"Hermes {endpoint_id} ran the misrouted delegation {action_id}")
    await cite(d, evidence, first, action_id, ReceiptEvent.REFUSED, ReceiptEvent.SETTLED)
    return (
        f"{first}→child on {second} and {second}→child on {first}, each aip_call made as "
        f"{DELEGATE_PREFIX}<its endpoint>; a request for {second} on {first}'s subject "
        "refused connector_host.route_mismatch, no run"
    )


async def tool_use_through_gateway(ctx: Context, evidence: Evidence) -> str:
    url, token = ctx.gateway()
    first, second = ctx.endpoints(2)
    d = ctx.deployment
    wanted = capability_id(second, CHILD_OPERATION)
    try:
        # Paged (docs/gateway.md): ask for the wanted capability by its id.
        listed = await call_tool(url, token, "aip_capabilities", {"capability_id": wanted})
    except McpHttpRefused as exc:
        expect(False, f"the gateway refused the driver's token (HTTP {exc.status})")
        raise
    expect(wanted in str(listed.document), f"aip_capabilities does not list {wanted}")
    request, result = await _delegated(d, evidence, first, second)
    child_id = request.action.id
    child = _child(result)
    downstream = await d.client.handle(second, child_id).result(timeout_s=10.0)
    expect(
        downstream.status is ResultStatus.COMPLETED and child.get("output") == downstream.output,
        f"the delegation's child result is not {second}'s native result for {child_id}",
    )
    expect(
        isinstance(downstream.output, dict) and bool(downstream.output.get("data")),
        f"{child_id} returned no model list from {second}",
    )
    parent_id = delegation_action_id(request.delegation_id)
    parent = await cite(d, evidence, first, parent_id, ReceiptEvent.RUN_BOUND, ReceiptEvent.SETTLED)
    executed = await cite(
        d,
        evidence,
        second,
        child_id,
        ReceiptEvent.TOOL_CALL,
        ReceiptEvent.LEASE_ACQUIRED,
        ReceiptEvent.SETTLED,
    )
    for name, receipts, events in (
        (
            "delegation",
            parent,
            {"received", "lease_acquired", "start_claimed", "run_bound", "settled"},
        ),
        ("child", executed, {"received", "lease_acquired", "settled", "tool_call"}),
    ):
        missing = events - {r.event.value for r in receipts}
        expect(not missing, f"the {name}'s receipts lack {sorted(missing)}")
    expect(
        count(executed, ReceiptEvent.SETTLED) == 1 and count(executed, ReceiptEvent.TOOL_CALL) == 1,
        f"child {child_id}: {count(executed, ReceiptEvent.TOOL_CALL)} aip_calls, "
        f"{count(executed, ReceiptEvent.SETTLED)} settles (want 1 and 1)",
    )
    return (
        f"Hermes {first} called aip_call once through the gateway; the exact child {child_id} "
        f"ran once on {second}; receipts of both retained"
    )
