"""The real Hermes 0.19.0, driven by the fake LLM, gives each scenario word its run events.

The conformance suite compares the fake Hermes with the real one, so the real one must first
be proven to do what the scenario words promise: these tests start it through `RealHermes`
and read `POST /v1/runs` + `GET /v1/runs/{id}/events` for every scenario, plus the quirks the
worker relies on (the 11th live run is refused with `Retry-After`, a restart forgets runs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.conformance.run_events import (
    AFTER_TOOL,
    RUN_TIMEOUT_S,
    Event,
    answer,
    names,
    read_events,
    start_run,
    status_of,
    text_of,
)
from worker.testing.fake_llm import slow_deltas
from worker.testing.real_hermes import (
    SCENARIO_FILE,
    RealHermes,
    ensure_hermes_venv,
)
from worker.testing.scenario import (
    APPROVAL_COMMAND,
    ECHO_COMMAND,
    LLM_ERROR,
    NEEDS_APPROVAL,
    SLOW_DELTAS,
    SLOW_REPLY,
    TOOL_ECHO,
    reply_text,
)

pytestmark = [pytest.mark.real_hermes, pytest.mark.asyncio(loop_scope="session")]

_TERMINAL = frozenset({"completed", "failed", "cancelled"})


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def real_hermes(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RealHermes]:
    """One real gateway for the session; a missing venv skips locally and fails under CI."""
    await asyncio.to_thread(ensure_hermes_venv)
    async with RealHermes(tmp_path_factory.mktemp("real-hermes")) as real:
        yield real


@pytest_asyncio.fixture(loop_scope="session")
async def real_client(real_hermes: RealHermes) -> AsyncIterator[httpx.AsyncClient]:
    """A client already holding the key (named apart from the conftest's fake/real `client`).

    Its timeout is a run's: on a loaded host the real Hermes can take over 10 s to answer a
    request while ten runs start beside it (CI saw the eleventh run's 429 time out), and
    these tests judge the answers, not their speed.
    """
    headers = {"Authorization": f"Bearer {real_hermes.api_key}"}
    async with httpx.AsyncClient(
        base_url=real_hermes.url, headers=headers, timeout=RUN_TIMEOUT_S
    ) as http:
        yield http


def scenario_file(hermes: RealHermes) -> Path:
    path = hermes.scratch / SCENARIO_FILE
    path.chmod(0o644)
    return path


async def test_plain_input_streams_the_reply_then_completes(real_client: httpx.AsyncClient) -> None:
    text = "plain words for the launcher test"
    run_id = await start_run(real_client, text)
    events, _ = await read_events(real_client, run_id)

    assert names(events) == ["message.delta", "reasoning.available", "run.completed"]
    assert text_of(events) == reply_text(text)
    assert events[-2]["text"] == reply_text(text)
    assert events[-1]["output"] == reply_text(text)
    assert set(events[-1]["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    status = await status_of(real_client, run_id)
    assert status["status"] == "completed"
    assert status["output"] == reply_text(text)
    assert status["last_event"] == "run.completed"


async def test_tool_echo_runs_the_command_without_approval(
    real_hermes: RealHermes, real_client: httpx.AsyncClient
) -> None:
    text = f"please {TOOL_ECHO}"
    run_id = await start_run(real_client, text)
    events, _ = await read_events(real_client, run_id)

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
    assert text_of(events) == AFTER_TOOL + reply_text(text)
    assert events[-1]["output"] == reply_text(text)
    answered = [c for c in real_hermes.llm.calls if c.user_text == text and c.tool_results]
    assert "hello-from-tool" in answered[-1].tool_results[0]


async def test_approved_once_command_runs_and_the_run_completes(
    real_hermes: RealHermes, real_client: httpx.AsyncClient
) -> None:
    target = scenario_file(real_hermes)
    run_id = await start_run(real_client, f"approve {NEEDS_APPROVAL}")
    events, _ = await read_events(real_client, run_id, answer("once"))

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
    assert events[2]["choice"] == "once"
    assert events[3]["error"] is False
    assert target.stat().st_mode & 0o777 == 0o777
    late = await real_client.post(f"/v1/runs/{run_id}/approval", json={"choice": "once"})
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "approval_not_active"


async def test_denied_command_does_not_run_yet_the_run_completes(
    real_hermes: RealHermes, real_client: httpx.AsyncClient
) -> None:
    target = scenario_file(real_hermes)
    text = f"deny {NEEDS_APPROVAL}"
    run_id = await start_run(real_client, text)
    events, _ = await read_events(real_client, run_id, answer("deny"))

    assert names(events) == [
        "tool.started",
        "approval.request",
        "approval.responded",
        "tool.completed",
        "message.delta",
        "reasoning.available",
        "run.completed",
    ]
    assert events[2]["choice"] == "deny"
    assert events[3]["error"] is True
    assert target.stat().st_mode & 0o777 == 0o644
    answered = [c for c in real_hermes.llm.calls if c.user_text == text and c.tool_results]
    assert "BLOCKED" in answered[-1].tool_results[0]
    assert (await status_of(real_client, run_id))["status"] == "completed"


async def test_stop_during_a_slow_reply_cancels_the_run(real_client: httpx.AsyncClient) -> None:
    async def stop_after_three_deltas(http: httpx.AsyncClient, run_id: str, event: Event) -> None:
        if event["event"] == "message.delta" and event["delta"] == slow_deltas()[2]:
            response = await http.post(f"/v1/runs/{run_id}/stop")
            assert response.status_code == 200
            assert response.json() == {"run_id": run_id, "status": "stopping"}

    run_id = await start_run(real_client, f"slowly {SLOW_REPLY}")
    events, _ = await read_events(real_client, run_id, stop_after_three_deltas)

    assert names(events) == ["message.delta", "run.cancelled"]
    assert len(events) - 1 < SLOW_DELTAS
    status = await status_of(real_client, run_id)
    assert status["status"] == "cancelled"
    assert status["last_event"] == "run.cancelled"
    again = await real_client.post(f"/v1/runs/{run_id}/stop")
    assert again.status_code == 404
    assert again.json()["error"]["code"] == "run_not_found"


async def test_stop_while_waiting_for_approval_cancels_the_run(
    real_hermes: RealHermes, real_client: httpx.AsyncClient
) -> None:
    target = scenario_file(real_hermes)

    async def stop_at_approval(http: httpx.AsyncClient, run_id: str, event: Event) -> None:
        if event["event"] == "approval.request":
            assert (await http.post(f"/v1/runs/{run_id}/stop")).status_code == 200

    run_id = await start_run(real_client, f"then stop {NEEDS_APPROVAL}")
    events, _ = await read_events(real_client, run_id, stop_at_approval)

    # The approval wait notices the stop on its next 1 s poll and reports a blocked tool.
    assert names(events) == ["tool.started", "approval.request", "tool.completed", "run.cancelled"]
    assert events[2]["error"] is True
    assert target.stat().st_mode & 0o777 == 0o644
    assert (await status_of(real_client, run_id))["status"] == "cancelled"


async def test_llm_error_fails_the_run(real_client: httpx.AsyncClient) -> None:
    run_id = await start_run(real_client, f"break {LLM_ERROR}")
    events, _ = await read_events(real_client, run_id)

    assert names(events) == ["run.failed"]
    assert events[0]["error"].startswith("HTTP 400: ")
    status = await status_of(real_client, run_id)
    assert status["status"] == "failed"
    assert status["error"] == events[0]["error"]


async def test_eleventh_live_run_is_refused_with_retry_after(
    real_client: httpx.AsyncClient,
) -> None:
    # Runs held at an approval prompt stay live however slow the host is, unlike slow replies.
    responses = await asyncio.gather(
        *(real_client.post("/v1/runs", json={"input": f"{i} {NEEDS_APPROVAL}"}) for i in range(10))
    )
    run_ids = [r.json()["run_id"] for r in responses if r.status_code == 202]
    try:
        assert len(run_ids) == 10
        refused = await real_client.post("/v1/runs", json={"input": "the eleventh"})
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        await asyncio.gather(*(real_client.post(f"/v1/runs/{r}/stop") for r in run_ids))
        async with asyncio.timeout(RUN_TIMEOUT_S):
            # Later tests must not meet these runs still holding capacity.
            for run_id in run_ids:
                while (await status_of(real_client, run_id))["status"] not in _TERMINAL:
                    await asyncio.sleep(0.05)


async def test_restart_forgets_every_run(
    real_hermes: RealHermes, real_client: httpx.AsyncClient
) -> None:
    run_id = await start_run(real_client, "remember me")
    await read_events(real_client, run_id)
    assert (await status_of(real_client, run_id))["status"] == "completed"

    await real_hermes.restart()

    response = await real_client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "run_not_found"
