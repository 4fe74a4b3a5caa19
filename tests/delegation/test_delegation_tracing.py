"""A delegation continues one trace (docs/tracing.md): the delegator's publish, the worker's
operator run, its Hermes request, Hermes' `aip_call` over MCP (the fake forwards the run's
W3C context as a traced Hermes does), the gateway's tool span, the child Action it
publishes and the child's executor — one trace id, each step the parent of the next."""

from __future__ import annotations

from schemas.result import ResultStatus
from tests.otel import (
    ReceivedSpan,
    descends,
    in_memory_tracing,
    one,
    otlp_receiver,
    received,
    traced,
)

from .conftest import DelegationStack


async def test_a_delegation_through_the_gateway_continues_the_trace(
    dstack: DelegationStack,
) -> None:
    with in_memory_tracing() as here:
        async with otlp_receiver() as receiver:
            await dstack.stack.spawn("w1", **traced(receiver, "w1"))
            request = dstack.request()
            handle = await dstack.delegate(request)
            result = await handle.result(timeout_s=30)
            assert result.status is ResultStatus.COMPLETED, result.error
            worker = await receiver.wait_for(lambda got: any(s.name == "aip.settle" for s in got))
        local = [received(span) for span in here.get_finished_spans()]

    publish = one(local, "publish aip.hermes.{endpoint}.delegations")
    trace = [s for s in [*local, *worker] if s.trace_id == publish.trace_id]

    def parent(span: ReceivedSpan) -> ReceivedSpan:
        (found,) = [s for s in trace if s.span_id == span.parent_id]
        return found

    process = one(trace, "process aip.hermes.{endpoint}.delegations")
    assert process.parent_id == publish.span_id
    start = one(trace, "POST /v1/runs")
    assert descends(start, process, trace)
    # The fake Hermes continues the run's context into its MCP call, like a traced Hermes.
    tool_spans = [s for s in trace if s.name == "execute_tool aip_call"]
    (hermes_tool,) = [s for s in tool_spans if "gen_ai.tool.name" not in s.attributes]
    assert hermes_tool.parent_id == start.span_id
    # The gateway's server span continues the trace the MCP request carried.
    gateway = [s for s in tool_spans if s.attributes.get("gen_ai.tool.name") == "aip_call"]
    assert [parent(s) for s in gateway] == [hermes_tool]
    (dispatch,) = [
        s
        for s in trace
        if s.name.startswith("publish ") and s.attributes.get("aip.action_id") == request.action.id
    ]
    assert dispatch.parent_id == gateway[0].span_id
    child = [s for s in trace if s.name.startswith("process ") and s.parent_id == dispatch.span_id]
    assert len(child) == 1, [s.name for s in trace]
