"""A child's result is what a trusted worker signed, never what anyone published.

The gateway runs with `AIPD_TRUSTED_WORKER_KEYS_FILE`. Real NATS and Redis, a worker
process serving h1 (it signs its results), and `python -m worker gateway` processes. For the
forgeries, children go to endpoint h9, whose work queue exists but which no worker serves:
the test publishes on its results subject what an intruder with publish rights could
(unsigned, signed by an unknown key, a trusted worker's signed result of another Action) and
finally what a trusted worker signs.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import httpx
import pytest

from schemas.ids import new_action_id
from schemas.lifecycle import ChildResult, LifecycleState
from schemas.result import ActionResult, ResultStatus
from subjects.provision import provision
from subjects.streams import StreamPolicy
from worker.aip.signing import AipSigner
from worker.testing.gateway import call_tool
from worker.trust.responses import ResponseSigner, sha256_hex
from worker.trust.signing import generate_keypair
from worker.wire.results import encode_result

from .conftest import H1_TOKEN, GatewayStack
from .test_gateway_tools import aip_call, bus_id, contract, records, wait_terminal

H9_MODELS = "cap:hermes_agent:h9:models"
REFUSED = "aip_gateway_unverified_results_total"


@pytest.fixture
async def verifying(gstack: GatewayStack) -> GatewayStack:
    """One gateway that verifies child results against the stack's worker keys, and the
    unserved endpoint h9."""
    gs = gstack
    gs.env["AIPD_TRUSTED_WORKER_KEYS_FILE"] = str(gs.stack.trust.worker_keys_file)
    await provision(
        gs.stack.nc.jetstream(), gs.stack.subjects, ["h9"], StreamPolicy(ack_wait_s=3.0)
    )
    await gs.start_gateway("g1")
    return gs


def result_for(
    action_id: str,
    envelope_sha256: str | None = None,
    *,
    signer: AipSigner | None = None,
    **output: object,
) -> bytes:
    """A result Envelope of `action_id` answering the envelope of hash `envelope_sha256`,
    signed by `signer` (None: unsigned)."""
    return encode_result(
        ActionResult(
            action_id=action_id,
            capability=H9_MODELS,
            endpoint_id="h9",
            status=ResultStatus.COMPLETED,
            output=dict(output),
            settled_by="w-h9",
            fence=1,
            settled_at_unix_ms=time.time_ns() // 1_000_000,
            action_sha256=envelope_sha256,
        ),
        action=None,
        signer=signer,
        endpoint_id="h9",
    )


def worker_key(gs: GatewayStack) -> AipSigner:
    """The trusted worker key, as the AIP signer a worker signs its results with."""
    return ResponseSigner.load(gs.stack.trust.worker_seed_file).aip


async def publish_result(gs: GatewayStack, action_id: str, payload: bytes) -> None:
    subject = gs.stack.subjects.results("h9", action_id)
    await gs.stack.nc.jetstream().publish(subject, payload)


async def h9_child(gs: GatewayStack, timeout_ms: int) -> tuple[str, str]:
    """An async `aip_call` of a child nobody executes: its id, and the sha256 of the
    envelope the gateway dispatched (the last one on h9's work queue, which nobody reads)."""
    arguments = contract(capability_id=H9_MODELS, mode="async", timeout_ms=timeout_ms)
    answer = await aip_call(gs, H1_TOKEN, arguments)
    assert answer.document["ack"]["status"] == "accepted", answer.document
    js = gs.stack.nc.jetstream()
    dispatched = await js.get_last_msg(
        gs.stack.subjects.stream_name("actions"), gs.stack.subjects.actions("h9")
    )
    return bus_id(arguments), sha256_hex(dispatched.data or b"")


async def recorded(gs: GatewayStack, action_id: str, timeout_s: float = 20.0) -> ChildResult:
    """The result the gateway recorded once the child's queue entry is terminal."""
    found = await wait_terminal(gs, action_id, timeout_s=timeout_s)
    assert found.lifecycle is not None
    assert found.lifecycle.result is not None
    return found.lifecycle.result


async def refused_count(gs: GatewayStack) -> float:
    async with httpx.AsyncClient(base_url=gs.base_url) as http:
        text = (await http.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(REFUSED + " "):
            return float(line.split()[1])
    raise AssertionError(f"{REFUSED} not exposed")


async def result_answer(gs: GatewayStack, action_id: str) -> dict[str, Any]:
    answer = await call_tool(gs.url, H1_TOKEN, "aip_action_result", {"action_id": action_id})
    assert not answer.is_error, answer.document
    return answer.body


async def test_a_workers_signed_result_is_recorded_as_the_childs(verifying: GatewayStack) -> None:
    answer = await aip_call(verifying, H1_TOKEN, contract())
    assert not answer.is_error, answer.document
    assert answer.aip["status"] == "completed"
    assert await refused_count(verifying) == 0


async def test_forged_results_are_refused_and_the_signed_one_is_recorded(
    verifying: GatewayStack,
) -> None:
    gs = verifying
    child_id, envelope = await h9_child(gs, timeout_ms=30_000)
    forged = result_for(child_id, envelope, forged=True)
    await publish_result(gs, child_id, forged)  # unsigned
    stranger = AipSigner.from_nkey_seed(generate_keypair().seed)
    await publish_result(gs, child_id, result_for(child_id, envelope, signer=stranger, forged=True))
    # A trusted worker's signature, but on the result of another Action.
    signer = worker_key(gs)
    await publish_result(
        gs, child_id, result_for(new_action_id(), envelope, signer=signer, forged=True)
    )
    # A trusted worker's signature on a result of this id, but of another envelope (an
    # Action someone else published under the id).
    await publish_result(
        gs, child_id, result_for(child_id, sha256_hex(b"other"), signer=signer, forged=True)
    )
    deadline = time.monotonic() + 10
    while await refused_count(gs) < 4:
        assert time.monotonic() < deadline, await refused_count(gs)
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    assert (await result_answer(gs, child_id))["state"] == "running"
    found = await records(gs, child_id)
    assert found.queue is not None
    assert found.queue.state is LifecycleState.RUNNING
    assert found.lifecycle is None

    await publish_result(gs, child_id, result_for(child_id, envelope, signer=signer, models=["m1"]))
    assert (await recorded(gs, child_id)).output == {"models": ["m1"]}
    assert (await result_answer(gs, child_id))["output"] == {"models": ["m1"]}
    assert await refused_count(gs) == 4


async def test_a_child_with_only_refused_results_fails_with_response_signing(
    verifying: GatewayStack,
) -> None:
    gs = verifying
    child_id, envelope = await h9_child(gs, timeout_ms=1_500)
    await publish_result(gs, child_id, result_for(child_id, envelope, forged=True))
    # Past the timeout plus the settle grace the sweep settles it, with the signing code.
    result = await recorded(gs, child_id, timeout_s=15)
    assert result.status == "failed"
    assert result.output is None
    assert result.error is not None
    assert result.error["code"] == "connector_host.response_signing"
    assert result.error["uncertain_outcome"] is True
    assert result.error["retryable"] is False


async def test_recovery_finds_the_signed_result_behind_a_later_forgery(
    verifying: GatewayStack,
) -> None:
    gs = verifying
    child_id, envelope = await h9_child(gs, timeout_ms=30_000)
    gs.gateways[0].kill()  # nobody follows the child now
    signed = result_for(child_id, envelope, signer=worker_key(gs), models=["m1"])
    await publish_result(gs, child_id, signed)
    await publish_result(gs, child_id, result_for(child_id, envelope, forged=True))  # the last
    await gs.start_gateway("g2")
    assert (await recorded(gs, child_id)).output == {"models": ["m1"]}
    assert await refused_count(gs) == 1


async def test_an_unusable_worker_keys_file_refuses_the_start(gstack: GatewayStack) -> None:
    keys = gstack.stack.root / "worker-keys-writable.txt"
    keys.write_text(gstack.stack.trust.worker_keys_file.read_text("utf-8"), encoding="utf-8")
    keys.chmod(0o666)
    env = {**os.environ, **gstack.env, "AIPD_TRUSTED_WORKER_KEYS_FILE": str(keys)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "gateway", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 2, err.decode()
    assert "trusted worker keys file" in err.decode()
