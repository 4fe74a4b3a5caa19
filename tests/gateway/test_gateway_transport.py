"""The MCP transport scopes are a separate gate from the tools' protected-resource scopes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from worker.errors import McpHttpRefused
from worker.testing.gateway import gateway_runtime, list_tools
from worker.testing.identities import write_trust_files
from worker.testing.services import ServiceHandle


async def test_a_token_without_the_transport_scopes_gets_403_and_no_session(
    tmp_path: Path, nats_server: ServiceHandle
) -> None:
    trust = write_trust_files(tmp_path)
    principals = {
        "connect": ("agent:hermes_operator:h1", None),
        "no-connect": ("agent:hermes_operator:h2", None),
    }
    scopes = {
        "connect": ["mcp:connect", "capability:read"],
        "no-connect": ["capability:read", "action:write"],
    }
    async with gateway_runtime(
        nats_server.url,
        tmp_path,
        trust.seed_file,
        principals,
        scopes=scopes,
        mcp_transport_scopes="mcp:connect",
    ) as runtime:
        assert "aip_call" in await list_tools(runtime.url, runtime.tokens["connect"])
        with pytest.raises(McpHttpRefused) as refused:
            await list_tools(runtime.url, runtime.tokens["no-connect"])
        assert refused.value.status == 403
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                runtime.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                headers={"Authorization": f"Bearer {runtime.tokens['no-connect']}"},
            )
        assert answer.status_code == 403
        assert 'error="insufficient_scope"' in answer.headers["www-authenticate"]
        assert runtime.writer.requested == []


async def test_only_loopback_and_the_configured_host_names_reach_mcp(
    tmp_path: Path, nats_server: ServiceHandle
) -> None:
    """A Hermes on another host calls the gateway by its own name for it (compose:
    `gateway:8080`); the MCP SDK answers any Host it was not told about with 421, whatever
    the token, so that name must be configured, and no other name gets through."""
    trust = write_trust_files(tmp_path)
    principals = {"h1": ("agent:hermes_operator:h1", None)}
    async with gateway_runtime(
        nats_server.url, tmp_path, trust.seed_file, principals,
        mcp_allowed_hosts="aip-gateway:8080, other-name:*",
    ) as runtime:  # fmt: skip
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        }
        headers = {
            "Authorization": f"Bearer {runtime.tokens['h1']}",
            "Accept": "application/json, text/event-stream",
        }
        statuses = {}
        async with httpx.AsyncClient() as http:
            for host in ("aip-gateway:8080", "other-name:9", "aip-gateway:9", "evil.test:8080"):
                answer = await http.post(
                    runtime.url, json=initialize, headers={**headers, "Host": host}
                )
                statuses[host] = answer.status_code
        assert statuses == {
            "aip-gateway:8080": 200,
            "other-name:9": 200,
            "aip-gateway:9": 421,
            "evil.test:8080": 421,
        }
        # Loopback clients are still served, as they are without the setting.
        assert "aip_call" in await list_tools(runtime.url, runtime.tokens["h1"])
