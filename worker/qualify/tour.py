"""Item 1: every published route of each endpoint, against the pinned Hermes (the route tour).

Each operation the endpoint's workers publish in their manifest is invoked once as a signed
Action (approved first when its manifest entry requires approval), in an order that gives
each the ids it needs (a session before its messages, a run before its status). Every
Action must end with one completed result; one of a streaming capability with a terminal
chunk after a gap-free chunk sequence, any other with no chunk at all (as upstream). An
operation of the manifest the tour did not reach fails the item. What the tour creates in
Hermes (sessions, responses, jobs, runs) it deletes or ends again.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from schemas.chunk import DoneChunk, ErrorChunk
from schemas.result import ResultStatus
from worker.operations.catalog import STREAMING
from worker.qualify.deployment import Evidence
from worker.qualify.items import Context, expect, fail
from worker.qualify.objectives import APPROVAL
from worker.wire.manifests import operation_of

#: How long a run may take to reach the status the tour waits for.
STATUS_WAIT_S = 60.0


class Tour:
    """Invoke one endpoint's capabilities one by one, remembering which ran."""

    def __init__(self, ctx: Context, evidence: Evidence, endpoint_id: str) -> None:
        self.deployment = ctx.deployment
        self.evidence = evidence
        self.endpoint_id = endpoint_id
        self.seen: set[str] = set()

    async def ok(self, operation: str, input: dict[str, Any]) -> Any:
        d = self.deployment
        outcome = await d.outcome(d.action(self.endpoint_id, operation, input))
        self.evidence.action(outcome.action.id)
        self.evidence.run(outcome.run_id if operation.startswith("run_") else None)
        where = f"{self.endpoint_id} {operation} ({outcome.action.id})"
        result = outcome.result
        expect(
            result.status is ResultStatus.COMPLETED,
            f"{where} ended {result.status.value} {outcome.error_code or ''}".rstrip(),
        )
        chunks = outcome.chunks
        if operation in STREAMING:
            expect(bool(chunks), f"{where} published no chunk")
            expect(
                [c.seq for c in chunks] == list(range(len(chunks))),
                f"{where}: chunk sequence has gaps",
            )
            expect(isinstance(chunks[-1], DoneChunk | ErrorChunk), f"{where}: no terminal chunk")
        else:
            expect(not chunks, f"{where}: a non-streaming capability published chunks")
            expect(result.last_chunk_sha256 is None, f"{where}: its result names a chunk")
        results = await d.result_count(self.endpoint_id, outcome.action.id)
        expect(results == 1, f"{where}: {results} results on the results stream, not 1")
        self.seen.add(operation)
        return result.output

    async def run_until(self, run_id: str, wanted: set[str]) -> None:
        deadline = time.monotonic() + STATUS_WAIT_S
        while (await self.ok("run_status", {"run_id": run_id}))["status"] not in wanted:
            if time.monotonic() > deadline:
                fail(f"{self.endpoint_id} run {run_id} never reached {sorted(wanted)}")
            await asyncio.sleep(0.2)

    async def everything(self) -> None:
        for name in ("health", "health_detailed", "capabilities", "models", "skills", "toolsets"):
            await self.ok(name, {})
        await self.ok("chat", {"messages": [{"role": "user", "content": "hi"}]})
        await self.ok("chat_stream", {"messages": [{"role": "user", "content": "stream it"}]})
        response = await self.ok("responses", {"input": "hello responses"})
        await self.ok("responses_stream", {"input": "streamed"})
        await self.ok("response_get", {"response_id": response["id"]})
        await self.ok("response_delete", {"response_id": response["id"]})
        await self._sessions()
        await self._runs()
        await self._jobs()
        await self.ok("operator", {"objective": "Reply with one short sentence."})

    async def _sessions(self) -> None:
        sid = "qualify-" + secrets.token_hex(6)
        await self.ok("session_create", {"id": sid, "title": f"qualify {sid}"})
        await self.ok("session_get", {"session_id": sid})
        await self.ok("session_patch", {"session_id": sid, "title": f"renamed {sid}"})
        await self.ok("session_chat", {"session_id": sid, "message": "hello session"})
        await self.ok("session_chat_stream", {"session_id": sid, "message": "again"})
        messages = await self.ok("session_messages", {"session_id": sid})
        roles = [m["role"] for m in messages["data"]]
        expect(
            roles.count("user") == 2,
            f"{self.endpoint_id} session {sid} holds {roles.count('user')} user turns, not 2",
        )
        child = "qualify-fork-" + secrets.token_hex(4)
        await self.ok("session_fork", {"session_id": sid, "id": child})
        await self.ok("sessions_list", {"limit": 200})
        await self.ok("session_delete", {"session_id": child})
        await self.ok("session_delete", {"session_id": sid})

    async def _runs(self) -> None:
        started = await self.ok("run_start", {"input": "hello run"})
        self.deployment.runs.add((self.endpoint_id, started["run_id"]))
        await self.ok("run_events", {"run_id": started["run_id"]})
        await self.ok("run_status", {"run_id": started["run_id"]})
        waiting = await self.ok("run_start", {"input": APPROVAL})
        self.deployment.runs.add((self.endpoint_id, waiting["run_id"]))
        await self.run_until(waiting["run_id"], {"waiting_for_approval"})
        await self.ok("run_approval", {"run_id": waiting["run_id"], "choice": "deny"})
        stoppable = await self.ok("run_start", {"input": APPROVAL})
        self.deployment.runs.add((self.endpoint_id, stoppable["run_id"]))
        await self.run_until(stoppable["run_id"], {"waiting_for_approval", "running"})
        await self.ok("run_stop", {"run_id": stoppable["run_id"]})

    async def _jobs(self) -> None:
        job = await self.ok(
            "job_create", {"name": "qualify job", "schedule": "every 30m", "prompt": "hi"}
        )
        job_id = job["job"]["id"]
        await self.ok("job_get", {"job_id": job_id})
        await self.ok("job_update", {"job_id": job_id, "name": "qualify job renamed"})
        await self.ok("job_pause", {"job_id": job_id})
        await self.ok("jobs_list", {"include_disabled": True})
        await self.ok("job_resume", {"job_id": job_id})
        await self.ok("job_run", {"job_id": job_id})
        await self.ok("job_delete", {"job_id": job_id})


async def route_tour(ctx: Context, evidence: Evidence) -> str:
    """Item 1, on every endpoint under qualification at once."""
    endpoint_ids = ctx.endpoints(max(1, len(ctx.endpoint_ids)))
    tours = [Tour(ctx, evidence, endpoint_id) for endpoint_id in endpoint_ids]
    await asyncio.gather(*(tour.everything() for tour in tours))
    counts = []
    for tour in tours:
        manifest = ctx.deployment.manifests[tour.endpoint_id]
        published = {
            name for entry in manifest["capabilities"] if (name := operation_of(entry)) is not None
        }
        missing = sorted(published - tour.seen)
        expect(not missing, f"{tour.endpoint_id}: routes not toured: {', '.join(missing)}")
        counts.append(f"{tour.endpoint_id} {len(tour.seen)}/{len(published)}")
    return "every published operation completed: " + ", ".join(counts)
