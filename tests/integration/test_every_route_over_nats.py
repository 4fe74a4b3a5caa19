"""Every Hermes route as a capability, invoked over NATS through a real worker process,
against the fake Hermes and the real hermes-agent 0.19.0 alike (issue: the whole surface).

Each call is a signed Action; approval-requiring capabilities get a durable approval first;
every Action must end with a terminal chunk and exactly one ActionResult.
"""

from __future__ import annotations

import secrets
from typing import Any

from schemas.chunk import DoneChunk, ErrorChunk
from schemas.result import ActionResult, ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.testing.scenario import NEEDS_APPROVAL, reply_text


class Tour:
    """Invoke capabilities one by one and keep what came back."""

    def __init__(self, stack: Stack, approval_required: set[str]) -> None:
        self.stack = stack
        self.approval_required = approval_required
        self.seen: set[str] = set()

    async def __call__(self, operation: str, input: dict[str, Any]) -> ActionResult:
        action = self.stack.action(operation, input)
        if operation in self.approval_required:
            await self.stack.approve(action)
        handle = await self.stack.publish(action)
        result = await handle.result(timeout_s=90)
        chunks = [c async for c in handle.chunks(idle_timeout_s=30)]
        assert chunks, operation
        assert [c.seq for c in chunks] == list(range(len(chunks))), operation
        assert isinstance(chunks[-1], DoneChunk | ErrorChunk), operation
        assert len(await self.stack.results(action.id)) == 1, operation
        self.seen.add(operation)
        return result

    async def ok(self, operation: str, input: dict[str, Any]) -> Any:
        result = await self(operation, input)
        assert result.status is ResultStatus.COMPLETED, (operation, result.error)
        return result.output


async def test_every_route_is_invocable_over_nats(route_stack: Stack) -> None:
    stack = route_stack
    await stack.spawn("w1")
    manifest = await stack.client.manifest(ENDPOINT)
    published = {entry["operation"] for entry in manifest["capabilities"]}
    tour = Tour(
        stack,
        {e["operation"] for e in manifest["capabilities"] if e["approval_required"]},
    )

    for name in ("health", "health_detailed", "capabilities", "models", "skills", "toolsets"):
        await tour.ok(name, {})

    chat = await tour.ok("chat_completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat["choices"][0]["message"]["content"] == reply_text("hi")
    await tour.ok(
        "chat_completions",
        {"messages": [{"role": "user", "content": "stream it"}], "stream": True},
    )
    response = await tour.ok("responses_create", {"input": "hello responses"})
    await tour.ok("responses_create", {"input": "streamed", "stream": True})
    await tour.ok("response_get", {"response_id": response["id"]})
    await tour.ok("response_delete", {"response_id": response["id"]})

    sid = "tour-" + secrets.token_hex(6)
    await tour.ok("session_create", {"id": sid, "title": "tour"})
    await tour.ok("session_get", {"session_id": sid})
    await tour.ok("session_update", {"session_id": sid, "title": "renamed"})
    await tour.ok("session_chat", {"session_id": sid, "message": "hello session"})
    await tour.ok("session_chat_stream", {"session_id": sid, "message": "again"})
    messages = await tour.ok("session_messages", {"session_id": sid})
    assert [m["role"] for m in messages["data"]] == ["user", "assistant"] * 2
    child = "tour-fork-" + secrets.token_hex(4)
    await tour.ok("session_fork", {"session_id": sid, "id": child})
    await tour.ok("session_list", {"limit": 200})
    await tour.ok("session_delete", {"session_id": child})
    await tour.ok("session_delete", {"session_id": sid})

    started = await tour.ok("run_start", {"input": "hello run"})
    await tour.ok("run_events", {"run_id": started["run_id"]})
    await tour.ok("run_status", {"run_id": started["run_id"]})
    waiting = await tour.ok("run_start", {"input": f"tidy {NEEDS_APPROVAL}"})
    run_id = waiting["run_id"]
    while (await tour.ok("run_status", {"run_id": run_id}))["status"] != "waiting_for_approval":
        pass
    await tour.ok("run_approval", {"run_id": run_id, "choice": "deny"})
    stoppable = await tour.ok("run_start", {"input": f"stop me {NEEDS_APPROVAL}"})
    while (await tour.ok("run_status", {"run_id": stoppable["run_id"]}))["status"] not in (
        "waiting_for_approval",
        "running",
    ):
        pass
    await tour.ok("run_stop", {"run_id": stoppable["run_id"]})

    job = await tour.ok("job_create", {"name": "tour job", "schedule": "every 30m", "prompt": "hi"})
    job_id = job["job"]["id"]
    await tour.ok("job_get", {"job_id": job_id})
    await tour.ok("job_update", {"job_id": job_id, "name": "renamed"})
    await tour.ok("job_pause", {"job_id": job_id})
    await tour.ok("job_list", {"include_disabled": True})
    await tour.ok("job_resume", {"job_id": job_id})
    await tour.ok("job_run", {"job_id": job_id})
    await tour.ok("job_delete", {"job_id": job_id})

    _, handle = await stack.operator("tour the operator")
    assert (await handle.result(timeout_s=90)).status is ResultStatus.COMPLETED
    tour.seen.add("operator")
    assert tour.seen == published
