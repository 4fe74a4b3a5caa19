"""The words a test puts in an input to choose what the agent does.

The project's fake LLM (driving the real Hermes 0.19.0) and the fake Hermes read the same
words, so one test input produces the same run events against both servers. That is what
lets the conformance suite run each behavioural test parametrized over `fake` and `real`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# The words and commands the qualification driver also sends are defined with its objectives
# (production code may not import this package); the fakes answer them from here.
from worker.qualify.objectives import (
    APPROVAL_COMMAND,
    ECHO_COMMAND,
    LLM_ERROR,
    NEEDS_APPROVAL,
    NEEDS_TWO_APPROVALS,
    SLOW_REPLY,
    TOOL_ECHO,
)

__all__ = [
    "APPROVAL_COMMAND",
    "ECHO_COMMAND",
    "LLM_ERROR",
    "NEEDS_APPROVAL",
    "NEEDS_TWO_APPROVALS",
    "SLOW_REPLY",
    "TOOL_ECHO",
]

#: A slow reply HELD_DELTAS deltas long (a minute): a run that is surely still live when a
#: loaded machine gets round to the test's next step; the test stops it itself.
HELD_REPLY = "scenario-held-reply"
#: In a delegated input: the model ignores the delegation contract and does what the other
#: scenario words say instead of calling `aip_call` (with NEEDS_APPROVAL: a dangerous
#: command Hermes holds for approval).
OFF_CONTRACT = "scenario-off-contract"

#: `scenario-aip-discover-call=<capability id>`: the agent calls the AIP MCP tools
#: `aip_capabilities`, then, if that listed the capability, `aip_call` on it (mode sync, empty
#: input), then reports what the call returned (`discover_call_final_text`).
AIP_DISCOVER_CALL = "scenario-aip-discover-call="
#: The agent calls `aip_capabilities` once per entry of AIP_LIST_CALLS (the default page, then
#: everything with schemas: the issue's 112 KB answer), then says only how long each result
#: was; a test reads what reached the model from the fake LLM's recorded calls.
AIP_LIST = "scenario-aip-list"
AIP_LIST_CALLS: tuple[dict[str, Any], ...] = ({}, {"limit": 200, "include_schemas": True})


SLOW_DELTAS = 40
SLOW_DELTA_DELAY_S = 0.1
HELD_DELTAS = 600

#: Final text of a plain reply is REPLY_PREFIX + the first 40 characters of the input.
REPLY_PREFIX = "fake-reply: "

#: The `kind` of a first-class delegation input (`worker.delegation.payload`): when the AIP
#: MCP tool is available, the agent calls it once with the input's `aip_call_arguments`.
DELEGATED_KIND = "aip_delegated_call"
#: The model-facing name of the AIP MCP tool in Hermes 0.19: `mcp__<server>__<tool>` with
#: server `aip` and tool `aip_call` (tools/mcp_tool.py); its `tool.*` events say the same.
AIP_CALL_TOOL = "mcp__aip__aip_call"
AIP_CAPABILITIES_TOOL = "mcp__aip__aip_capabilities"


@dataclass(frozen=True, slots=True)
class Scenario:
    """What an input asks the agent to do."""

    tool_echo: bool
    needs_approval: bool
    slow: bool
    llm_error: bool
    held: bool = False
    #: How many times the approval command runs (each one a prompt): 1, or 2 with
    #: NEEDS_TWO_APPROVALS.
    approvals: int = 1

    @property
    def slow_delta_count(self) -> int:
        """How many deltas the slow reply has (HELD_REPLY makes it a minute long)."""
        return HELD_DELTAS if self.held else SLOW_DELTAS


def scenario_of(text: str) -> Scenario:
    """Read the scenario words in an input; plain text is a plain streamed reply."""
    return Scenario(
        tool_echo=TOOL_ECHO in text,
        needs_approval=NEEDS_APPROVAL in text,
        slow=SLOW_REPLY in text or HELD_REPLY in text,
        llm_error=LLM_ERROR in text,
        held=HELD_REPLY in text,
        approvals=2 if NEEDS_TWO_APPROVALS in text else 1,
    )


def reply_text(text: str) -> str:
    """The final text the fake LLM returns for an input (deterministic, so tests can compare)."""
    return REPLY_PREFIX + text[:40]


def reply_deltas(text: str) -> list[str]:
    """The reply split into the word-sized deltas that the stream carries."""
    return word_deltas(reply_text(text))


def word_deltas(text: str) -> list[str]:
    """`text` as word-sized deltas that join back to exactly `text`."""
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


def delegated_arguments(text: str) -> dict[str, Any] | None:
    """The `aip_call_arguments` of a delegated run's input, or None for any other input."""
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("kind") != DELEGATED_KIND:
        return None
    arguments = document.get("aip_call_arguments")
    return arguments if isinstance(arguments, dict) else None


def delegated_final_text(tool_result: str, failed: bool) -> str:
    """What the agent says after its one `aip_call`: prose never to be taken as the result."""
    if failed:
        return "The aip_call tool failed; I did not retry it."
    return f"I called aip_call once. It returned: {tool_result[:200]}"


def discover_call_capability(text: str) -> str | None:
    """The capability of an AIP_DISCOVER_CALL input, or None for any other input."""
    _, found, rest = text.partition(AIP_DISCOVER_CALL)
    if not found:
        return None
    capability = rest.split()[0].strip("\"',.}") if rest.split() else ""
    return capability or None


def discover_call_final_text(capability: str, listed: bool, tool_result: str) -> str:
    """What the agent says after the discovery scenario (prose; the Action result decides)."""
    if not listed:
        return f"aip_capabilities did not list {capability}; I called nothing."
    return f"I called {capability} through aip_call. It returned: {tool_result[:400]}"
