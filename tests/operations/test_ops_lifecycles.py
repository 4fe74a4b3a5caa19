"""Every operation against the Hermes server under test (fake and real), as a user drives them.

Each test walks one resource through its routes: what is created can be read, changed and
deleted, and the streams publish chunks as they arrive and end on their terminal event.
"""

from __future__ import annotations

import asyncio
import secrets

import pytest
from ops_harness import HermesServer, Invoke, endpoint_for

from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.hermes.http_client import HermesClient
from worker.testing.scenario import LLM_ERROR, NEEDS_APPROVAL, SLOW_REPLY, reply_text

pytestmark = pytest.mark.asyncio(loop_scope="session")

DISCOVERY = ["health", "health_detailed", "capabilities", "models", "skills", "toolsets"]


@pytest.mark.parametrize("name", DISCOVERY)
async def test_discovery_reads_complete_with_the_provider_document(
    invoke: Invoke, name: str
) -> None:
    result = await invoke(name, {})
    assert result.status is ResultStatus.COMPLETED
    assert isinstance(result.output, dict)
    # A non-streaming capability publishes no chunk: the result is its whole answer.
    assert result.ctx.kinds() == []


async def test_health_needs_no_key_but_protected_reads_do(
    invoke: Invoke, hermes: HermesServer
) -> None:
    keyless = HermesClient(endpoint_for(hermes.url, None))
    try:
        assert (await invoke("health", {}, client=keyless)).status is ResultStatus.COMPLETED
        models = await invoke("models", {}, client=keyless)
    finally:
        await keyless.aclose()
    assert models.error_code() == ErrorCode.MISSING_CREDENTIAL


@pytest.mark.aip_family("errors_uncertain_outcomes", assertions=["protocol_fields_preserved"])
async def test_a_wrong_key_is_an_authentication_failure(
    invoke: Invoke, hermes: HermesServer
) -> None:
    wrong = HermesClient(endpoint_for(hermes.url, "w" * 40))
    try:
        result = await invoke("models", {}, client=wrong)
    finally:
        await wrong.aclose()
    assert result.error_code() == ErrorCode.AUTHENTICATION
    assert result.protocol_error().remote_status == 401


async def test_session_lifecycle(invoke: Invoke) -> None:
    sid = "ops-" + secrets.token_hex(6)
    created = await invoke("session_create", {"id": sid, "title": "T " + sid})
    assert created.status is ResultStatus.COMPLETED
    assert created.output["session"]["id"] == sid

    got = await invoke("session_get", {"session_id": sid})
    assert got.output["session"]["title"] == "T " + sid

    updated = await invoke("session_patch", {"session_id": sid, "title": None})
    assert updated.output["session"]["title"] is None

    chat = await invoke("session_chat", {"session_id": sid, "message": "hello session"})
    assert chat.status is ResultStatus.COMPLETED
    assert chat.output["message"]["content"] == reply_text("hello session")

    streamed = await invoke("session_chat_stream", {"session_id": sid, "message": "again"})
    assert streamed.status is ResultStatus.COMPLETED
    assert streamed.output["content"] == reply_text("again")
    kinds = streamed.ctx.kinds()
    assert ChunkKind.DATA in kinds
    assert kinds[-1] is ChunkKind.DONE

    messages = await invoke("session_messages", {"session_id": sid})
    assert [m["role"] for m in messages.output["data"]] == ["user", "assistant"] * 2

    child = "ops-fork-" + secrets.token_hex(4)
    forked = await invoke("session_fork", {"session_id": sid, "id": child})
    assert forked.output["session"]["parent_session_id"] == sid

    listed = await invoke("sessions_list", {"limit": 200})
    assert {sid, child} <= {row["id"] for row in listed.output["data"]}

    for target in (child, sid):
        deleted = await invoke("session_delete", {"session_id": target})
        assert deleted.output["deleted"] is True
    gone = await invoke("session_get", {"session_id": sid})
    assert gone.error_code() == ErrorCode.REMOTE_REJECTED
    assert gone.protocol_error().remote_status == 404


@pytest.mark.aip_family("streaming_backpressure", assertions=["ordered_chunks"])
async def test_run_start_then_events_follow_it_to_completion(invoke: Invoke) -> None:
    started = await invoke("run_start", {"input": "hello run"})
    assert started.status is ResultStatus.COMPLETED
    run_id = started.output["run_id"]

    events = await invoke("run_events", {"run_id": run_id})
    assert events.status is ResultStatus.COMPLETED
    assert events.output["output"] == reply_text("hello run")
    assert events.output["streamed_text"] == reply_text("hello run")
    kinds = events.ctx.kinds()
    assert kinds[0] is ChunkKind.DATA
    assert kinds[-1] is ChunkKind.DONE
    assert ChunkKind.THOUGHT in kinds
    assert {chunk.run_id for chunk in events.ctx.chunks} == {run_id}
    assert [chunk.seq for chunk in events.ctx.chunks] == list(range(len(kinds)))

    status = await invoke("run_status", {"run_id": run_id})
    assert status.output["status"] == "completed"

    consumed = await invoke("run_events", {"run_id": run_id})
    assert consumed.error_code() == ErrorCode.REMOTE_REJECTED
    assert consumed.protocol_error().remote_status == 404


async def test_a_failed_run_fails_the_events_action_with_stream_failed(invoke: Invoke) -> None:
    run_id = (await invoke("run_start", {"input": f"please {LLM_ERROR}"})).output["run_id"]
    events = await invoke("run_events", {"run_id": run_id})
    assert events.status is ResultStatus.FAILED
    assert events.error_code() == ErrorCode.STREAM_FAILED
    assert events.ctx.kinds()[-1] is ChunkKind.ERROR
    assert events.ctx.chunks[-1].provider_event == "run.failed"


@pytest.mark.aip_family("cancellation_races", assertions=["in_flight_cancelled"])
async def test_a_stopped_run_ends_the_events_action_cancelled(invoke: Invoke) -> None:
    run_id = (await invoke("run_start", {"input": f"go {SLOW_REPLY}"})).output["run_id"]
    follower = asyncio.create_task(invoke("run_events", {"run_id": run_id}))
    await asyncio.sleep(0.8)
    stopped = await invoke("run_stop", {"run_id": run_id})
    assert stopped.output["status"] == "stopping"
    events = await asyncio.wait_for(follower, 20)
    assert events.status is ResultStatus.CANCELLED
    assert events.ctx.chunks[-1].provider_event == "run.cancelled"


async def test_an_approval_answered_through_run_approval_lets_the_run_complete(
    invoke: Invoke,
) -> None:
    run_id = (await invoke("run_start", {"input": f"do {NEEDS_APPROVAL}"})).output["run_id"]
    follower = asyncio.create_task(invoke("run_events", {"run_id": run_id}))
    for _ in range(100):
        status = await invoke("run_status", {"run_id": run_id})
        if status.output["status"] == "waiting_for_approval":
            break
        await asyncio.sleep(0.1)
    approved = await invoke("run_approval", {"run_id": run_id, "choice": "once"})
    assert approved.output["resolved"] == 1
    events = await asyncio.wait_for(follower, 30)
    assert events.status is ResultStatus.COMPLETED
    names = [chunk.provider_event for chunk in events.ctx.chunks]
    assert "approval.request" in names
    assert "approval.responded" in names


async def test_chat_and_chat_stream(invoke: Invoke) -> None:
    messages = [{"role": "user", "content": "hello chat"}]
    plain = await invoke("chat", {"messages": messages})
    assert plain.status is ResultStatus.COMPLETED
    assert plain.output["choices"][0]["message"]["content"] == reply_text("hello chat")
    # The sync twin never streams: no data chunk, only what the runtime ends an Action with.
    assert ChunkKind.DATA not in plain.ctx.kinds()

    streamed = await invoke("chat_stream", {"messages": messages})
    assert streamed.status is ResultStatus.COMPLETED
    assert streamed.output["content"] == reply_text("hello chat")
    assert streamed.ctx.kinds()[-1] is ChunkKind.DONE
    assert streamed.ctx.chunks[-1].provider_event == "[DONE]"


async def test_a_failed_chat_turn_is_a_failed_action_even_at_http_200(invoke: Invoke) -> None:
    messages = [{"role": "user", "content": f"x {LLM_ERROR}"}]
    plain = await invoke("chat", {"messages": messages})
    assert plain.status is ResultStatus.FAILED
    assert plain.error_code() == ErrorCode.REMOTE_REJECTED
    streamed = await invoke("chat_stream", {"messages": messages})
    assert streamed.status is ResultStatus.FAILED
    assert streamed.error_code() == ErrorCode.STREAM_FAILED


async def test_responses_and_responses_stream_get_delete(invoke: Invoke) -> None:
    plain = await invoke("responses", {"input": "hello responses"})
    assert plain.status is ResultStatus.COMPLETED
    response_id = plain.output["id"]

    streamed = await invoke("responses_stream", {"input": "streamed"})
    assert streamed.status is ResultStatus.COMPLETED
    assert streamed.output["status"] == "completed"
    assert ChunkKind.DATA in streamed.ctx.kinds()
    assert streamed.ctx.chunks[-1].provider_event == "response.completed"

    got = await invoke("response_get", {"response_id": response_id})
    assert got.output["id"] == response_id
    deleted = await invoke("response_delete", {"response_id": response_id})
    assert deleted.output["deleted"] is True
    gone = await invoke("response_get", {"response_id": response_id})
    assert gone.protocol_error().remote_status == 404


async def test_job_lifecycle(invoke: Invoke) -> None:
    created = await invoke(
        "job_create", {"name": "ops job", "schedule": "every 30m", "prompt": "say hi"}
    )
    assert created.status is ResultStatus.COMPLETED
    job_id = created.output["job"]["id"]

    assert (await invoke("job_get", {"job_id": job_id})).output["job"]["name"] == "ops job"
    updated = await invoke("job_update", {"job_id": job_id, "name": "renamed"})
    assert updated.output["job"]["name"] == "renamed"

    paused = await invoke("job_pause", {"job_id": job_id})
    assert paused.output["job"]["enabled"] is False
    visible = await invoke("jobs_list", {})
    assert job_id not in {job["id"] for job in visible.output["jobs"]}
    everything = await invoke("jobs_list", {"include_disabled": True})
    assert job_id in {job["id"] for job in everything.output["jobs"]}

    resumed = await invoke("job_resume", {"job_id": job_id})
    assert resumed.output["job"]["enabled"] is True
    assert (await invoke("job_run", {"job_id": job_id})).status is ResultStatus.COMPLETED

    assert (await invoke("job_delete", {"job_id": job_id})).output == {"ok": True}
    gone = await invoke("job_get", {"job_id": job_id})
    assert gone.protocol_error().remote_status == 404
