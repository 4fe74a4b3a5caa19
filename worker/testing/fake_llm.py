"""An OpenAI-compatible fake LLM that makes the real Hermes behave as a test input asks.

The real `hermes-agent==0.19.0` is only useful in tests if its model is predictable. This
server answers Hermes' chat completions according to the scenario words of
`worker.testing.scenario` found in the latest user message, so one input produces the same
run events here as on the project's fake Hermes:

- plain: the reply `reply_text(input)`, streamed as `reply_deltas(input)`;
- TOOL_ECHO / NEEDS_APPROVAL: first a `terminal` tool call (`ECHO_COMMAND` /
  `APPROVAL_COMMAND`), then, once the request carries the tool result, the plain reply
  (NEEDS_TWO_APPROVALS: the approval command a second time first, so Hermes asks twice);
- SLOW_REPLY: `slow_deltas()` (SLOW_DELTAS deltas SLOW_DELTA_DELAY_S apart), so a run stays
  stoppable for a few seconds (HELD_REPLY: HELD_DELTAS deltas, a minute);
- LLM_ERROR: HTTP 400, which Hermes treats as non-retryable and ends the run `run.failed`
  at once (a 5xx would be retried with back-off for minutes);
- a delegated input (JSON of kind DELEGATED_KIND, what `worker.delegation` sends) when the
  request offers AIP_CALL_TOOL (Hermes reached the AIP MCP server): one call of that tool
  with `<aip_call_arguments>` as its arguments, unchanged, then `delegated_final_text` of its
  result. Without the tool it is a plain input, as on a Hermes without the MCP server.
- AIP_DISCOVER_CALL=<capability> when the request offers both `aip_capabilities` and
  `aip_call`: a call of the first (`capability_id`: the capability), then (when it listed the
  capability) a sync `aip_call` on
  it, then `discover_call_final_text`.
- AIP_LIST when the request offers `aip_capabilities`: one call of it per AIP_LIST_CALLS
  entry, then a sentence with the length of each result.

Requests without tools that do not stream are Hermes' auxiliary calls (titles and the like);
they get a short plain answer whatever the input says, so they never add noise to a scenario.

Run it by hand with `python -m worker.testing.fake_llm --port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from aiohttp import web

from worker.testing.scenario import (
    AIP_CALL_TOOL,
    AIP_CAPABILITIES_TOOL,
    AIP_LIST,
    AIP_LIST_CALLS,
    APPROVAL_COMMAND,
    ECHO_COMMAND,
    OFF_CONTRACT,
    SLOW_DELTA_DELAY_S,
    SLOW_DELTAS,
    delegated_arguments,
    delegated_final_text,
    discover_call_capability,
    discover_call_final_text,
    reply_deltas,
    scenario_of,
    word_deltas,
)

MODEL_ID: Final = "fake-model"
#: The answer to auxiliary calls (session titles, summaries).
AUX_ANSWER: Final = "fake-aux-answer"
#: The message of the scenario-chosen HTTP 400; Hermes copies it into `run.failed.error`.
LLM_ERROR_MESSAGE: Final = "fake-llm: scenario-llm-error requested"
#: The tool Hermes exposes for shell commands.
TERMINAL_TOOL: Final = "terminal"

_JSON = dict[str, Any]
#: How Hermes 0.19 fences an `mcp_*` tool's result for the model: an opening tag, one line
#: telling the model the block is data, a blank line, the result, the closing tag.
_UNTRUSTED_RESULT: Final = re.compile(
    r'<untrusted_tool_result source="[^"]*">\n[^\n]*\n\n(?P<body>.*)\n</untrusted_tool_result>',
    re.DOTALL,
)


def slow_deltas(count: int = SLOW_DELTAS) -> list[str]:
    """The deltas of a slow reply: `tick0 tick1 … tick{count-1}` when joined."""
    return [f"tick{i} " for i in range(count - 1)] + [f"tick{count - 1}"]


@dataclass(frozen=True, slots=True)
class ChatCall:
    """What one chat-completion request asked, recorded so tests can see what Hermes sent."""

    user_text: str
    tool_results: tuple[str, ...]
    stream: bool
    has_tools: bool
    #: The names of the tools the request offers the model.
    tool_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _ToolCall:
    name: str
    arguments: _JSON


@dataclass(frozen=True, slots=True)
class _Text:
    deltas: tuple[str, ...]
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Error:
    message: str


_Answer = _ToolCall | _Text | _Error


def _content_text(content: object) -> str:
    """Flatten OpenAI message content (a string or a list of typed parts) to text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def read_call(body: _JSON) -> ChatCall:
    """Find the latest user message and the tool results that came after it.

    Hermes wraps the input in a system prompt and history, so only the last user message says
    what this turn is about; tool messages after it mean the tool call was already answered.
    """
    raw = body.get("messages")
    messages: list[_JSON] = [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    user_text = _content_text(messages[last_user].get("content")) if last_user >= 0 else ""
    tool_results = tuple(
        _content_text(m.get("content"))
        for m in messages[last_user + 1 :]
        if m.get("role") == "tool"
    )
    tools = body.get("tools")
    tool_names = tuple(
        str(tool["function"].get("name"))
        for tool in (tools if isinstance(tools, list) else [])
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    )
    return ChatCall(
        user_text=user_text,
        tool_results=tool_results,
        stream=bool(body.get("stream")),
        has_tools=bool(tools),
        tool_names=tool_names,
    )


def mcp_tool_outcome(content: str) -> tuple[str, bool]:
    """The text and failure flag of an MCP tool result as Hermes 0.19 hands it to the model.

    Hermes encodes the tool's text as `{"result": text}` (with `"structuredContent"` beside it
    when the tool answered structured content: that object is returned, as JSON) and a
    failure as `{"error": message}` (tools/mcp_tool.py), then, from 32 characters on, fences
    it as untrusted data (agent/tool_dispatch_helpers.py). Unwrapping both lets the final
    prose match the fake Hermes, which passes the tool's text on as it is.
    """
    fenced = _UNTRUSTED_RESULT.fullmatch(content)
    if fenced is not None:
        content = fenced.group("body")
    try:
        document = json.loads(content)
    except ValueError:
        return content, False
    if isinstance(document, dict):
        if "error" in document:
            return str(document["error"]), True
        # A structured answer (the AIP facade's reads) is what the model reads of it:
        # `{"result": text, "structuredContent": object}`, or `{"result": object}`.
        structured = document.get("structuredContent", document.get("result"))
        if isinstance(structured, dict):
            return json.dumps(structured, ensure_ascii=False), False
        if isinstance(document.get("result"), str):
            return document["result"], False
    return content, False


def answer_for(call: ChatCall) -> _Answer:
    """Choose the answer.

    A delegated input with the AIP tool on offer is answered before any scenario word is read
    (its contract is data, not instructions); otherwise an error wins over a tool call, which
    wins over a slow reply.
    """
    if not call.stream and not call.has_tools:
        return _Text((AUX_ANSWER,))
    delegated = delegated_arguments(call.user_text)
    if (
        delegated is not None
        and AIP_CALL_TOOL in call.tool_names
        and (OFF_CONTRACT not in call.user_text)
    ):
        if not call.tool_results:
            # The contract's fields are the tool's arguments, as is (the reference facade).
            return _ToolCall(AIP_CALL_TOOL, delegated)
        text, failed = mcp_tool_outcome(call.tool_results[-1])
        return _Text(tuple(word_deltas(delegated_final_text(text, failed))))
    if AIP_LIST in call.user_text and AIP_CAPABILITIES_TOOL in call.tool_names:
        done = len(call.tool_results)
        if done < len(AIP_LIST_CALLS):
            return _ToolCall(AIP_CAPABILITIES_TOOL, dict(AIP_LIST_CALLS[done]))
        sizes = ", ".join(str(len(r)) for r in call.tool_results)
        return _Text(tuple(word_deltas(f"aip_capabilities results of {sizes} characters")))
    discover = discover_call_capability(call.user_text)
    if discover is not None and {AIP_CAPABILITIES_TOOL, AIP_CALL_TOOL} <= set(call.tool_names):
        return _discover_then_call(call, discover)
    scenario = scenario_of(call.user_text)
    if scenario.llm_error:
        return _Error(LLM_ERROR_MESSAGE)
    wants_tool = scenario.needs_approval or scenario.tool_echo
    tool_calls = scenario.approvals if scenario.needs_approval else 1
    if wants_tool and len(call.tool_results) < tool_calls:
        command = APPROVAL_COMMAND if scenario.needs_approval else ECHO_COMMAND
        return _ToolCall(TERMINAL_TOOL, {"command": command})
    if scenario.slow and not wants_tool:
        return _Text(tuple(slow_deltas(scenario.slow_delta_count)), SLOW_DELTA_DELAY_S)
    return _Text(tuple(reply_deltas(call.user_text)))


def _discover_then_call(call: ChatCall, capability: str) -> _Answer:
    """aip_capabilities; then aip_call on `capability` if it was listed; then the report."""
    if not call.tool_results:
        # The listing is paged: look the capability up by its id, as its description says.
        return _ToolCall(AIP_CAPABILITIES_TOOL, {"capability_id": capability})
    listed_text, _ = mcp_tool_outcome(call.tool_results[0])
    listed = f'"{capability}"' in listed_text
    if len(call.tool_results) == 1 and listed:
        arguments = {
            "capability_id": capability,
            "input": {},
            "mode": "sync",
            "timeout_ms": 60_000,
        }
        return _ToolCall(AIP_CALL_TOOL, arguments)
    text, _ = mcp_tool_outcome(call.tool_results[-1])
    final = discover_call_final_text(capability, listed, text if listed else "")
    return _Text(tuple(word_deltas(final)))


def _usage(call: ChatCall, completion_parts: int) -> _JSON:
    prompt = max(1, len(call.user_text.split()))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_parts,
        "total_tokens": prompt + completion_parts,
    }


def _tool_call_json(call: _ToolCall) -> _JSON:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def _completion(call: ChatCall, answer: _ToolCall | _Text) -> _JSON:
    """A whole `chat.completion` object for a non-streaming request."""
    message: _JSON
    if isinstance(answer, _ToolCall):
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [_tool_call_json(answer)],
        }
        finish, parts = "tool_calls", 1
    else:
        message = {"role": "assistant", "content": "".join(answer.deltas)}
        finish, parts = "stop", len(answer.deltas)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_ID,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": _usage(call, parts),
    }


async def _chunks(call: ChatCall, answer: _ToolCall | _Text, usage: bool) -> AsyncIterator[_JSON]:
    """The `chat.completion.chunk` frames of a streamed answer, paced as the scenario asks."""
    base: _JSON = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL_ID,
    }

    def frame(delta: _JSON, finish: str | None = None) -> _JSON:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield frame({"role": "assistant", "content": ""})
    if isinstance(answer, _ToolCall):
        tool_call = {"index": 0, **_tool_call_json(answer)}
        yield frame({"tool_calls": [tool_call]})
        finish, parts = "tool_calls", 1
    else:
        for i, delta in enumerate(answer.deltas):
            if i and answer.delay_s:
                await asyncio.sleep(answer.delay_s)
            yield frame({"content": delta})
        finish, parts = "stop", len(answer.deltas)
    yield frame({}, finish)
    if usage:
        yield {**base, "choices": [], "usage": _usage(call, parts)}


class FakeLLM:
    """The fake LLM server; `async with FakeLLM(port=0) as llm:` then point Hermes at `base_url`."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._calls: list[ChatCall] = []

    @property
    def port(self) -> int:
        """The bound port (known once started, also when asked for port 0)."""
        if self._runner is None:
            raise RuntimeError("FakeLLM is not running")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ending in `/v1`, as a provider's `base_url` expects."""
        return f"http://{self._host}:{self.port}/v1"

    @property
    def calls(self) -> Sequence[ChatCall]:
        """Every chat-completion request served so far, oldest first."""
        return tuple(self._calls)

    async def start(self) -> None:
        """Bind and serve; with port 0 the kernel picks a free port."""
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._port = int(runner.addresses[0][1])
        self._runner = runner

    async def stop(self) -> None:
        """Close the server and any stream still open (a stopped run's, say)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> FakeLLM:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "fake-llm"}],
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error_response(400, "request body is not JSON")
        if not isinstance(body, dict):
            return _error_response(400, "request body is not a JSON object")
        call = read_call(body)
        self._calls.append(call)
        answer = answer_for(call)
        if isinstance(answer, _Error):
            return _error_response(400, answer.message)
        if not call.stream:
            return web.json_response(_completion(call, answer))
        options = body.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            async for chunk in _chunks(call, answer, usage):
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:
            # Hermes hung up (a stopped run): nothing is left to say to it.
            return response
        return response


def _error_response(status: int, message: str) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        },
        status=status,
    )


async def _serve(host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with FakeLLM(host=host, port=port) as llm:
        print(f"listening on {llm.base_url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(description="Serve the project's fake OpenAI-compatible LLM.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
