"""Model turns: chat completions and the Responses API, each as a sync and a streaming twin.

Both run a full agent turn with tools on the Hermes host, so they are unsafe (medium risk).
Hermes 0.19 honours `Idempotency-Key` (from the verified envelope, never from input) on the
non-streaming forms only, for 300 s in memory; a streamed turn is never deduplicated.

A failed turn can still be HTTP 200: chat completions add a `hermes` block with
`failed: true`, the Responses API reports `status: failed|incomplete`. Those fail the Action
with `remote_rejected` (remote status 200), so automation never reads a failed turn as
completed. Streams classify their terminal events instead (`stream_failed`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas._base import WireStruct
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.errors import ConnectorError
from worker.hermes.sse import SSELimits
from worker.operations import partition
from worker.operations.base import ExecutionContext, OperationSpec, Outcome, Stateless
from worker.operations.calls import HermesCall, JsonOperation, body_of, send
from worker.operations.classifiers import ChatCompletionChunks, ResponseEvents
from worker.operations.input_types import Instructions, Label, Prompt, ProviderObject, ResponseId
from worker.operations.messages import ChatMessage, Messages
from worker.operations.retry import ReadRetryPolicy
from worker.operations.specs import spec
from worker.operations.streaming import Classifier, stream_call

_RESPONSE = "/v1/responses/{response_id}"
Tools = Annotated[list[ProviderObject], msgspec.Meta(max_length=128)]
ResponseItems = Annotated[list[Prompt | ChatMessage], msgspec.Meta(min_length=1, max_length=512)]


class ChatCompletionsInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    messages: Messages
    model: Label | None = None
    tools: Tools | None = None
    tool_choice: Label | ProviderObject | None = None


class ResponsesInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    #: A prompt, or messages/strings whose last one is the turn.
    input: Prompt | ResponseItems
    instructions: Instructions | None = None
    previous_response_id: ResponseId | None = None
    #: A conversation name mapping to its latest response (exclusive with previous id).
    conversation: Label | None = None
    conversation_history: Annotated[list[ChatMessage], msgspec.Meta(max_length=512)] | None = None
    #: Hermes stores responses by default (at most 100, least recently used out).
    store: bool | None = None
    #: `auto` keeps the last 100 history messages.
    truncation: Literal["auto", "disabled"] | None = None
    model: Label | None = None

    def __post_init__(self) -> None:
        if self.conversation is not None and self.previous_response_id is not None:
            raise ValueError("use either `conversation` or `previous_response_id`, not both")


class ResponseRef(WireStruct, kw_only=True, frozen=True):
    response_id: ResponseId


def _turn_failed(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    hermes = body.get("hermes")
    if isinstance(hermes, dict) and hermes.get("failed") is True:
        return True
    return body.get("object") == "response" and body.get("status") in ("failed", "incomplete")


class _Turn(Stateless):
    """One model turn. The sync twin (`chat`, `responses`) sends no `stream` flag and answers
    with the one JSON body, checked for failure, and publishes no chunk; the streaming twin
    (`chat_stream`, `responses_stream`) sends `stream: true` and streams its provider events
    through a classifier (the reference connector's split, one capability per mode)."""

    def __init__(
        self, spec: OperationSpec, classifier: type[Classifier], limits: SSELimits
    ) -> None:
        self.spec = spec
        self.classifier = classifier
        self.limits = limits

    async def execute(self, ctx: ExecutionContext, params: Any) -> Outcome:
        params = await partition.guard(ctx, self.spec.name, params)
        return await partition.screen(ctx, self.spec.name, params, await self._turn(ctx, params))

    async def _turn(self, ctx: ExecutionContext, params: Any) -> Outcome:
        streamed = self.spec.stream_only
        body = body_of(params)
        call = HermesCall(body={**body, "stream": True} if streamed else body)
        if streamed:
            return await stream_call(ctx, self.spec, call, self.classifier(), limits=self.limits)
        response = await send(ctx, self.spec, call)
        if _turn_failed(response.body):
            error = ConnectorError(
                ErrorCode.REMOTE_REJECTED,
                f"{self.spec.method} {self.spec.route} answered 200 for a failed agent turn",
                remote_status=response.status,
            )
            return Outcome(ResultStatus.FAILED, response.body, error)
        return Outcome(ResultStatus.COMPLETED, response.body)


def _ref(params: Any) -> HermesCall:
    return HermesCall(params={"response_id": params.response_id})


_CHAT = "An OpenAI-style chat completion (a full agent turn, tools run server-side)"
_RESPONSES = "A Responses API turn (a full agent turn, tools run server-side)"


def turn_operations(retry: ReadRetryPolicy, limits: SSELimits) -> list[Any]:
    return [
        _Turn(spec("chat", ChatCompletionsInput, _CHAT), ChatCompletionChunks, limits),
        _Turn(
            spec("chat_stream", ChatCompletionsInput, _CHAT + ", streamed as chunks"),
            ChatCompletionChunks,
            limits,
        ),
        _Turn(spec("responses", ResponsesInput, _RESPONSES), ResponseEvents, limits),
        _Turn(
            spec("responses_stream", ResponsesInput, _RESPONSES + ", streamed as chunks"),
            ResponseEvents,
            limits,
        ),
        JsonOperation(
            spec(
                "response_get",
                ResponseRef,
                "A stored response (survives Hermes restarts; at most 100 kept)",
            ),
            _ref,
            retry=retry,
        ),
        JsonOperation(
            spec("response_delete", ResponseRef, "Delete a stored response (cannot be undone)"),
            _ref,
        ),
    ]
