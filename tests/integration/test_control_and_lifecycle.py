"""Provisioning, discovery, cancellation of a plain call, and graceful shutdown."""

from __future__ import annotations

import asyncio
import json

import nats
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from schemas.result import ResultStatus
from subjects.grammar import Subjects
from subjects.provision import Change, provision
from subjects.streams import StreamPolicy
from tests.integration.stack import ENDPOINT, Stack
from worker.testing.fake_hermes import RouteDelay
from worker.testing.services import ServiceHandle

MODELS = "GET /v1/models"


async def test_provision_twice_changes_nothing(nats_server: ServiceHandle) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        first = await provision(js, Subjects(), ["h1", "h2"])
        second = await provision(js, Subjects(), ["h1", "h2"])
        assert {item.change for item in first} == {Change.CREATED}
        assert len(first) == 6 + 4
        assert {item.change for item in second} == {Change.UNCHANGED}
        third = await provision(js, Subjects(), ["h1"], StreamPolicy(duplicate_window_s=60))
        assert {i.name for i in third if i.change is Change.UPDATED} == {
            "AIP_HERMES_ACTIONS",
            "AIP_HERMES_DELEGATIONS",
            "AIP_HERMES_CHUNKS",
            "AIP_HERMES_RESULTS",
            "AIP_HERMES_DLQ",
            "AIP_HERMES_AUDIT",
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
    names = {entry["operation"] for entry in manifest["capabilities"]}
    assert {"health", "models", "operator", "run_start", "job_run"} <= names
    operator = next(e for e in manifest["capabilities"] if e["operation"] == "operator")
    assert operator["capability"] == f"cap:hermes_agent:{ENDPOINT}:operator"
    assert operator["approval_required"] is True
    assert operator["read_only"] is False
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
    reply = await handle.cancel(requested_by="user:demo", reason="not needed")
    assert reply.accepted
    result = await handle.result(timeout_s=10)
    assert result.status is ResultStatus.CANCELLED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.cancelled"
    again = await handle.cancel(requested_by="user:demo")
    assert (again.accepted, again.state) == (False, "settled")


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
