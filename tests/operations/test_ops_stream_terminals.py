"""Stream terminals are explicit: each family's success, failure and silence, from wire bytes.

These feed recorded-shape frames through the real decoder and `follow`, so the events the
fake Hermes never produces on its own (`response.failed`, `response.incomplete`, a terminal
`error`, a chat finish with an error) are covered too.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest
from ops_harness import endpoint_for, make_action

from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from tests.recording import RecordingContext
from worker.errors import ConnectorError
from worker.hermes.sse import SSEDecoder, SSEEvent, parse_event
from worker.operations import classifiers
from worker.operations.streaming import Classifier, follow


class WireStream:
    """What `follow` reads, from raw SSE bytes."""

    def __init__(self, wire: str) -> None:
        self.wire = wire.encode()

    async def events(self) -> AsyncGenerator[SSEEvent, None]:
        for raw in SSEDecoder().feed(self.wire):
            yield parse_event(raw)


async def run(
    wire: str, classifier: Classifier, run_id: str | None = None
) -> tuple[Any, RecordingContext]:
    ctx = RecordingContext(
        action=make_action("run_events", {}), endpoint=endpoint_for("http://127.0.0.1:1", None)
    )
    try:
        outcome = await follow(ctx, WireStream(wire), classifier, what="test", run_id=run_id)
    except ConnectorError as exc:
        return exc, ctx
    return outcome, ctx


def frame(data: str, event: str | None = None) -> str:
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"


RUN_ID = "run_" + "a" * 32
DELTA = frame('{"event":"message.delta","run_id":"' + RUN_ID + '","delta":"Hi"}')


@pytest.mark.parametrize(
    ("terminal", "status", "kind"),
    [
        ('{"event":"run.completed","output":"Hi"}', ResultStatus.COMPLETED, ChunkKind.DONE),
        ('{"event":"run.failed","error":"HTTP 400: bad"}', ResultStatus.FAILED, ChunkKind.ERROR),
        ('{"event":"run.cancelled"}', ResultStatus.CANCELLED, ChunkKind.DONE),
        ('{"event":"error","message":"boom"}', ResultStatus.FAILED, ChunkKind.ERROR),
    ],
)
async def test_run_stream_terminals(terminal: str, status: ResultStatus, kind: ChunkKind) -> None:
    wire = DELTA + ": keepalive\n\n" + frame(terminal) + ": stream closed\n\n"
    outcome, ctx = await run(wire, classifiers.RunEvents(), RUN_ID)
    assert outcome.status is status
    assert ctx.kinds() == [ChunkKind.DATA, kind]
    assert all(c.run_id == RUN_ID for c in ctx.chunks)
    if status is ResultStatus.FAILED:
        assert outcome.error.code is ErrorCode.STREAM_FAILED
    else:
        assert outcome.error is None


async def test_run_stream_maps_reasoning_tools_and_approvals() -> None:
    wire = (
        frame('{"event":"tool.started","tool":"terminal"}')
        + frame('{"event":"approval.request","command":"chmod 777 f"}')
        + frame('{"event":"approval.responded","choice":"once"}')
        + frame('{"event":"tool.completed","tool":"terminal"}')
        + frame('{"event":"reasoning.available","text":"t"}')
        + frame('{"event":"run.completed","output":"x"}')
    )
    outcome, ctx = await run(wire, classifiers.RunEvents())
    assert outcome.status is ResultStatus.COMPLETED
    assert ctx.kinds() == [
        ChunkKind.TOOL,
        ChunkKind.PROGRESS,
        ChunkKind.PROGRESS,
        ChunkKind.TOOL,
        ChunkKind.THOUGHT,
        ChunkKind.DONE,
    ]


@pytest.mark.parametrize(
    "family",
    [
        classifiers.RunEvents,
        classifiers.ChatCompletionChunks,
        classifiers.ResponseEvents,
        classifiers.SessionChatEvents,
    ],
)
async def test_a_stream_closing_without_a_terminal_is_incomplete_never_success(
    family: type[Classifier],
) -> None:
    wire = DELTA + frame('{"type":"response.output_text.delta","delta":"x"}', "assistant.delta")
    error, ctx = await run(wire + ": stream closed\n\n", family())
    assert isinstance(error, ConnectorError)
    assert error.code is ErrorCode.STREAM_INCOMPLETE
    assert len(ctx.chunks) == 2
    unsafe = error.to_protocol(endpoint_id="hermes-1", read_only=False)
    assert (unsafe.uncertain_outcome, unsafe.retryable) == (True, False)


CHUNK = (
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,%s}]}'
)


async def test_chat_stream_completes_on_done_marker() -> None:
    wire = (
        frame(CHUNK % '"delta":{"role":"assistant"},"finish_reason":null')
        + frame(CHUNK % '"delta":{"content":"Hel"},"finish_reason":null')
        + frame('{"tool":"terminal","status":"running"}', "hermes.tool.progress")
        + frame(CHUNK % '"delta":{"content":"lo"},"finish_reason":null')
        + frame(CHUNK % '"delta":{},"finish_reason":"stop"')
        + "data: [DONE]\n\n"
    )
    outcome, ctx = await run(wire, classifiers.ChatCompletionChunks())
    assert outcome.status is ResultStatus.COMPLETED
    assert outcome.output["content"] == "Hello"
    assert outcome.output["finish_reason"] == "stop"
    assert ctx.kinds() == [
        ChunkKind.PROGRESS,
        ChunkKind.DATA,
        ChunkKind.TOOL,
        ChunkKind.DATA,
        ChunkKind.PROGRESS,
        ChunkKind.DONE,
    ]


async def test_chat_stream_error_finish_fails_the_action() -> None:
    failed = (
        '"delta":{},"finish_reason":"error"}],"error":{"message":"HTTP 400","type":"agent_error"},'
        '"hermes":{"failed":true'
    )
    wire = (
        frame(CHUNK % '"delta":{"role":"assistant"},"finish_reason":null')
        + frame(CHUNK.replace("}]}", "}}") % failed)
        + "data: [DONE]\n\n"
    )
    outcome, ctx = await run(wire, classifiers.ChatCompletionChunks())
    assert outcome.status is ResultStatus.FAILED
    assert outcome.error.code is ErrorCode.STREAM_FAILED
    assert outcome.output["hermes"] == {"failed": True}
    assert ctx.chunks[-1].kind is ChunkKind.ERROR


@pytest.mark.parametrize(
    ("terminal", "status"),
    [
        ("response.completed", ResultStatus.COMPLETED),
        ("response.failed", ResultStatus.FAILED),
        ("response.incomplete", ResultStatus.FAILED),
        ("error", ResultStatus.FAILED),
    ],
)
async def test_responses_stream_terminals(terminal: str, status: ResultStatus) -> None:
    wire = (
        frame('{"type":"response.created","response":{"id":"r"}}', "response.created")
        + frame(
            '{"type":"response.output_item.added","item":{"type":"function_call"}}',
            "response.output_item.added",
        )
        + frame(
            '{"type":"response.reasoning_text.delta","delta":"t"}', "response.reasoning_text.delta"
        )
        + frame('{"type":"response.output_text.delta","delta":"Hi"}', "response.output_text.delta")
        + frame('{"type":"' + terminal + '","response":{"id":"r","status":"x"}}', terminal)
    )
    outcome, ctx = await run(wire, classifiers.ResponseEvents())
    assert outcome.status is status
    assert ctx.kinds()[:4] == [
        ChunkKind.PROGRESS,
        ChunkKind.TOOL,
        ChunkKind.THOUGHT,
        ChunkKind.DATA,
    ]
    assert ctx.chunks[-1].provider_event == terminal
    if status is ResultStatus.FAILED:
        assert outcome.error.code is ErrorCode.STREAM_FAILED


@pytest.mark.parametrize(
    ("terminal", "status"), [("done", ResultStatus.COMPLETED), ("error", ResultStatus.FAILED)]
)
async def test_session_chat_stream_terminals(terminal: str, status: ResultStatus) -> None:
    wire = (
        frame('{"message_id":"m","delta":"Hi","seq":3}', "assistant.delta")
        + frame('{"tool_name":"_thinking","delta":"Hi","seq":4}', "tool.progress")
        + frame('{"tool_name":"terminal","seq":5}', "tool.started")
        + frame('{"session_id":"s","messages":[],"usage":{},"seq":6}', "run.completed")
        + frame('{"message":"boom","seq":7}' if terminal == "error" else '{"seq":7}', terminal)
    )
    outcome, ctx = await run(wire, classifiers.SessionChatEvents())
    assert outcome.status is status
    assert ctx.kinds()[:4] == [
        ChunkKind.DATA,
        ChunkKind.THOUGHT,
        ChunkKind.TOOL,
        ChunkKind.PROGRESS,
    ]


async def test_an_unknown_event_is_progress_never_a_terminal() -> None:
    wire = frame('{"event":"run.finished_somehow"}') + frame('{"event":"run.completed"}')
    outcome, ctx = await run(wire, classifiers.RunEvents())
    assert outcome.status is ResultStatus.COMPLETED
    assert ctx.kinds() == [ChunkKind.PROGRESS, ChunkKind.DONE]
