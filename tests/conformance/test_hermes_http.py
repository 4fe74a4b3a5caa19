"""HTTP behaviour of Hermes 0.19.0 that the worker relies on, checked on the fake and the real,
and the same routes after 0.19 on the fake with its post-0.19 flags.

Every test runs through the `hermes` fixture (`fake`, `real`, `fake-upstream`): if the real
server disagrees, the fake is wrong. Where upstream Hermes changed a behaviour after 0.19
(a durable run Idempotency-Key, `interrupted` after a restart, `run_not_active`, approval
`request_id`), the test says what each one answers (`hermes.upstream`). Tests that read the
fake's stats are marked fake-only.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from tests.conformance.conftest import Hermes
from tests.conformance.run_events import (
    AFTER_TOOL,
    RUN_ID,
    Event,
    answer,
    names,
    read_events,
    start_run,
    status_of,
    text_of,
    wait_status,
)
from worker.testing.scenario import (
    APPROVAL_COMMAND,
    ECHO_COMMAND,
    HELD_REPLY,
    LLM_ERROR,
    NEEDS_APPROVAL,
    NEEDS_TWO_APPROVALS,
    SLOW_REPLY,
    TOOL_ECHO,
    reply_text,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

UNAUTHORIZED = {
    "error": {
        "message": "Invalid API key",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }
}
SESSION_KEYS = [
    "id", "source", "user_id", "model", "title", "started_at", "ended_at", "end_reason",
    "message_count", "tool_call_count", "input_tokens", "output_tokens", "cache_read_tokens",
    "cache_write_tokens", "reasoning_tokens", "estimated_cost_usd", "actual_cost_usd",
    "api_call_count", "parent_session_id", "has_system_prompt", "has_model_config",
]  # fmt: skip


# --- helpers -------------------------------------------------------------------------------


def error_code(response: httpx.Response) -> str | None:
    code: str | None = response.json()["error"]["code"]
    return code


# --- auth, health, discovery ---------------------------------------------------------------


async def test_health_needs_no_key_and_reports_0_19_0(hermes: Hermes) -> None:
    async with httpx.AsyncClient(base_url=hermes.url) as anonymous:
        for path in ("/health", "/v1/health"):
            response = await anonymous.get(path)
            assert response.status_code == 200
            assert response.json() == {
                "status": "ok",
                "platform": "hermes-agent",
                "version": "0.19.0",
            }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/runs"),
        ("GET", "/v1/runs/run_00000000000000000000000000000000"),
        ("GET", "/health/detailed"),
        ("GET", "/v1/models"),
        ("GET", "/api/sessions"),
        ("GET", "/api/jobs"),
        ("GET", "/v1/responses/resp_x"),
    ],
)
async def test_a_missing_or_wrong_key_gets_the_401_envelope_without_param(
    hermes: Hermes, method: str, path: str
) -> None:
    async with httpx.AsyncClient(base_url=hermes.url) as anonymous:
        missing = await anonymous.request(method, path, json={"input": "x"})
        wrong = await anonymous.request(
            method, path, json={"input": "x"}, headers={"Authorization": "Bearer wrong-key"}
        )
    for response in (missing, wrong):
        assert response.status_code == 401
        assert response.json() == UNAUTHORIZED


async def test_json_replies_carry_security_headers(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


async def test_origin_header_is_refused_with_an_empty_403(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models", headers={"Origin": "http://evil.example"})
    assert response.status_code == 403
    assert response.content == b""


async def test_unknown_path_and_wrong_method_are_aiohttp_text(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.text == "404: Not Found"
    wrong = await client.put("/api/sessions")
    assert wrong.status_code == 405
    assert wrong.text == "405: Method Not Allowed"


async def test_profile_prefix_is_ignored(client: httpx.AsyncClient) -> None:
    plain = await client.get("/v1/models")
    mirrored = await client.get("/p/anything/v1/models")
    assert mirrored.status_code == 200
    assert mirrored.json()["data"][0]["id"] == plain.json()["data"][0]["id"] == "hermes-agent"


async def test_discovery_routes(client: httpx.AsyncClient) -> None:
    capabilities = (await client.get("/v1/capabilities")).json()
    assert capabilities["object"] == "hermes.api_server.capabilities"
    assert capabilities["features"]["run_events_sse"] is True
    assert capabilities["features"]["jobs_admin"] is False
    assert capabilities["endpoints"]["runs"] == {"method": "POST", "path": "/v1/runs"}
    assert (await client.get("/v1/skills")).json() == {"object": "list", "data": []}
    toolsets = (await client.get("/v1/toolsets")).json()
    assert toolsets["platform"] == "api_server"
    assert [t["name"] for t in toolsets["data"]][:4] == ["web", "browser", "terminal", "file"]
    assert len(toolsets["data"]) == 25
    terminal = next(t for t in toolsets["data"] if t["name"] == "terminal")
    assert terminal["tools"] == ["process", "terminal"]
    detailed = (await client.get("/health/detailed")).json()
    assert detailed["version"] == "0.19.0"
    assert "active_api_runs" in detailed["readiness"]["checks"]["background_queues"]


# --- runs ----------------------------------------------------------------------------------


async def test_plain_run_streams_deltas_then_reasoning_then_completed(
    client: httpx.AsyncClient,
) -> None:
    text = "plain words for the conformance test"
    run_id = await start_run(client, text)
    events, comments = await read_events(client, run_id)

    assert names(events) == ["message.delta", "reasoning.available", "run.completed"]
    assert text_of(events) == reply_text(text)
    assert events[-2]["text"] == reply_text(text)
    assert events[-1]["output"] == reply_text(text)
    assert set(events[-1]["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert comments[-1] == ": stream closed"
    status = await status_of(client, run_id)
    assert status["object"] == "hermes.run"
    assert status["status"] == "completed"
    assert status["output"] == reply_text(text)
    assert status["session_id"] == run_id
    assert status["last_event"] == "run.completed"
    assert {"created_at", "updated_at", "model", "usage"} <= set(status)


async def test_tool_echo_run_reports_the_tool_before_the_reply(client: httpx.AsyncClient) -> None:
    text = f"please {TOOL_ECHO}"
    run_id = await start_run(client, text)
    events, _ = await read_events(client, run_id)

    assert names(events) == [
        "tool.started",
        "tool.completed",
        "message.delta",
        "reasoning.available",
        "run.completed",
    ]
    assert events[0]["tool"] == "terminal"
    assert events[0]["preview"] == ECHO_COMMAND
    assert events[1]["error"] is False
    assert isinstance(events[1]["duration"], float)
    assert text_of(events) == AFTER_TOOL + reply_text(text)
    assert events[-1]["output"] == reply_text(text)


async def test_llm_error_run_fails_with_an_error_string(client: httpx.AsyncClient) -> None:
    run_id = await start_run(client, f"break {LLM_ERROR}")
    events, _ = await read_events(client, run_id)

    assert names(events) == ["run.failed"]
    assert events[0]["error"].startswith("HTTP 400: ")
    status = await status_of(client, run_id)
    assert status["status"] == "failed"
    assert status["error"] == events[0]["error"]


async def test_session_id_is_echoed_in_the_status(client: httpx.AsyncClient) -> None:
    run_id = await start_run(client, "with a session", session_id="conformance-sess-1")
    await read_events(client, run_id)
    status = await status_of(client, run_id)
    assert status["session_id"] == "conformance-sess-1"
    assert status["model"] == "hermes-agent"


async def test_missing_input_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/runs", json={"session_id": "no-input"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_approval_once_runs_the_command_and_a_late_answer_is_not_active(
    hermes: Hermes, client: httpx.AsyncClient
) -> None:
    run_id = await start_run(client, f"approve {NEEDS_APPROVAL}")
    events, _ = await read_events(client, run_id, answer("once"))

    assert names(events) == [
        "tool.started",
        "approval.request",
        "approval.responded",
        "tool.completed",
        "message.delta",
        "reasoning.available",
        "run.completed",
    ]
    request = events[1]
    assert request["command"] == APPROVAL_COMMAND
    assert request["choices"] == ["once", "session", "always", "deny"]
    assert request["pattern_keys"] == [request["pattern_key"]]
    assert request["allow_permanent"] is True
    assert isinstance(request["description"], str)
    assert events[2]["choice"] == "once"
    assert events[3]["error"] is False
    # After 0.19 each prompt names itself; 0.19 has no approval id.
    assert ("request_id" in request) is hermes.upstream
    late = await client.post(f"/v1/runs/{run_id}/approval", json={"choice": "once"})
    assert late.status_code == 409
    assert error_code(late) == ("run_not_active" if hermes.upstream else "approval_not_active")


async def test_a_command_run_twice_asks_twice_and_each_once_answers_one_prompt(
    client: httpx.AsyncClient,
) -> None:
    """The two-generation scenario of qualification item 5: a `once` decision approves one
    command, so the same command again is a second prompt of the same run."""
    run_id = await start_run(client, f"twice {NEEDS_TWO_APPROVALS}")
    events, _ = await read_events(client, run_id, answer("once"))

    prompt = ["tool.started", "approval.request", "approval.responded", "tool.completed"]
    assert names(events) == [
        *prompt,
        *prompt,
        "message.delta",
        "reasoning.available",
        "run.completed",
    ]
    assert [e["command"] for e in events if e["event"] == "approval.request"] == [
        APPROVAL_COMMAND,
        APPROVAL_COMMAND,
    ]
    assert (await status_of(client, run_id))["status"] == "completed"


async def test_deny_still_ends_the_run_completed(client: httpx.AsyncClient) -> None:
    run_id = await start_run(client, f"deny {NEEDS_APPROVAL}")
    events, _ = await read_events(client, run_id, answer("deny"))

    assert names(events)[:4] == [
        "tool.started",
        "approval.request",
        "approval.responded",
        "tool.completed",
    ]
    assert events[3]["error"] is True
    assert events[-1]["event"] == "run.completed"
    assert (await status_of(client, run_id))["status"] == "completed"


async def test_bad_choice_is_400_and_nothing_pending_is_409(client: httpx.AsyncClient) -> None:
    # A slow reply keeps the run active for seconds, so "nothing pending" is observed on a
    # live run however loaded the machine is (a fast run could already be over: 409 active).
    async def probe(http: httpx.AsyncClient, run_id: str, event: Event) -> None:
        if event["event"] == "message.delta" and event["delta"] == "tick1 ":
            bad = await http.post(f"/v1/runs/{run_id}/approval", json={"choice": "maybe"})
            assert bad.status_code == 400
            assert error_code(bad) == "invalid_approval_choice"
            idle = await http.post(f"/v1/runs/{run_id}/approval", json={"choice": "once"})
            assert idle.status_code == 409
            assert error_code(idle) == "approval_not_pending"
            stopped = await http.post(f"/v1/runs/{run_id}/stop")
            assert stopped.status_code == 200

    run_id = await start_run(client, f"probe {SLOW_REPLY}")
    events, _ = await read_events(client, run_id, probe)
    assert events[-1]["event"] == "run.cancelled"


async def test_stop_during_a_slow_reply_cancels_and_a_second_stop_is_404(
    hermes: Hermes, client: httpx.AsyncClient
) -> None:
    async def stop_after_three(http: httpx.AsyncClient, run_id: str, event: Event) -> None:
        if event["event"] == "message.delta" and event["delta"] == "tick2 ":
            response = await http.post(f"/v1/runs/{run_id}/stop")
            assert response.status_code == 200
            assert response.json() == {"run_id": run_id, "status": "stopping"}

    run_id = await start_run(client, f"slowly {SLOW_REPLY}")
    events, _ = await read_events(client, run_id, stop_after_three)

    assert names(events) == ["message.delta", "run.cancelled"]
    status = await status_of(client, run_id)
    assert status["status"] == "cancelled"
    assert status["last_event"] == "run.cancelled"
    again = await client.post(f"/v1/runs/{run_id}/stop")
    if hermes.upstream:  # after 0.19 the finished run is known, and not active
        assert again.status_code == 409
        assert error_code(again) == "run_not_active"
    else:
        assert again.status_code == 404
        assert error_code(again) == "run_not_found"


async def test_stop_while_waiting_for_approval_blocks_the_command_and_cancels(
    client: httpx.AsyncClient,
) -> None:
    async def stop_at_approval(http: httpx.AsyncClient, run_id: str, event: Event) -> None:
        if event["event"] == "approval.request":
            assert (await http.post(f"/v1/runs/{run_id}/stop")).status_code == 200

    run_id = await start_run(client, f"then stop {NEEDS_APPROVAL}")
    events, _ = await read_events(client, run_id, stop_at_approval)

    assert names(events) == ["tool.started", "approval.request", "tool.completed", "run.cancelled"]
    assert events[2]["error"] is True
    assert (await status_of(client, run_id))["status"] == "cancelled"


async def test_unknown_run_is_a_404_envelope_on_every_run_route(
    client: httpx.AsyncClient,
) -> None:
    run_id = "run_" + "0" * 32
    expected = {
        "error": {
            "message": f"Run not found: {run_id}",
            "type": "invalid_request_error",
            "param": None,
            "code": "run_not_found",
        }
    }
    responses = [
        await client.get(f"/v1/runs/{run_id}"),
        await client.get(f"/v1/runs/{run_id}/events"),
        await client.post(f"/v1/runs/{run_id}/stop"),
        await client.post(f"/v1/runs/{run_id}/approval", json={"choice": "once"}),
    ]
    for response in responses:
        assert response.status_code == 404
        assert response.json() == expected


async def test_the_event_stream_is_single_use(client: httpx.AsyncClient) -> None:
    run_id = await start_run(client, "read me once")
    await read_events(client, run_id)

    started = time.monotonic()
    second = await client.get(f"/v1/runs/{run_id}/events")
    assert second.status_code == 404
    assert error_code(second) == "run_not_found"
    assert time.monotonic() - started >= 0.5  # Hermes polls ~1 s before giving up
    assert (await status_of(client, run_id))["status"] == "completed"


async def test_a_late_first_subscriber_gets_every_buffered_event(
    client: httpx.AsyncClient,
) -> None:
    text = f"late reader {TOOL_ECHO}"
    run_id = await start_run(client, text)
    await wait_status(client, run_id, "completed")

    events, comments = await read_events(client, run_id)
    assert names(events) == [
        "tool.started",
        "tool.completed",
        "message.delta",
        "reasoning.available",
        "run.completed",
    ]
    assert comments == [": stream closed"]


async def test_the_eleventh_live_run_is_refused_with_retry_after(
    client: httpx.AsyncClient,
) -> None:
    responses = await asyncio.gather(
        *(client.post("/v1/runs", json={"input": f"{i} {HELD_REPLY}"}) for i in range(10))
    )
    run_ids = [r.json()["run_id"] for r in responses if r.status_code == 202]
    try:
        assert len(run_ids) == 10
        refused = await client.post("/v1/runs", json={"input": "the eleventh"})
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "1"
        assert refused.json() == {
            "error": {
                "message": "Too many concurrent runs (max 10)",
                "type": "rate_limit_error",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
    finally:
        await asyncio.gather(*(client.post(f"/v1/runs/{r}/stop") for r in run_ids))
        for run_id in run_ids:
            await wait_status(client, run_id, "cancelled", "completed")


async def test_restart_forgets_every_run(hermes: Hermes, client: httpx.AsyncClient) -> None:
    run_id = await start_run(client, "remember me")
    await read_events(client, run_id)
    assert (await status_of(client, run_id))["status"] == "completed"

    await hermes.restart()

    response = await client.get(f"/v1/runs/{run_id}")
    if hermes.upstream:  # after 0.19 run records outlive a restart
        assert response.status_code == 200
        assert response.json()["status"] == "completed"
    else:
        assert response.status_code == 404
        assert error_code(response) == "run_not_found"


async def test_a_restart_mid_run_forgets_it_or_marks_it_interrupted(
    hermes: Hermes, client: httpx.AsyncClient
) -> None:
    run_id = await start_run(client, f"cut short {SLOW_REPLY}")
    await wait_status(client, run_id, "running")

    await hermes.restart()

    response = await client.get(f"/v1/runs/{run_id}")
    if hermes.upstream:
        assert response.status_code == 200
        status = response.json()
        assert status["status"] == "interrupted"
        assert status["last_event"] == "run.interrupted"
        assert isinstance(status["error"], str)
        stop = await client.post(f"/v1/runs/{run_id}/stop")
        assert stop.status_code == 409
        assert error_code(stop) == "run_not_active"
    else:
        assert response.status_code == 404
        assert error_code(response) == "run_not_found"


async def test_idempotency_key_on_a_run_start_is_honoured_only_after_0_19(
    hermes: Hermes, client: httpx.AsyncClient
) -> None:
    capabilities = (await client.get("/v1/capabilities")).json()
    advertised = capabilities["features"].get("runs_idempotency") is True
    assert advertised is hermes.upstream
    key = {"Idempotency-Key": f"conformance-{time.time_ns()}"}
    body = {"input": f"keyed start {time.time_ns()}"}
    first = await client.post("/v1/runs", json=body, headers=key)
    again = await client.post("/v1/runs", json=body, headers=key)
    assert first.status_code == again.status_code == 202
    run_ids = {first.json()["run_id"], again.json()["run_id"]}
    for run_id in run_ids:
        await read_events(client, run_id)
    if not hermes.upstream:
        assert len(run_ids) == 2  # 0.19 ignores the header here: two runs
        return
    assert len(run_ids) == 1
    other = await client.post("/v1/runs", json={"input": "another body"}, headers=key)
    assert other.status_code == 409
    assert error_code(other) == "idempotency_key_conflict"
    await hermes.restart()  # the key store is durable
    after = await client.post("/v1/runs", json=body, headers=key)
    assert after.status_code == 202
    assert after.json()["run_id"] in run_ids


async def test_every_start_is_counted_once(hermes: Hermes, client: httpx.AsyncClient) -> None:
    fake = hermes.require_fake()
    before = fake.stats().count("POST /v1/runs")
    run_id = await start_run(client, "count me", session_id="counted-session")
    await read_events(client, run_id)
    stats = fake.stats()
    assert stats.count("POST /v1/runs") == before + 1
    assert stats.session_starts["counted-session"] == 1
    assert stats.runs[run_id] == {"GET /v1/runs/{run_id}/events": 1}


# --- sessions ------------------------------------------------------------------------------


async def test_session_crud_shapes(client: httpx.AsyncClient) -> None:
    created = await client.post("/api/sessions", json={"title": "Conformance  Alpha"})
    assert created.status_code == 201
    body = created.json()
    assert body["object"] == "hermes.session"
    session = body["session"]
    assert list(session) == SESSION_KEYS
    assert re.match(r"^api_\d+_[0-9a-f]{8}$", session["id"])
    assert session["title"] == "Conformance Alpha"
    assert session["source"] == "api_server"
    assert session["model"] == "hermes-agent"
    sid = session["id"]

    assert (await client.get(f"/api/sessions/{sid}")).json() == body
    patched = await client.patch(f"/api/sessions/{sid}", json={"title": "Conformance Beta"})
    assert patched.status_code == 200
    assert patched.json()["session"]["title"] == "Conformance Beta"
    bad_field = await client.patch(f"/api/sessions/{sid}", json={"foo": 1, "model": "x"})
    assert bad_field.status_code == 400
    assert bad_field.json()["error"]["message"] == "Unsupported session fields: foo, model"

    listing = (await client.get("/api/sessions", params={"limit": 999})).json()
    assert listing["object"] == "list"
    assert listing["limit"] == 200
    row = next(r for r in listing["data"] if r["id"] == sid)
    assert list(row)[-4:] == ["last_active", "preview", "has_system_prompt", "has_model_config"]

    messages = (await client.get(f"/api/sessions/{sid}/messages")).json()
    assert messages == {"object": "list", "session_id": sid, "data": []}

    fork = await client.post(f"/api/sessions/{sid}/fork", json={})
    assert fork.status_code == 201
    child = fork.json()["session"]
    assert child["parent_session_id"] == sid
    assert child["title"] == "Conformance Beta #2"
    source = (await client.get(f"/api/sessions/{sid}")).json()["session"]
    assert source["end_reason"] == "branched"

    deleted = await client.delete(f"/api/sessions/{sid}")
    assert deleted.json() == {"object": "hermes.session.deleted", "id": sid, "deleted": True}
    gone = await client.get(f"/api/sessions/{sid}")
    assert gone.status_code == 404
    assert error_code(gone) == "session_not_found"
    orphan = (await client.get(f"/api/sessions/{child['id']}")).json()["session"]
    assert orphan["parent_session_id"] is None


async def test_session_create_rejects_bad_ids_and_duplicates(client: httpx.AsyncClient) -> None:
    bad = await client.post("/api/sessions", json={"id": "a/b"})
    assert bad.status_code == 400
    assert error_code(bad) == "invalid_session_id"
    first = await client.post("/api/sessions", json={"id": "conformance-dup"})
    assert first.status_code == 201
    again = await client.post("/api/sessions", json={"id": "conformance-dup"})
    assert again.status_code == 409
    assert error_code(again) == "session_exists"


async def test_session_chat_replies_and_records_the_turn(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/api/sessions", json={})).json()["session"]["id"]
    text = "hello session chat"
    response = await client.post(f"/api/sessions/{sid}/chat", json={"message": text})
    assert response.status_code == 200
    assert response.headers["X-Hermes-Session-Id"] == sid
    body = response.json()
    assert body["object"] == "hermes.session.chat.completion"
    assert body["session_id"] == sid
    assert body["message"] == {"role": "assistant", "content": reply_text(text)}
    roles = [m["role"] for m in (await client.get(f"/api/sessions/{sid}/messages")).json()["data"]]
    assert roles == ["user", "assistant"]
    missing = await client.post(f"/api/sessions/{sid}/chat", json={"message": "  "})
    assert missing.status_code == 400
    assert error_code(missing) == "missing_message"


async def test_session_chat_stream_event_sequence(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/api/sessions", json={})).json()["session"]["id"]
    text = "hello session stream"
    events: list[tuple[str, Event]] = []
    async with client.stream(
        "POST", f"/api/sessions/{sid}/chat/stream", json={"message": text}
    ) as response:
        assert response.status_code == 200
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    shown = [n for n, _ in events if n != "assistant.delta"]
    assert shown == [
        "run.started",
        "message.started",
        "tool.progress",
        "assistant.completed",
        "run.completed",
        "done",
    ]
    assert [e["seq"] for _, e in events] == list(range(1, len(events) + 1))
    assert all(e["session_id"] == sid and RUN_ID.match(e["run_id"]) for _, e in events)
    deltas = "".join(e["delta"] for n, e in events if n == "assistant.delta")
    assert deltas == reply_text(text)
    completed = dict(events)["assistant.completed"]
    assert completed["content"] == reply_text(text)


# --- chat completions ----------------------------------------------------------------------


async def test_chat_completion_non_stream_shape(client: httpx.AsyncClient) -> None:
    text = "hi chat"
    response = await client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]}
    )
    assert response.status_code == 200
    assert response.headers["X-Hermes-Session-Id"].startswith("api-")
    body = response.json()
    assert re.match(r"^chatcmpl-[0-9a-f]{29}$", body["id"])
    assert body["object"] == "chat.completion"
    assert body["model"] == "hermes-agent"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": reply_text(text)},
            "finish_reason": "stop",
        }
    ]
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert "hermes" not in body


async def test_chat_completion_failure_is_a_200_with_a_hermes_block(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": f"fail {LLM_ERROR}"}]},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "error"
    assert body["hermes"]["failed"] is True
    assert body["hermes"]["error_code"] == "agent_error"
    assert response.headers["X-Hermes-Completed"] == "false"
    assert response.headers["X-Hermes-Error"].startswith("HTTP 400: ")


async def test_chat_completion_stream_frames(client: httpx.AsyncClient) -> None:
    text = f"stream {TOOL_ECHO}"
    frames: list[tuple[str, str]] = []
    async with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": text}], "stream": True},
    ) as response:
        assert response.status_code == 200
        assert "X-Content-Type-Options" not in response.headers
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                frames.append((name, line.removeprefix("data: ")))
                name = ""
    assert frames[-1] == ("", "[DONE]")
    chunks = [json.loads(data) for name, data in frames[:-1] if name == ""]
    progress = [json.loads(data) for name, data in frames if name == "hermes.tool.progress"]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == AFTER_TOOL + reply_text(text)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert set(chunks[-1]["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert [p["status"] for p in progress] == ["running", "completed"]
    assert progress[0]["tool"] == "terminal"
    assert progress[0]["label"] == ECHO_COMMAND
    assert progress[0]["toolCallId"] == progress[1]["toolCallId"]


async def test_idempotent_chat_replay_reuses_content_with_a_new_id(
    client: httpx.AsyncClient,
) -> None:
    payload = {"messages": [{"role": "user", "content": "idempotent hello"}]}
    headers = {"Idempotency-Key": f"conformance-{time.time_ns()}"}
    first = await client.post("/v1/chat/completions", json=payload, headers=headers)
    second = await client.post("/v1/chat/completions", json=payload, headers=headers)
    assert first.json()["choices"] == second.json()["choices"]
    assert first.json()["id"] != second.json()["id"]


# --- responses -----------------------------------------------------------------------------


async def test_response_non_stream_get_and_delete(client: httpx.AsyncClient) -> None:
    text = f"respond {TOOL_ECHO}"
    created = await client.post("/v1/responses", json={"input": text})
    assert created.status_code == 200
    body = created.json()
    assert re.match(r"^resp_[0-9a-f]{28}$", body["id"])
    assert body["status"] == "completed"
    assert [item["type"] for item in body["output"]] == [
        "function_call",
        "function_call_output",
        "message",
    ]
    assert isinstance(body["output"][1]["output"], str)
    assert body["output"][2]["content"][0]["text"].endswith(reply_text(text))
    fetched = await client.get(f"/v1/responses/{body['id']}")
    assert fetched.json() == body
    deleted = await client.delete(f"/v1/responses/{body['id']}")
    assert deleted.json() == {"id": body["id"], "object": "response", "deleted": True}
    gone = await client.get(f"/v1/responses/{body['id']}")
    assert gone.status_code == 404
    assert gone.json()["error"]["message"] == f"Response not found: {body['id']}"


async def test_response_stream_events_are_numbered(client: httpx.AsyncClient) -> None:
    text = "respond streaming"
    events: list[Event] = []
    async with client.stream(
        "POST", "/v1/responses", json={"input": text, "stream": True}
    ) as response:
        assert response.status_code == 200
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
                assert data != "[DONE]"
                event = json.loads(data)
                assert event["type"] == name
                events.append(event)
    types = [e["type"] for e in events if e["type"] != "response.output_text.delta"]
    assert types == [
        "response.created",
        "response.output_item.added",
        "response.output_text.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text_done = next(e for e in events if e["type"] == "response.output_text.done")
    assert text_done["text"] == reply_text(text)
    assert events[-1]["response"]["status"] == "completed"


# --- jobs ----------------------------------------------------------------------------------


async def test_jobs_crud(client: httpx.AsyncClient) -> None:
    created = await client.post(
        "/api/jobs", json={"name": "conformance job", "schedule": "every 30m", "prompt": "hi"}
    )
    assert created.status_code == 200
    job = created.json()["job"]
    assert re.match(r"^[0-9a-f]{12}$", job["id"])
    assert job["schedule"] == {"kind": "interval", "minutes": 30, "display": "every 30m"}
    assert job["enabled"] is True
    assert job["state"] == "scheduled"
    job_id = job["id"]

    assert (await client.get(f"/api/jobs/{job_id}")).json()["job"]["name"] == "conformance job"
    patched = await client.patch(f"/api/jobs/{job_id}", json={"schedule": "every 2h", "id": "x"})
    assert patched.json()["job"]["schedule"]["display"] == "every 120m"
    assert patched.json()["job"]["id"] == job_id
    paused = (await client.post(f"/api/jobs/{job_id}/pause")).json()["job"]
    assert (paused["enabled"], paused["state"]) == (False, "paused")
    listed = (await client.get("/api/jobs")).json()["jobs"]
    assert job_id not in [j["id"] for j in listed]
    listed = (await client.get("/api/jobs", params={"include_disabled": "true"})).json()["jobs"]
    assert job_id in [j["id"] for j in listed]
    resumed = (await client.post(f"/api/jobs/{job_id}/resume")).json()["job"]
    assert (resumed["enabled"], resumed["state"]) == (True, "scheduled")
    assert (await client.delete(f"/api/jobs/{job_id}")).json() == {"ok": True}
    assert (await client.delete(f"/api/jobs/{job_id}")).json() == {"error": "Job not found"}
    invalid = await client.get("/api/jobs/not-an-id")
    assert invalid.status_code == 400
    assert invalid.json() == {"error": "Invalid job ID format"}
    missing_name = await client.post("/api/jobs", json={"schedule": "every 30m"})
    assert missing_name.json() == {"error": "Name is required"}
    bad_schedule = await client.post("/api/jobs", json={"name": "x", "schedule": "whenever"})
    assert bad_schedule.status_code == 500
    assert bad_schedule.json()["error"].startswith("Invalid schedule 'whenever'.")
