"""A worker that cannot serve takes nothing, says why in /ready, and serves once fixed.

Issue 28: a worker started without its signing key, gateway keys or identity file (or whose
Hermes refuses its key) used to report /ready 200, bind the shared consumer and refuse
every Action it took -- one bad pod in a pool of N silently burnt 1/N of the traffic, a
refused id being used up. Now it binds nothing (`worker/serving.py`, `worker/bus/consumer.py`)
while a healthy worker beside it completes every Action.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.testing._procs import free_port
from worker.testing.fake_hermes import RouteError
from worker.testing.workers import WorkerProcess

MODELS = "GET /v1/models"
ACTIONS = 6


async def _ready(port: int) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://127.0.0.1:{port}/ready", timeout=10)
    return answer.status_code, answer.json()


async def _until_log(worker: WorkerProcess, text: str, timeout_s: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while text not in worker.log_text():
        assert worker.alive, worker.log_tail()
        assert loop.time() < deadline, worker.log_tail()
        await asyncio.sleep(0.1)


async def _all_go_to_the_healthy_worker(stack: Stack) -> None:
    """A healthy worker beside the unready one completes every Action."""
    await stack.spawn("w-ok")
    actions = [stack.action("models") for _ in range(ACTIONS)]
    handles = [await stack.publish(a) for a in actions]
    for handle in handles:
        result = await handle.result(timeout_s=30)
        assert result.status is ResultStatus.COMPLETED, result.error
        assert result.settled_by == "w-ok"


@pytest.mark.parametrize(
    ("missing", "logged", "reason"),
    [
        (
            "AIPD_WORKER_SIGNING_KEY_FILE",
            "not serving: ",
            "cannot sign results: AIPD_WORKER_SIGNING_KEY_FILE",
        ),
        (
            "AIPD_TRUSTED_GATEWAY_KEYS_FILE",
            "not serving: ",
            "cannot verify envelopes: AIPD_TRUSTED_GATEWAY_KEYS_FILE",
        ),
        (
            "AIPD_TRUSTED_IDENTITY_FILE",
            "not serving: ",
            "cannot check identities: AIPD_TRUSTED_IDENTITY_FILE",
        ),
        # The endpoint's key is per endpoint: found by the key probe, logged with its id.
        (
            "AIPD_HERMES_API_KEY_FILE",
            f"not serving {ENDPOINT}: ",
            f"endpoint {ENDPOINT} has no API key (AIPD_HERMES_API_KEY_FILE",
        ),
    ],
)
async def test_a_worker_missing_a_trust_piece_stays_unready_and_takes_nothing(
    stack: Stack, missing: str, logged: str, reason: str
) -> None:
    port = free_port()
    bad = await stack.spawn("w-bad", wait=False, unset=(missing,), AIPD_METRICS_PORT=str(port))
    await _until_log(bad, logged + reason)
    await _until_log(bad, "health and metrics on")
    status, document = await _ready(port)
    assert status == 503
    assert document["checks"]["serving"] is False
    assert any(r.startswith(reason) for r in document["reasons"]), document["reasons"]
    await _all_go_to_the_healthy_worker(stack)
    assert "bound to consumer" not in bad.log_text()


async def test_governed_capabilities_without_an_authority_file_are_warned_of_at_start(
    stack: Stack,
) -> None:
    """Without AIPD_APPROVAL_AUTHORITY_FILE the governed capabilities are refused one by one
    (the operator docs say so): the worker still serves, and says so once, at start, naming
    them -- a worker with the file says nothing of the kind."""
    warning = "AIPD_APPROVAL_AUTHORITY_FILE is not set: the governed capabilities ("
    without = await stack.spawn("w-none", unset=("AIPD_APPROVAL_AUTHORITY_FILE",))
    await _until_log(without, warning)
    [line] = [ln for ln in without.log_text().splitlines() if warning in ln]
    named = line.split(warning, 1)[1].split(")", 1)[0].split(", ")
    assert {"operator", "run_approval", "job_create"} <= set(named), line
    assert "refused until an approval authority is configured" in line
    with_file = await stack.spawn("w-auth")
    result = await (await stack.publish(stack.action("models"))).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert "AIPD_APPROVAL_AUTHORITY_FILE is not set" not in with_file.log_text()


async def test_a_key_hermes_refuses_shows_in_ready_and_nothing_is_taken(
    stack: Stack, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not-the-key\n")
    wrong.chmod(0o600)
    port = free_port()
    bad = await stack.spawn(
        "w-bad", wait=False, AIPD_HERMES_API_KEY_FILE=str(wrong), AIPD_METRICS_PORT=str(port)
    )
    await _until_log(bad, "health and metrics on")
    status, document = await _ready(port)
    assert status == 503
    [reason] = document["reasons"]
    assert f"endpoint {ENDPOINT}: Hermes at" in reason
    assert "refused the API key (401)" in reason
    # The log says it too (docs/operations.md: "each checks the reason in /ready and the log").
    await _until_log(bad, f"not serving {ENDPOINT}: {reason.split('; ', 1)[0]}")
    assert "not-the-key" not in json.dumps(document)
    assert "not-the-key" not in bad.log_text()
    await _all_go_to_the_healthy_worker(stack)
    assert "bound to consumer" not in bad.log_text()


async def test_a_worker_serves_once_hermes_accepts_its_key_again(stack: Stack) -> None:
    """Fixed without a restart: the probe runs on a schedule, and the consumer binds."""
    assert stack.fake is not None
    stack.fake.faults.add(RouteError(route=MODELS, status=401, times=None, probes=True))
    port = free_port()
    worker = await stack.spawn(
        "w1", wait=False, AIPD_SERVING_PROBE_INTERVAL_S="1", AIPD_METRICS_PORT=str(port)
    )
    await _until_log(worker, "refused the API key (401)")
    handle = await stack.publish(stack.action("models"))
    await asyncio.sleep(1.5)
    assert "bound to consumer" not in worker.log_text()
    stack.fake.faults.clear()
    await _until_log(worker, "bound to consumer")
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    await _until_log(worker, "health and metrics on")
    status, document = await _ready(port)
    assert (status, document["reasons"]) == (200, [])


async def test_an_unreachable_hermes_is_an_outage_reported_not_a_reason_to_unbind(
    stack: Stack, refused_port: int
) -> None:
    """An outage hits every worker alike: the endpoint stays served, so each Action gets the
    spec's typed, retryable transport error instead of waiting in the queue, and /ready says
    what is wrong."""
    port, closed = free_port(), refused_port
    worker = await stack.spawn(
        "w1",
        AIPD_HERMES_ENDPOINTS=f"{ENDPOINT}=http://127.0.0.1:{closed}",
        AIPD_METRICS_PORT=str(port),
    )
    result = await (await stack.publish(stack.action("models"))).result(timeout_s=60)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.retryable is True, result.error
    await _until_log(worker, "health and metrics on")
    status, document = await _ready(port)
    assert status == 503
    assert document["checks"]["serving"] is True
    assert document["checks"]["hermes"] is False
    [reason] = document["reasons"]
    assert "did not answer the key probe" in reason


async def test_a_key_file_fixed_on_disk_is_served_without_a_restart(
    stack: Stack, tmp_path: Path
) -> None:
    """The key file is read again on the probe schedule: a wrong key rewritten in place
    makes the worker bind and complete the Action it was keeping out of, no restart."""
    key_file = tmp_path / "rotated.key"
    key_file.write_text("not-the-key\n")
    key_file.chmod(0o600)
    port = free_port()
    worker = await stack.spawn(
        "w1",
        wait=False,
        AIPD_HERMES_API_KEY_FILE=str(key_file),
        AIPD_SERVING_PROBE_INTERVAL_S="1",
        AIPD_METRICS_PORT=str(port),
    )
    await _until_log(worker, "health and metrics on")
    status, document = await _ready(port)
    assert status == 503
    [reason] = document["reasons"]
    assert "refused the API key (401)" in reason
    handle = await stack.publish(stack.action("models"))
    await asyncio.sleep(1.5)
    assert "bound to consumer" not in worker.log_text()
    right = Path(stack.env["AIPD_HERMES_API_KEY_FILE"]).read_text()
    key_file.write_text(right)
    await _until_log(worker, f"a new API key was read from {key_file}")
    await _until_log(worker, "bound to consumer")
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w1"
    # /ready's own Hermes check is cached for 5 s (docs/operations.md): it catches up.
    for _ in range(40):
        status, document = await _ready(port)
        if status == 200:
            break
        await asyncio.sleep(0.25)
    assert (status, document["reasons"]) == (200, [])
    assert right.strip() not in worker.log_text()


async def test_a_key_file_that_turns_unreadable_blocks_its_endpoint(
    stack: Stack, tmp_path: Path
) -> None:
    """A key file opened to others while the worker runs is a reason, naming the file and
    the `chmod`, and the endpoint is unbound until it is fixed."""
    key_file = tmp_path / "rotated.key"
    key_file.write_text(Path(stack.env["AIPD_HERMES_API_KEY_FILE"]).read_text())
    key_file.chmod(0o600)
    port = free_port()
    worker = await stack.spawn(
        "w1",
        AIPD_HERMES_API_KEY_FILE=str(key_file),
        AIPD_SERVING_PROBE_INTERVAL_S="1",
        AIPD_METRICS_PORT=str(port),
    )
    key_file.chmod(0o644)
    await _until_log(worker, "unbinding")
    status, document = await _ready(port)
    assert status == 503
    [reason] = document["reasons"]
    assert str(key_file) in reason, reason
    assert "chmod 600" in reason, reason
    key_file.chmod(0o600)
    result = await (await stack.publish(stack.action("models"))).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
