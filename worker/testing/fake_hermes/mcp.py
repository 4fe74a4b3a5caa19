"""MCP tools the fake agent can call: enough of Hermes' MCP client for first-class delegation.

A real Hermes reaches the AIP MCP server over Streamable HTTP, authenticated as its own
principal, and the model calls `aip_call` there. The fake keeps that edge in-process: a test
registers an async callable per MCP tool name (`fake.mcp_tools["aip_call"] = tool`), usually
`GatewayRuntime.tool_for(key)` (the real AIP gateway over MCP, `worker.testing.gateway`).
When a run's input is a delegation
(`"kind": "aip_delegated_call"`) and `aip_call` is registered, the scripted agent calls it
exactly once with the input's `aip_call_arguments`, as the delegation instructions demand;
without it the agent only answers in prose, as a Hermes without the AIP MCP server would.
The input parsing, the tool's model-facing name and the prose are shared with the project's
fake LLM (`worker.testing.scenario`), which drives the real Hermes the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from worker.testing.scenario import AIP_CALL_TOOL, delegated_arguments, delegated_final_text

AIP_CALL = "aip_call"
#: The name the model-facing tool has in Hermes 0.19, which its `tool.*` events carry.
HERMES_TOOL_NAME = AIP_CALL_TOOL

#: An MCP tool: the call's arguments in, the tool result text out (raise = tool error).
McpTool = Callable[[dict[str, Any]], Awaitable[str]]

__all__ = [
    "AIP_CALL",
    "HERMES_TOOL_NAME",
    "McpTool",
    "delegated_arguments",
    "delegated_final_text",
]
