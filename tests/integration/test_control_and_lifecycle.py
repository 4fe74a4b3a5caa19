"""Provisioning, discovery, cancellation of a plain call, and graceful shutdown."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from schemas.result import ResultStatus
from subjects.grammar import Subjects
from subjects.provision import Change, provision
from subjects.streams import StreamPolicy
from tests.integration.stack import ENDPOINT, Stack
from worker.testing.fake_hermes import RouteDelay
from worker.testing.scenario import SLOW_REPLY
from worker.testing.services import ServiceHandle

MODELS = "GET /v1/models"


async def test_provision_twice_changes_nothing(nats_server: ServiceHandle) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        first = await provision(js, Subjects(), ["h1", "h2"])
        second = await provision(js, Subjects(), ["h1", "h2"])
        assert {item.change for item in first} == {Change.CREATED}
        # Nine streams; per endpoint one work consumer each for Actions, delegations and
        # channel egress deliveries.
        assert len(first) == 9 + 2 * 3
        assert {item.change for item in second} == {Change.UNCHANGED}
        third = await provision(js, Subjects(), ["h1"], StreamPolicy(duplicate_window_s=60))
        # Every stream but the DLQ, which keeps its own day-long window (its entries are
        # written again from stored results, maybe long after the first).
        assert {i.name for i in third if i.change is Change.UPDATED} == {
            "AIP_HERMES_ACTIONS",
            "AIP_HERMES_DELEGATIONS",
            "AIP_HERMES_EGRESS",
            "AIP_HERMES_CHUNKS",
            "AIP_HERMES_RESULTS",
            "AIP_HERMES_AUDIT",
            "AIP_HERMES_ESCALATIONS",
            "AIP_HERMES_INBOUND",
        }
    finally:
        await nc.close()


async def test_a_conflicting_stream_is_reported_not_replaced(nats_server: ServiceHandle) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name="AIP_HERMES_ACTIONS",
                subjects=["aip.hermes.*.actions"],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.MEMORY,
            )
        )
        await js.publish("aip.hermes.h1.actions", b"keep me")
        report = await provision(js, Subjects(), ["h1"])
        [actions] = [i for i in report if i.name == "AIP_HERMES_ACTIONS"]
        assert actions.change is Change.CONFLICT
        assert "retention" in actions.detail
        info = await js.stream_info("AIP_HERMES_ACTIONS")
        assert info.state.messages == 1
    finally:
        await nc.close()


async def test_manifest_answers_on_its_subject_and_through_nats_micro(stack: Stack) -> None:
    await stack.spawn("w1")
    manifest = await stack.client.manifest(ENDPOINT)
    names = {entry["name"] for entry in manifest["capabilities"]}
    assert len(names) == 35
    assert {"health", "models", "operator", "run_start", "job_run", "chat_stream"} <= names
    operator = next(e for e in manifest["capabilities"] if e["name"] == "operator")
    assert operator["id"] == f"cap:hermes_agent:{ENDPOINT}:operator"
    assert operator["requires_human_approval"] is True
    assert operator["contract"]["execution"]["retry_safety"] == "unsafe"
    info = await stack.nc.request("$SRV.INFO.aip-hermes-worker", b"", timeout=5)
    service = json.loads(info.data)
    assert service["name"] == "aip-hermes-worker"
    assert f"aip.hermes.{ENDPOINT}.manifest" in {e["subject"] for e in service["endpoints"]}


async def test_cancel_of_a_running_read_settles_cancelled(stack: Stack) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=30, times=1))
    await stack.spawn("w1")
    action = stack.action("models")
    handle = await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    # AIP answers a Cancel with the Action's result once the cancel settles it.
    reply = await handle.cancel(requested_by="user:demo", reason="not needed")
    assert reply.accepted, reply.error
    assert reply.result is not None
    assert reply.result.status is ResultStatus.CANCELLED
    result = await handle.result(timeout_s=10)
    assert result == reply.result
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.cancelled"
    # A Cancel of an Action that has ended is answered with its terminal result at once.
    again = await handle.cancel(requested_by="user:demo")
    assert (again.accepted, again.state, again.result) == (False, "settled", result)


async def test_sigterm_lets_in_flight_work_finish_then_exits(stack: Stack) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=2.0, times=1))
    worker = await stack.spawn("w1")
    action = stack.action("models")
    handle = await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    code = await asyncio.to_thread(worker.terminate, 30.0)
    assert code == 0, worker.log_tail()
    result = await handle.result(timeout_s=5)
    assert (result.status, result.settled_by) == (ResultStatus.COMPLETED, "w1")
    await stack.settled_and_acked(timeout_s=5)


async def test_sigterm_past_the_grace_releases_the_lease_for_another_worker(
    stack: Stack,
) -> None:
    stack.fake.faults.add(RouteDelay(route=MODELS, delay_s=60, times=1))
    worker = await stack.spawn("w1", AIPD_SHUTDOWN_GRACE_S="1")
    action = stack.action("models")
    handle = await stack.publish(action)
    await stack.wait_owner(action.id, "w1")
    code = await asyncio.to_thread(worker.terminate, 30.0)
    assert code == 0, worker.log_tail()
    lease = await stack.lease(action.id)
    assert lease["owner"] == ""
    await stack.spawn("w2")
    result = await handle.result(timeout_s=20)
    assert (result.status, result.settled_by, result.fence) == (ResultStatus.COMPLETED, "w2", 2)


@pytest.mark.aip_family("audit_redaction", assertions=["raw_secret_absent"])
async def test_logs_are_json_lines_with_action_context_and_no_secret(stack: Stack) -> None:
    worker = await stack.spawn("w1")
    action = stack.action("models", trace_id="trace-1234")
    await (await stack.publish(action)).result(timeout_s=20)
    await asyncio.sleep(0.5)
    records = [json.loads(line) for line in worker.log_text().splitlines() if line.strip()]
    settled = [r for r in records if r.get("action_id") == action.id]
    assert settled, worker.log_tail()
    record = settled[-1]
    assert record["capability"] == f"cap:hermes_agent:{ENDPOINT}:models"
    assert (record["fence"], record["trace_id"], record["worker_id"]) == (1, "trace-1234", "w1")
    assert record["endpoint"] == ENDPOINT
    assert (stack.root / "hermes.key").read_text() not in worker.log_text()


@pytest.mark.chaos
@pytest.mark.aip_family("restart_reconnect", assertions=["reconnect_cursor_resumed"])
async def test_chunks_follow_resumes_after_a_nats_restart_without_gaps_or_duplicates(
    stack: Stack, nats_server: ServiceHandle
) -> None:
    await stack.spawn("w1")
    _, handle = await stack.operator(f"{SLOW_REPLY} follow me")
    seen: list[int] = []

    async def follow() -> None:
        async for chunk in handle.chunks(idle_timeout_s=60):
            seen.append(chunk.seq)

    follower = asyncio.create_task(follow())
    while len(seen) < 5:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(nats_server.kill)
    await asyncio.sleep(0.5)
    await asyncio.to_thread(nats_server.restart)
    await asyncio.wait_for(follower, 90)
    assert seen == list(range(len(seen)))
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
