"""OpenTelemetry tracing across processes (docs/tracing.md): the publisher's trace runs
through the worker's admission, lease, Hermes calls, chunk batches, settle and result, a
takeover links to the delivery it took over, and with tracing off nothing is added.

The test process records its own spans (the `AipClient` publish) with the SDK's in-memory
exporter; the workers are real `python -m worker run` processes exporting OTLP/HTTP to a
receiver the test runs (`otlp_receiver.py`), so a trace is checked as a backend sees it.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from schemas.result import ResultStatus
from tests.aip_actions import action_envelope, canonical, key_of_nkey_seed, sign
from tests.integration.stack import ENDPOINT, Stack
from tests.otel import (
    OtlpReceiver,
    ReceivedSpan,
    descends,
    in_memory_tracing,
    one,
    otlp_receiver,
    parent_of,
    received,
    traced,
)
from worker import tracing
from worker.testing.identities import ISSUER, REVISION, USER_UNTENANTED
from worker.testing.scenario import SLOW_REPLY, TOOL_ECHO

PUBLISH_ACTIONS = "publish aip.hermes.{endpoint}.actions"
PROCESS_ACTIONS = "process aip.hermes.{endpoint}.actions"


@pytest.fixture
def client_spans() -> Iterator[InMemorySpanExporter]:
    with in_memory_tracing() as exporter:
        yield exporter


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with otlp_receiver() as running:
        yield running


def published(client_spans: InMemorySpanExporter) -> ReceivedSpan:
    """The client's one Action publish: the root of the trace."""
    (publish,) = [s for s in client_spans.get_finished_spans() if s.name == PUBLISH_ACTIONS]
    return received(publish)


async def test_a_streamed_operator_run_is_one_connected_trace(
    stack: Stack, receiver: OtlpReceiver, client_spans: InMemorySpanExporter
) -> None:
    assert stack.fake is not None
    await stack.spawn("w1", **traced(receiver, "w1"))
    action = stack.action("operator", {"objective": "summarize the traced run"})
    await stack.approve(action)
    handle = await stack.client.publish(action)
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error

    publish = published(client_spans)
    trace_id = publish.trace_id
    assert publish.attributes["messaging.system"] == "nats"
    spans = await receiver.wait_for(lambda got: any(s.name == PROCESS_ACTIONS for s in got))
    ours = [s for s in spans if s.trace_id == trace_id]
    # Every span the worker exported belongs to the publisher's trace, but for its probes
    # of Hermes (its key, its features: traces of their own, no Action in them).
    others = {(s.name, s.parent_id) for s in spans if s.trace_id != trace_id}
    assert others <= {("GET /v1/models", ""), ("GET /v1/capabilities", "")}, others

    process = one(ours, PROCESS_ACTIONS)
    assert process.parent_id == publish.span_id  # continued from the NATS headers
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.destination.name"] == f"aip.hermes.{ENDPOINT}.actions"
    for child in ("aip.admission", "aip.lease", "aip.execute operator", "aip.settle"):
        assert one(ours, child).parent_id == process.span_id, child
    execute = one(ours, "aip.execute operator")
    assert execute.attributes["aip.action_id"] == action.id
    assert execute.attributes["aip.fence"] == 1
    assert execute.links == ()
    # Redis scripts are spans named by script, under the step that called them.
    assert one(ours, "EVALSHA lease_acquire").parent_id == one(ours, "aip.lease").span_id

    def under(span: ReceivedSpan, ancestor: ReceivedSpan) -> bool:
        return descends(span, ancestor, ours)

    # The Hermes calls are client spans under the execution, and Hermes got their context.
    start = one(ours, "POST /v1/runs")
    assert under(start, execute)
    assert start.attributes["http.response.status_code"] in (200, 201, 202)
    (sent,) = [r for r in stack.fake.requests() if r.route == "POST /v1/runs"]
    assert parent_of(sent.headers["traceparent"]) == (trace_id, start.span_id)

    # Chunks: one producer span per batch (not per chunk), and each chunk names its batch.
    batches = [s for s in ours if s.name == "publish aip.hermes.{endpoint}.chunks.{action_id}"]
    assert batches
    assert all(under(b, execute) for b in batches)
    chunks = await stack.stream_messages_with_headers(
        "chunks", stack.subjects.chunks(ENDPOINT, action.id)
    )
    assert len(batches) < len(chunks)
    batch_parents = {(trace_id, b.span_id) for b in batches}
    streamed = [parent_of(headers["traceparent"]) for _, headers in chunks[:-1]]  # not terminal
    assert set(streamed) <= batch_parents
    assert sum(b.attributes["messaging.batch.message_count"] for b in batches) == len(streamed)

    # The settle publishes the result, carrying its own span's context.
    result_span = one(ours, "publish aip.hermes.{endpoint}.results.{action_id}")
    assert under(result_span, one(ours, "aip.settle"))
    ((_, headers),) = await stack.stream_messages_with_headers(
        "results", stack.subjects.results(ENDPOINT, action.id)
    )
    assert parent_of(headers["traceparent"]) == (trace_id, result_span.span_id)


async def test_a_runs_tool_call_is_an_execute_tool_span_under_its_agent_span(
    stack: Stack, receiver: OtlpReceiver, client_spans: InMemorySpanExporter
) -> None:
    """Hermes exports no trace of its own: the agent and tool spans come from its run
    events (worker/operations/run_spans.py), under the execution that followed them."""
    await stack.spawn("w1", **traced(receiver, "w1"))
    action = stack.action("operator", {"objective": f"{TOOL_ECHO} trace the tool"})
    await stack.approve(action)
    result = await (await stack.client.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    trace_id = published(client_spans).trace_id
    spans = await receiver.wait_for(
        lambda got: any(s.name == "invoke_agent hermes" for s in got)
        and any(s.name == PROCESS_ACTIONS for s in got)
    )
    ours = [s for s in spans if s.trace_id == trace_id]
    agent = one(ours, "invoke_agent hermes")
    assert descends(agent, one(ours, "aip.execute operator"), ours)
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["aip.run.terminal_event"] == "run.completed"
    tool = one(ours, "execute_tool terminal")
    assert tool.parent_id == agent.span_id
    assert tool.attributes["gen_ai.tool.name"] == "terminal"


async def test_a_takeover_links_to_the_delivery_it_took_over(
    stack: Stack, receiver: OtlpReceiver, client_spans: InMemorySpanExporter
) -> None:
    # w1's event loop stalls mid-stream for four lease TTLs (its exporter thread still
    # sends): long enough for w2 to start and take over on a loaded machine (a CI run saw
    # w1 wake and settle first with a 6 s stall).
    await stack.spawn("w1", fault_points="mid_stream=sleep:12", **traced(receiver, "w1"))
    action = stack.action("operator", {"objective": f"{SLOW_REPLY} take the trace over"})
    await stack.approve(action)
    handle = await stack.client.publish(action)
    await receiver.wait_for(lambda got: any(s.name == "aip.lease" for s in got))
    await stack.spawn("w2", **traced(receiver, "w2"))
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w2"

    def taken_over(got: list[ReceivedSpan]) -> bool:
        return any(s.name == "aip.execute operator" and s.attributes["aip.fence"] == 2 for s in got)

    spans = await receiver.wait_for(taken_over)
    trace_id = published(client_spans).trace_id
    first_lease = [
        s for s in spans if s.name == "aip.lease" and s.resource["service.instance.id"] == "w1"
    ]
    second = one(spans, "aip.execute operator", **{"aip.fence": 2})
    assert second.resource["service.instance.id"] == "w2"
    assert second.trace_id == trace_id  # the redelivery continues the publisher's trace
    assert second.attributes["aip.takeover"] is True
    assert second.links == ((trace_id, first_lease[0].span_id),)


async def test_with_tracing_off_no_trace_header_is_published(stack: Stack) -> None:
    await stack.spawn("w1", OTEL_SDK_DISABLED="true", OTEL_EXPORTER_OTLP_ENDPOINT="http://x")
    action = stack.action("operator", {"objective": "summarize untraced"})
    await stack.approve(action)
    assert not tracing.enabled()
    result = await (await stack.client.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    messages = await stack.stream_messages_with_headers(
        "chunks", stack.subjects.chunks(ENDPOINT, action.id)
    ) + await stack.stream_messages_with_headers(
        "results", stack.subjects.results(ENDPOINT, action.id)
    )
    assert messages
    assert not [h for _, h in messages if "traceparent" in h or "tracestate" in h]
    assert stack.fake is not None
    assert all("traceparent" not in r.headers for r in stack.fake.requests())


def test_tracing_off_creates_no_sdk_object() -> None:
    """Configured off, a process that loads the worker and the client and goes through
    every helper holds no tracer provider, tracer or span of the SDK, and the helpers
    touch no header. (redis-py imports parts of OpenTelemetry on its own when installed,
    so the modules alone prove nothing; the objects do.)"""
    code = (
        "import gc, sys, worker.app, worker.client, worker.logs\n"
        "from worker import tracing\n"
        "assert not tracing.configure('aip-hermes-worker', env={})\n"
        "headers = {'Nats-Msg-Id': 'x'}\n"
        "tracing.inject(headers)\n"
        "assert headers == {'Nats-Msg-Id': 'x'}\n"
        "assert tracing.start('x') is None and tracing.log_ids() is None\n"
        "with tracing.span('x', kind='consumer') as current:\n"
        "    assert current is None\n"
        "sdk = sys.modules.get('opentelemetry.sdk.trace')\n"
        "kinds = (sdk.TracerProvider, sdk.Tracer, sdk.Span) if sdk else ()\n"
        "print(sum(1 for o in gc.get_objects() if kinds and isinstance(o, kinds)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "0"


async def test_the_result_envelope_carries_the_trace_inside_its_signature(
    stack: Stack, receiver: OtlpReceiver, client_spans: InMemorySpanExporter
) -> None:
    """`Envelope.trace` of the signed result names a span of the publisher's trace, as the
    result's NATS headers do (an AIP reader of the Envelope alone sees the trace)."""
    await stack.spawn("w1", **traced(receiver, "w1"))
    action = stack.action("models")
    result = await (await stack.client.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    trace_id = published(client_spans).trace_id
    spans = await receiver.wait_for(lambda got: any(s.name == "aip.settle" for s in got))
    ((data, headers),) = await stack.stream_messages_with_headers(
        "results", stack.subjects.results(ENDPOINT, action.id)
    )
    envelope = json.loads(data)
    sealed_in = parent_of(envelope["trace"]["traceparent"])
    assert sealed_in[0] == trace_id == parent_of(headers["traceparent"])[0]
    assert sealed_in[1] in {s.span_id for s in spans if s.trace_id == trace_id}
    # Content-addressed Envelopes carry none: the Action seals to the same bytes each time,
    # under any span.
    with tracing.span("republish"):
        assert stack.client.seal_action(action) == stack.client.seal_action(action)
        assert "trace" not in json.loads(stack.client.seal_action(action))


async def test_a_worker_continues_the_trace_an_envelope_carries_without_headers(
    stack: Stack, receiver: OtlpReceiver
) -> None:
    """An AIP publisher that writes W3C context only into the signed Envelope's `trace`
    (no NATS headers at all) is continued by the worker's delivery span."""
    await stack.spawn("w1", **traced(receiver, "w1"))
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    envelope = action_envelope(
        endpoint=ENDPOINT, principal=USER_UNTENANTED, issuer=ISSUER, revision=REVISION
    )
    envelope["trace"] = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    signed = canonical(sign(envelope, key_of_nkey_seed(stack.trust.seed)))
    result = await (await stack.publish_envelope(signed)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    spans = await receiver.wait_for(lambda got: any(s.name == PROCESS_ACTIONS for s in got))
    process = one([s for s in spans if s.trace_id == trace_id], PROCESS_ACTIONS)
    assert process.parent_id == parent_id
