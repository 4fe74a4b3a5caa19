"""Follow a Hermes event stream: publish chunks as events arrive, end on an explicit terminal.

Each stream family (runs, chat completions, responses, session chat) has a classifier that
maps one provider event to at most one chunk and says whether it is terminal
(`worker.operations.classifiers`). This module owns what is common:

* chunks are emitted in arrival order, before the next event is read;
* a recognized terminal failure (`run.failed`, `response.failed`, `response.incomplete`,
  a terminal `error`, a chat finish with `finish_reason: "error"`) fails the Action with
  `stream_failed`; `run.cancelled` cancels it;
* a stream that closes without a terminal event is `stream_incomplete`, never success;
* the event limit is `stream_truncated`, an undecodable frame is `transport`;
* the whole stream is bounded by the Action's deadline (`deadline_exceeded`).

A read-only stream (run events) is retried only while opening it: once an event has been
read, the provider's single-use stream is consumed and a retry would lose or repeat events.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.errors import ConnectorError
from worker.hermes.http_client import SSEStream
from worker.hermes.sse import SSEEvent, SSELimits
from worker.operations import partition
from worker.operations.base import ExecutionContext, OperationSpec, Outcome, Stateless
from worker.operations.calls import HermesCall, within_deadline
from worker.operations.retry import NO_RETRY, ReadRetryPolicy, retry_read


class Terminal(Enum):
    """How a terminal provider event ends the Action."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: The chunk kind that closes a stream, by terminal.
TERMINAL_CHUNK: dict[Terminal, ChunkKind] = {
    Terminal.COMPLETED: ChunkKind.DONE,
    Terminal.FAILED: ChunkKind.ERROR,
    Terminal.CANCELLED: ChunkKind.DONE,
}
_TERMINAL_STATUS: dict[Terminal, ResultStatus] = {
    Terminal.COMPLETED: ResultStatus.COMPLETED,
    Terminal.FAILED: ResultStatus.FAILED,
    Terminal.CANCELLED: ResultStatus.CANCELLED,
}


@dataclass(frozen=True, slots=True)
class Step:
    """What one event becomes: a chunk (or nothing), and maybe the end of the stream."""

    kind: ChunkKind | None
    payload: Any = None
    terminal: Terminal | None = None


class Classifier(Protocol):
    """Per-stream state: maps events to steps and assembles the Action's output."""

    def step(self, event: SSEEvent) -> Step: ...

    def output(self) -> Any: ...


def emit_kind(step: Step) -> ChunkKind | None:
    """The chunk a step publishes; a terminal always publishes its closing chunk."""
    return TERMINAL_CHUNK[step.terminal] if step.terminal is not None else step.kind


async def follow(
    ctx: ExecutionContext,
    stream: SSEStream,
    classifier: Classifier,
    *,
    what: str,
    run_id: str | None = None,
) -> Outcome:
    """Consume `stream` to its terminal event, publishing each mapped event as a chunk."""
    async with aclosing(stream.events()) as events:
        async for event in events:
            step = classifier.step(event)
            kind = emit_kind(step)
            if kind is not None:
                await ctx.emit(kind, step.payload, provider_event=event.name, run_id=run_id)
            if step.terminal is None:
                continue
            status = _TERMINAL_STATUS[step.terminal]
            error = None
            if step.terminal is Terminal.FAILED:
                error = ConnectorError(ErrorCode.STREAM_FAILED, f"{what} ended with {event.name}")
            return Outcome(status, classifier.output(), error)
    raise ConnectorError(ErrorCode.STREAM_INCOMPLETE, f"{what} closed without a terminal event")


class StreamOperation(Stateless):
    """A streaming request whose events become chunks and whose terminal decides the result."""

    def __init__(
        self,
        spec: OperationSpec,
        build: Callable[[Any], HermesCall],
        classifier: Callable[[], Classifier],
        *,
        limits: SSELimits | None = None,
        retry: ReadRetryPolicy = NO_RETRY,
        run_id_param: str | None = None,
    ) -> None:
        self.spec = spec
        self.build = build
        self.classifier = classifier
        self.limits = limits or SSELimits()
        self.retry = retry
        #: The path parameter whose value is a `/v1/runs` run id, stamped on every chunk.
        self.run_id_param = run_id_param

    async def execute(self, ctx: ExecutionContext, params: Any) -> Outcome:
        params = await partition.guard(ctx, self.spec.name, params)
        return await stream_call(
            ctx,
            self.spec,
            self.build(params),
            self.classifier(),
            limits=self.limits,
            retry=self.retry,
            run_id_param=self.run_id_param,
        )


async def stream_call(
    ctx: ExecutionContext,
    spec: OperationSpec,
    call: HermesCall,
    classifier: Classifier,
    *,
    limits: SSELimits,
    retry: ReadRetryPolicy = NO_RETRY,
    run_id_param: str | None = None,
) -> Outcome:
    """Open the stream of `spec` (retrying the open only for reads) and follow it."""
    what = f"{spec.method} {spec.route}"
    run_id = call.params.get(run_id_param) if run_id_param else None
    async with within_deadline(ctx, what), AsyncExitStack() as stack:

        async def open_stream() -> SSEStream:
            return await stack.enter_async_context(
                ctx.hermes.stream_sse(
                    spec.method,
                    spec.route,
                    call.params,
                    json_body=call.body,
                    query=call.query,
                    headers=ctx.trusted_headers(),
                    limits=limits,
                )
            )

        policy = retry if spec.read_only else NO_RETRY
        stream = await retry_read(policy, ctx.remaining_s, open_stream)
        return await follow(ctx, stream, classifier, what=what, run_id=run_id)
