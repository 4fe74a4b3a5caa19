"""Agent and tool spans read from a Hermes run's events (docs/tracing.md, "Run events").

Hermes 0.19 exports no trace of its own, but its run event stream says what the agent did:
`tool.started` / `tool.completed` around each tool call, and one `run.*` terminal with the
run's token usage. `RunSpans` turns one observation of that stream into spans after the
OpenTelemetry GenAI semantic conventions: an `invoke_agent hermes` span from the first
event to the terminal one (or to the end of the observation: an approval prompt, a lost
lease), and an `execute_tool {name}` span under it for each tool call, failed when Hermes
says the tool failed.

Both readers of a run's events use it (the governed operator's observer and the raw `runs`
stream's classifier), each through `RunSpans.open`, which is None while tracing is off: an
untraced worker holds nothing per run for it (10,000 held runs multiply what it would).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker import tracing

#: `gen_ai.provider.name` / `gen_ai.agent.name` of every span here.
AGENT = "hermes"

#: The `run.*` events that end the agent span, and the error they record (None: success).
_TERMINALS: dict[str, str | None] = {
    "run.completed": None,
    "run.cancelled": None,
    "run.failed": "run.failed",
    "run.interrupted": "run.interrupted",
}


class RunSpans:
    """The agent span of one observed run and its open tool spans."""

    __slots__ = ("_agent", "_run_id", "_tools")

    def __init__(self, run_id: str | None) -> None:
        self._run_id = run_id
        self._agent: tracing.Span | None = None
        #: Open tool spans, oldest first, with the tool name each was started for.
        self._tools: list[tuple[str, tracing.Span | None]] = []

    @classmethod
    def open(cls, run_id: str | None = None) -> RunSpans | None:
        """Spans for one observation of a run; None while tracing is off."""
        return cls(run_id) if tracing.enabled() else None

    def see(self, name: str, data: Mapping[str, Any]) -> None:
        """Account for one run event (its name and decoded body)."""
        agent = self._agent_span()
        if name == "tool.started":
            tool = _text(data.get("tool")) or "tool"
            attributes: dict[str, tracing.AttrValue] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
            }
            self._tools.append(
                (tool, tracing.start(f"execute_tool {tool}", attributes=attributes, parent=agent))
            )
        elif name == "tool.completed":
            self._end_tool(_text(data.get("tool")) or "tool", failed=data.get("error") is True)
        elif name in _TERMINALS:
            self.close(usage=data.get("usage"), error=_TERMINALS[name], event=name)

    def close(
        self, *, usage: object = None, error: str | None = None, event: str | None = None
    ) -> None:
        """End every open span: at the run's terminal event, or when the observation ends
        without one (an approval prompt, a cancel, a lost lease): what ran so far."""
        for _, span in self._tools:
            tracing.end(span)
        self._tools.clear()
        if self._agent is None:
            return
        attributes: dict[str, tracing.AttrValue] = {}
        if event is not None:
            attributes["aip.run.terminal_event"] = event
        if isinstance(usage, Mapping):
            for ours, theirs in (
                ("gen_ai.usage.input_tokens", "input_tokens"),
                ("gen_ai.usage.output_tokens", "output_tokens"),
            ):
                value = usage.get(theirs)
                if isinstance(value, int) and not isinstance(value, bool):
                    attributes[ours] = value
        tracing.end(self._agent, attributes=attributes, error=error)
        self._agent = None

    def _agent_span(self) -> tracing.Span | None:
        if self._agent is None:
            attributes: dict[str, tracing.AttrValue] = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.provider.name": AGENT,
                "gen_ai.agent.name": AGENT,
            }
            if self._run_id is not None:
                attributes["aip.hermes.run_id"] = self._run_id
            self._agent = tracing.start(f"invoke_agent {AGENT}", attributes=attributes)
        return self._agent

    def _end_tool(self, tool: str, *, failed: bool) -> None:
        """End the oldest open span of `tool` (Hermes names no call id: calls of one tool
        complete in the order they started, as its agent loop runs them)."""
        for at, (name, span) in enumerate(self._tools):
            if name == tool:
                del self._tools[at]
                tracing.end(span, error="tool_error" if failed else None)
                return


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
