"""The fake Hermes's remote `aip_call`: a real MCP client session against the real gateway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.ids import new_action_id
from worker.gateway.service import namespaced_action_id
from worker.testing.fake_hermes.mcp_client import McpRefused, remote_aip_call
from worker.testing.gateway import gateway_runtime, hermes_principal_id
from worker.testing.identities import write_trust_files
from worker.testing.services import ServiceHandle


async def test_the_call_reaches_the_gateway_as_the_tokens_principal_and_fails_typed(
    tmp_path: Path, nats_server: ServiceHandle
) -> None:
    trust = write_trust_files(tmp_path)
    principals = {"h1": (hermes_principal_id("h1"), None)}
    async with gateway_runtime(nats_server.url, tmp_path, trust.seed_file, principals) as runtime:
        arguments = {
            "action_id": new_action_id(),
            "capability_id": "cap:support_sandbox:case.get",
            "input": {"nested": [1, "two", None]},
            "mode": "sync",
        }
        text = await remote_aip_call(runtime.url, runtime.tokens["h1"])(arguments)
        # The text of a settled call is the Action's output (the reference facade's).
        assert json.loads(text)["echo"] == arguments["input"]
        (child,) = runtime.writer.requested
        # The supplied id is namespaced per principal (docs/gateway.md#action-ids).
        assert child.id == namespaced_action_id(
            hermes_principal_id("h1"), None, arguments["action_id"]
        )
        assert child.identity.principal_id == hermes_principal_id("h1")
        # A refused call is a tool error carrying the typed error; a wrong token is a 401.
        with pytest.raises(RuntimeError, match=r"connector_host\.route_mismatch"):
            await remote_aip_call(runtime.url, runtime.tokens["h1"])(
                {**arguments, "action_id": new_action_id(), "capability_id": "cap:nowhere:x"}
            )
        with pytest.raises(McpRefused, match="HTTP 401"):
            await remote_aip_call(runtime.url, "wrong-token")(arguments)
