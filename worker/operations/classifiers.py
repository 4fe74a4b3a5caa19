"""Per-stream event classifiers: which chunk each Hermes 0.19 event becomes, and which end it.

Mapping (docs/architecture.md §7, spec "SSE → chunk"):
message deltas → `data`, reasoning → `thought`,
tool progress → `tool`, anything else → `progress`, terminal → `done` or `error`. The
`/v1/runs` stream reads the run-event table it shares with the operator
(worker/operations/run_events.py); the other streams' tables are here. Payloads
are the provider's event objects unchanged, so nothing is lost in translation; outputs are
assembled from them. The event names are those observed on the real server
(`shared/reference/hermes-0.19*.md`); an unknown event is retained as `progress`, never
taken for a terminal.
"""

from __future__ import annotations

from typing import Any

from schemas.chunk import ChunkKind
from worker.hermes.sse import SSEEvent
from worker.operations.run_events import Effect, rule_for
from worker.operations.run_spans import RunSpans
from worker.operations.streaming import Step, Terminal

_TOOL = Step(ChunkKind.TOOL)
_MAX_TEXT = 4 * 1024 * 1024


def _obj(event: SSEEvent) -> dict[str, Any]:
    return event.data if isinstance(event.data, dict) else {}


class _Text:
    """Concatenated deltas, bounded so a long stream cannot grow the output without limit."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._size = 0
        self.truncated = False

    def add(self, value: Any) -> None:
        if not isinstance(value, str) or self.truncated:
            return
        if self._size + len(value) > _MAX_TEXT:
            self.truncated = True
            return
        self._parts.append(value)
        self._size += len(value)

    def text(self) -> str:
        return "".join(self._parts)


#: What a run event's meaning ends the raw `runs` stream with (worker/operations/run_events.py).
_RUN_TERMINALS = {
    Effect.COMPLETED: Terminal.COMPLETED,
    Effect.FAILED: Terminal.FAILED,
    Effect.CANCELLED: Terminal.CANCELLED,
}
#: The spec's "terminal `error` event" of a raw stream: not one of the run table's events.
_ERROR_EVENT = "error"


class RunEvents:
    """`GET /v1/runs/{id}/events`: `data:`-only frames named by their `event` field, read
    through the one run-event table the operator uses too."""

    def __init__(self) -> None:
        self._text = _Text()
        self._terminal: dict[str, Any] = {}
        #: The run's agent and tool spans (None: untraced); a stream left before its
        #: terminal event leaves them unended, and unended spans are never exported.
        self._spans = RunSpans.open()

    def step(self, event: SSEEvent) -> Step:
        data = _obj(event)
        name = event.name
        if self._spans is not None:
            self._spans.see(name, data)
        if name == _ERROR_EVENT:
            if self._spans is not None:
                self._spans.close(error=_ERROR_EVENT, event=name)
            self._terminal = data
            return Step(None, data, Terminal.FAILED)
        rule = rule_for(name)
        terminal = _RUN_TERMINALS.get(rule.effect)
        if terminal is not None:
            self._terminal = data
            return Step(None, data, terminal)
        if rule.effect is Effect.APPROVAL:
            # Progress here: this raw capability keeps following the run (a second
            # subscriber would get 404); the operator owns approvals.
            return Step(ChunkKind.PROGRESS, data)
        if name == "message.delta":
            self._text.add(data.get("delta"))
        return Step(rule.kind, data)

    def output(self) -> Any:
        return {
            "event": self._terminal.get("event"),
            "output": self._terminal.get("output"),
            "usage": self._terminal.get("usage"),
            "error": self._terminal.get("error"),
            "streamed_text": self._text.text(),
        }


class ChatCompletionChunks:
    """`POST /v1/chat/completions` with `stream: true`: unnamed chunks, tool frames, `[DONE]`."""

    def __init__(self) -> None:
        self._text = _Text()
        self._id: Any = None
        self._model: Any = None
        self._finish: Any = None
        self._usage: Any = None
        self._hermes: Any = None

    def step(self, event: SSEEvent) -> Step:
        if event.is_done_marker:
            return Step(None, {"finish_reason": self._finish}, Terminal.COMPLETED)
        data = _obj(event)
        if event.name == "hermes.tool.progress":
            return _TOOL
        if event.name == "error":
            return Step(None, data, Terminal.FAILED)
        self._id = data.get("id", self._id)
        self._model = data.get("model", self._model)
        if "usage" in data:
            self._usage = data["usage"]
        choice = _first_choice(data)
        raw_delta = choice.get("delta")
        delta: dict[str, Any] = raw_delta if isinstance(raw_delta, dict) else {}
        finish = choice.get("finish_reason")
        if finish is not None:
            self._finish = finish
            if finish == "error" or "error" in data:
                # Hermes' failed turn: a finish chunk with an error, then `[DONE]`.
                self._hermes = data.get("hermes")
                return Step(None, data, Terminal.FAILED)
        if delta.get("content"):
            self._text.add(delta["content"])
            return Step(ChunkKind.DATA, data)
        if delta.get("reasoning") or delta.get("reasoning_content"):
            return Step(ChunkKind.THOUGHT, data)
        return Step(ChunkKind.PROGRESS, data)

    def output(self) -> Any:
        return {
            "id": self._id,
            "model": self._model,
            "content": self._text.text(),
            "finish_reason": self._finish,
            "usage": self._usage,
            "hermes": self._hermes,
        }


def _first_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else {}


_TOOL_ITEMS = frozenset({"function_call", "function_call_output"})
_RESPONSE_TERMINALS = {
    "response.completed": Terminal.COMPLETED,
    "response.failed": Terminal.FAILED,
    "response.incomplete": Terminal.FAILED,
    "error": Terminal.FAILED,
}


class ResponseEvents:
    """`POST /v1/responses` with `stream: true`: named `response.*` events, no `[DONE]`."""

    def __init__(self) -> None:
        self._response: Any = None

    def step(self, event: SSEEvent) -> Step:
        data = _obj(event)
        name = event.name
        terminal = _RESPONSE_TERMINALS.get(name)
        if terminal is not None:
            self._response = data.get("response", data)
            return Step(None, data, terminal)
        if name == "response.output_text.delta":
            return Step(ChunkKind.DATA, data)
        if name.startswith("response.reasoning"):
            return Step(ChunkKind.THOUGHT, data)
        if name.startswith("response.output_item."):
            item = data.get("item")
            if isinstance(item, dict) and item.get("type") in _TOOL_ITEMS:
                return Step(ChunkKind.TOOL, data)
        return Step(ChunkKind.PROGRESS, data)

    def output(self) -> Any:
        return self._response


class SessionChatEvents:
    """`POST /api/sessions/{id}/chat/stream`: named events, `run.completed`, then `done`."""

    def __init__(self) -> None:
        self._completed: Any = None
        self._content: Any = None

    def step(self, event: SSEEvent) -> Step:
        data = _obj(event)
        name = event.name
        if name == "assistant.delta":
            return Step(ChunkKind.DATA, data)
        if name == "tool.progress" and data.get("tool_name") == "_thinking":
            # Hermes' reasoning callback surfaces as a pseudo-tool on this route.
            return Step(ChunkKind.THOUGHT, data)
        if name.startswith("tool."):
            return Step(ChunkKind.TOOL, data)
        if name == "assistant.completed":
            self._content = data.get("content")
        elif name == "run.completed":
            self._completed = data
        elif name == "done":
            return Step(None, data, Terminal.COMPLETED)
        elif name == "error":
            return Step(None, data, Terminal.FAILED)
        return Step(ChunkKind.PROGRESS, data)

    def output(self) -> Any:
        completed = self._completed if isinstance(self._completed, dict) else {}
        return {
            "session_id": completed.get("session_id"),
            "message_id": completed.get("message_id"),
            "content": self._content,
            "messages": completed.get("messages"),
            "usage": completed.get("usage"),
        }
