"""The scripted agent: what one turn "does" for an input, chosen by the scenario words.

Every fake route (runs, chat completions, responses, session chat) drives the same script, so
one test input behaves the same everywhere, and the same as the real Hermes driven by the
project's fake LLM (both read `worker.testing.scenario`). Routes only differ in how they
render the steps, and in whether they have an approval channel: only `/v1/runs` does; elsewhere
a dangerous command is left `pending_approval` and never runs, as in Hermes 0.19.0.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.testing.fake_llm import LLM_ERROR_MESSAGE, slow_deltas
from worker.testing.scenario import (
    APPROVAL_COMMAND,
    ECHO_COMMAND,
    SLOW_DELTA_DELAY_S,
    reply_deltas,
    scenario_of,
)

TOOL = "terminal"
APPROVAL_DESCRIPTION = "world/other-writable permissions"
APPROVAL_CHOICES = ("once", "session", "always", "deny")
#: Token usage the fake LLM reports per call (the figures observed for one text turn).
INPUT_TOKENS_PER_CALL = 11
OUTPUT_TOKENS_PER_CALL = 7
#: How long the fake `terminal` tool takes.
TOOL_DURATION_S = 0.005
#: What Hermes reports when the fake LLM answers the scenario's HTTP 400.
LLM_ERROR_TEXT = f"HTTP 400: {LLM_ERROR_MESSAGE}"


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one turn."""

    input_tokens: int
    output_tokens: int

    @property
    def total_tokens(self) -> int:
        """Sum, as every Hermes usage object reports it."""
        return self.input_tokens + self.output_tokens

    def as_hermes(self) -> dict[str, int]:
        """`{"input_tokens","output_tokens","total_tokens"}` (runs, responses, sessions)."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
        }

    def as_openai(self) -> dict[str, int]:
        """`{"prompt_tokens","completion_tokens","total_tokens"}` (chat completions)."""
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
        }


ZERO_USAGE = Usage(0, 0)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One `terminal` call the scripted LLM asks for."""

    call_id: str
    command: str

    @property
    def arguments(self) -> str:
        """The arguments JSON string as the LLM sent it."""
        return json.dumps({"command": self.command})


@dataclass(frozen=True, slots=True)
class ToolStarted:
    """The agent began a tool call."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """The tool call is dangerous and waits for a human (only with an approval gate)."""

    call: ToolCall


@dataclass(frozen=True, slots=True)
class ApprovalResolved:
    """A human answered the prompt (absent when the approval timed out)."""

    choice: str


@dataclass(frozen=True, slots=True)
class ToolCompleted:
    """The tool call returned `result` (the tool's JSON string)."""

    call: ToolCall
    result: str
    duration: float
    error: bool


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the reply; `after_tool` marks the first piece after a tool ran."""

    text: str
    after_tool: bool


@dataclass(frozen=True, slots=True)
class Finished:
    """The turn succeeded; `messages` are this turn's assistant/tool messages."""

    text: str
    usage: Usage
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[ToolCompleted] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Failed:
    """The LLM call failed; `error` is the text Hermes reports."""

    error: str


Step = (
    ToolStarted
    | ApprovalRequested
    | ApprovalResolved
    | ToolCompleted
    | TextDelta
    | Finished
    | Failed
)


class ApprovalGate(Protocol):
    """How a run answers an approval prompt: a choice, or `None` when it timed out."""

    async def wait(self) -> str | None:
        """Block until the prompt is answered or times out."""
        ...


def new_call_id() -> str:
    """`call_<8 hex>`, the shape Hermes gives tool calls."""
    return "call_" + secrets.token_hex(4)


def _tool_result(command: str, choice: str | None, gated: bool) -> tuple[str, bool]:
    if command == ECHO_COMMAND:
        return json.dumps({"output": "hello-from-tool", "exit_code": 0, "error": None}), False
    if not gated:
        pending = {
            "output": "",
            "exit_code": -1,
            "error": "",
            "status": "pending_approval",
            "approval_pending": True,
            "command": command,
            "description": APPROVAL_DESCRIPTION,
            "pattern_key": APPROVAL_DESCRIPTION,
            "smart_denied": False,
            "allow_permanent": True,
        }
        return json.dumps(pending), False
    if choice is not None and choice != "deny":
        return json.dumps({"output": "", "exit_code": 0, "error": None}), False
    reason = "denied by the user" if choice == "deny" else "approval timed out"
    blocked = {
        "output": "",
        "exit_code": -1,
        "error": f"BLOCKED: command {reason}. Do NOT retry this command.",
        "status": "blocked",
    }
    return json.dumps(blocked), True


async def run_turn(text: str, gate: ApprovalGate | None) -> AsyncGenerator[Step, None]:
    """The steps of one agent turn for `text`, ending with `Finished` or `Failed`."""
    scenario = scenario_of(text)
    if scenario.llm_error:
        yield Failed(LLM_ERROR_TEXT)
        return
    calls = 1
    messages: list[dict[str, Any]] = []
    tools: list[ToolCompleted] = []
    command = (
        APPROVAL_COMMAND
        if scenario.needs_approval
        else ECHO_COMMAND
        if scenario.tool_echo
        else None
    )
    # The same command once more per further approval the scenario asks for (each a prompt of
    # its own, as Hermes asks again after a `once` decision), as the project's fake LLM does.
    if command is not None:
        repeats = scenario.approvals if command == APPROVAL_COMMAND else 1
        for _ in range(repeats):
            calls += 1
            call = ToolCall(new_call_id(), command)
            yield ToolStarted(call)
            started = asyncio.get_running_loop().time()
            choice: str | None = None
            dangerous = command == APPROVAL_COMMAND
            if dangerous and gate is not None:
                yield ApprovalRequested(call)
                choice = await gate.wait()
                if choice is not None:
                    yield ApprovalResolved(choice)
            await asyncio.sleep(TOOL_DURATION_S)
            result, error = _tool_result(command, choice, dangerous and gate is not None)
            done = ToolCompleted(
                call, result, round(asyncio.get_running_loop().time() - started, 3), error
            )
            tools.append(done)
            yield done
            messages.append(_tool_call_message(call))
            messages.append(
                {"role": "tool", "content": result, "tool_call_id": call.call_id, "tool_name": TOOL}
            )
    after_tool = command is not None
    # Same answers as the project's fake LLM: a slow reply is `tick0 … tick39`, and only
    # when no tool is involved.
    if scenario.slow and command is None:
        pieces = slow_deltas(scenario.slow_delta_count)
        for piece in pieces:
            await asyncio.sleep(SLOW_DELTA_DELAY_S)
            yield TextDelta(piece, after_tool)
    else:
        pieces = reply_deltas(text)
        for piece in pieces:
            yield TextDelta(piece, after_tool)
            after_tool = False
    final = "".join(pieces)
    messages.append(
        {"role": "assistant", "content": final, "finish_reason": "stop", "reasoning": None}
    )
    usage = Usage(INPUT_TOKENS_PER_CALL * calls, OUTPUT_TOKENS_PER_CALL * calls)
    yield Finished(final, usage, messages, tools)


def _tool_call_message(call: ToolCall) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call.call_id,
                "call_id": call.call_id,
                "response_item_id": "fc_" + call.call_id.removeprefix("call_"),
                "type": "function",
                "function": {"name": TOOL, "arguments": call.arguments},
            }
        ],
        "finish_reason": "tool_calls",
        "reasoning": None,
    }


async def collect(text: str) -> Finished | Failed:
    """Run a turn without an approval gate and return only its outcome (non-stream routes)."""
    async for step in run_turn(text, None):
        if isinstance(step, Finished | Failed):
            return step
    raise RuntimeError("agent turn ended without an outcome")
