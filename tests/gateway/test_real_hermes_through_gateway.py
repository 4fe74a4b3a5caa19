"""The real Hermes 0.19.0 uses AIP capabilities through the real gateway (qualification 9).

Hermes (`hermes-agent[mcp]`) is configured with `mcp_servers.aip` pointing at a
`python -m worker gateway` process, with its own bearer token (principal
`agent:hermes_operator:h1`) and the six AIP tools. An operator objective on endpoint h1 makes
its model call `aip_capabilities`, find `cap:hermes_agent:h2:models` there, and call it with
`aip_call`: the gateway dispatches that child to endpoint h2, whose own worker executes it
against h2's Hermes, and the child's native result comes back to Hermes as the tool result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import pytest

from schemas.result import ResultStatus
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.aip_wire import receipt_fields
from tests.integration.stack import Stack
from worker.client import AipClient
from worker.testing._procs import free_port
from worker.testing.fake_hermes import FakeHermes
from worker.testing.fake_llm import mcp_tool_outcome
from worker.testing.gateway import (
    directory_entry,
    gateway_env,
    gateway_process,
    hermes_principal_id,
    principal_entry,
    write_principals_file,
)
from worker.testing.identities import identity_entries, write_api_key_file, write_trust_files
from worker.testing.scenario import AIP_DISCOVER_CALL, AIP_LIST
from worker.testing.services import ServiceHandle
from worker.testing.workers import WorkerProcess

from .test_gateway_tools import SIX_TOOLS

pytestmark = pytest.mark.real_hermes

CHILD = "cap:hermes_agent:h2:models"
#: Served by the fake Hermes `h2` (one worker): with the real h1, the issue's four endpoints.
FAKE_ENDPOINTS = ("h2", "h3", "h4")
H1 = hermes_principal_id("h1")


@dataclass
class RealStack:
    stack: Stack
    gateway: WorkerProcess
    h2: FakeHermes
    real: object


@pytest.fixture
async def real_stack(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[RealStack]:
    from worker.testing.real_hermes import RealHermes

    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir, identities=[*identity_entries(), directory_entry(H1)])
    token = "mcp-h1-" + "f" * 32
    principals = write_principals_file(trust_dir, [principal_entry(token, H1)])
    api_key, key_file = write_api_key_file(tmp_path)
    nc = await nats.connect(nats_server.url)
    await provision(
        nc.jetstream(), Subjects(), ["h1", *FAKE_ENDPOINTS], StreamPolicy(ack_wait_s=15.0)
    )
    port = free_port()
    gateway = gateway_process(
        "g1", gateway_env(nats_server.url, principals, trust.seed_file, port), tmp_path
    )
    stack: Stack | None = None
    try:
        # Hermes lists the MCP tools when it starts: the gateway serves before it.
        await asyncio.to_thread(gateway.start, wait_ready_s=20.0)
        url = f"http://127.0.0.1:{port}/mcp"
        async with FakeHermes(api_key=api_key) as h2:
            real_cm = RealHermes(
                tmp_path / "hermes",
                api_key=api_key,
                mcp_servers={"aip": (url, token)},
                mcp_tools=SIX_TOOLS,
            )
            real = await real_cm.__aenter__()
            try:
                stack = Stack(
                    root=tmp_path,
                    nats_url=nats_server.url,
                    redis_url=redis_server.url,
                    fake=None,
                    trust=trust,
                    nc=nc,
                    client=AipClient(nc, sign_key=trust.seed_file),
                    env={
                        "AIPD_NATS_URL": nats_server.url,
                        "AIPD_REDIS_URL": redis_server.url,
                        "AIPD_HERMES_API_KEY_FILE": str(key_file),
                        "AIPD_LEASE_TTL_MS": "15000",
                        **trust.environment(),
                    },
                )
                await stack.spawn("w-h1", AIPD_HERMES_ENDPOINTS=f"h1={real.url}")
                # h3 and h4 on the same fake: four endpoints, the listing.
                await stack.spawn(
                    "w-h2",
                    AIPD_HERMES_ENDPOINTS=",".join(f"{e}={h2.url}" for e in FAKE_ENDPOINTS),
                    AIPD_HERMES_SHARE_API_KEY="true",
                )
                yield RealStack(stack, gateway, h2, real)
            finally:
                await real_cm.__aexit__(None, None, None)
    finally:
        if stack is not None:
            stack.stop_workers()
        gateway.terminate(10)
        await nc.close()


async def test_hermes_discovers_a_capability_and_calls_it_through_the_gateway(
    real_stack: RealStack,
) -> None:
    stack = real_stack.stack
    objective = f"{AIP_DISCOVER_CALL}{CHILD} and report the models"
    _, handle = await stack.operator(objective)
    result = await handle.result(timeout_s=120)
    assert result.status is ResultStatus.COMPLETED, result.error
    final = json.dumps(result.output)
    # The model saw the capability in aip_capabilities (otherwise it calls nothing) ...
    assert "did not list" not in final
    assert f"I called {CHILD} through aip_call" in final
    # ... and the child ran on h2 through its own worker, its native result coming back.
    assert real_stack.h2.stats().count("GET /v1/models") == 1
    records = await stack.stream_messages("runtime_queue", "aip.runtime.queue.*")
    (queued,) = {msgspec.json.decode(m)["body"]["action_status"]["action_id"] for m in records}
    child = await stack.client.handle("h2", queued).result(timeout_s=10)
    assert child.status is ResultStatus.COMPLETED
    assert child.settled_by == "w-h2"
    assert child.output["data"][0]["id"] == "hermes-agent"
    assert '\\"hermes-agent\\"' in final or "hermes-agent" in final
    last = msgspec.json.decode(records[-1])
    assert last["body"]["action_status"]["state"] == "completed"
    ours = last["extensions"]["org.aip-hermes-worker"]
    assert ours["owner_principal_id"] == H1
    identity = ours["action"]["identity"]
    actor = identity.get("human_actor") or identity["service_account"]
    assert actor["id"] == H1
    # Receipts of both Actions are retained: the operator's on h1, the child's on h2 (the
    # worker's and the gateway's aip_call), and the gateway's aip_capabilities receipt.
    operator = {r.event.value for r in await stack.client.receipts("h1", handle.action_id)}
    assert {"received", "run_bound", "settled"} <= operator
    child_chain = await stack.client.receipts("h2", queued)
    assert {"received", "settled", "tool_call"} <= {r.event.value for r in child_chain}
    audit = await stack.stream_messages("audit", "aip.hermes._gateway.audit.*")
    tools = {receipt_fields(m)["details"]["tool"] for m in audit}
    assert "aip_capabilities" in tools


async def test_a_default_capabilities_page_reaches_the_model_whole(real_stack: RealStack) -> None:
    """The issue's measurement, again through the real Hermes: the whole listing with every
    schema is more than Hermes keeps of one tool result, so the model got a 1.9 KB preview;
    a default page (20 entries, no schemas) reaches the model whole. Four endpoints: the real
    h1 and the fake h2, h3, h4."""
    from worker.testing.real_hermes import RealHermes

    real = real_stack.real
    assert isinstance(real, RealHermes)
    _, handle = await real_stack.stack.operator(f"{AIP_LIST} list what you can call")
    result = await handle.result(timeout_s=120)
    assert result.status is ResultStatus.COMPLETED, result.error
    (last,) = [c for c in real.llm.calls if len(c.tool_results) == 2]
    page, everything = last.tool_results
    # Hermes keeps a result whole up to its per-result budget (tools/budget_config.py in
    # 0.19: 15 % of the model's context in characters, at least 8,000); beyond it the model
    # gets a 1,500-character preview and a file path.
    text, failed = mcp_tool_outcome(page)
    assert not failed
    document = json.loads(text)  # whole: it parses, all 20 entries and the cursor are there
    assert len(document["capabilities"]) == 20
    assert document["next_cursor"] == "20"
    # Four endpoints with every schema: past the budget of the fake model's 131,072-token
    # context (78,643 characters), so the model sees a preview (the 1.9 KB) and a
    # note that the rest was persisted, or here, in a sandbox it cannot write, dropped.
    assert "persisted-output" in everything or "[Truncated: tool response was" in everything
    assert len(everything) < 4_096
    print(
        f"through the real Hermes 0.19.0: the default page reached the model whole, {len(page)} "
        f"characters ({len(text)} of them the answer); the whole listing with schemas as a "
        f"preview of {len(everything)}"
    )
