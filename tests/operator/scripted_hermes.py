"""A scriptable Hermes 0.19 run server for what the project's fake cannot script.

The fake plays at most one approval prompt per run and interrupts a stopped run at its next
step, so it cannot show two prompts (generation isolation), a completion that wins the race
with a stop, or a stop that never confirms. Only the run routes the operator uses exist. The
event stream answers 404 (as a consumed stream does), so the operator observes these runs by
polling. Each prompt is a new `approval.request` with a later `updated_at`, after a short
`running` phase, as the real server moves through `approval.responded` and the tool call.

`prompts`: approval prompts before the run completes (0: it runs `run_for_s`, then
completes). `stop_mode`: what `POST /stop` leads to: `cancel` (confirmed), `complete` (the
turn ends first: `completed` wins) or `ignore` (stays `stopping`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web

BETWEEN_PROMPTS_S = 0.05
STOP_LATENCY_S = 0.05


@dataclass
class StubRun:
    run_id: str
    status: str = "running"
    last_event: str = "run.started"
    updated_at: float = field(default_factory=time.time)
    prompt: int = 0
    choices: list[str] = field(default_factory=list)
    output: str | None = None

    def touch(self, status: str, event: str) -> None:
        self.status = status
        self.last_event = event
        self.updated_at = time.time()

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "object": "hermes.run",
            "run_id": self.run_id,
            "status": self.status,
            "last_event": self.last_event,
            "updated_at": self.updated_at,
        }
        if self.status == "completed":
            body["output"] = self.output
        return body


class ScriptedHermes:
    def __init__(
        self,
        api_key: str,
        *,
        prompts: int = 2,
        run_for_s: float = 30.0,
        stop_mode: str = "cancel",
    ) -> None:
        self.api_key = api_key
        self.prompts = prompts
        self.run_for_s = run_for_s
        self.stop_mode = stop_mode
        self.runs: dict[str, StubRun] = {}
        self.counts: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    def _not_found(self, run_id: str) -> web.Response:
        return web.json_response(
            {"error": {"message": f"Run not found: {run_id}", "code": "run_not_found"}},
            status=404,
        )

    def _spawn_prompt(self, run: StubRun) -> None:
        task = asyncio.get_running_loop().create_task(self._prompt_later(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prompt_later(self, run: StubRun) -> None:
        await asyncio.sleep(BETWEEN_PROMPTS_S)
        run.prompt += 1
        run.touch("waiting_for_approval", "approval.request")

    async def start(self, request: web.Request) -> web.Response:
        self.counts["POST /v1/runs"] += 1
        if not self._authorized(request):
            return web.json_response({"error": {"code": "invalid_api_key"}}, status=401)
        run = StubRun("run_" + secrets.token_hex(16))
        self.runs[run.run_id] = run
        if self.prompts:
            self._spawn_prompt(run)
        else:
            asyncio.get_running_loop().call_later(self.run_for_s, self._complete, run)
        return web.json_response({"run_id": run.run_id, "status": "started"}, status=202)

    async def status(self, request: web.Request) -> web.Response:
        self.counts["GET /v1/runs/{run_id}"] += 1
        run = self.runs.get(request.match_info["run_id"])
        return (
            self._not_found(request.match_info["run_id"])
            if run is None
            else (web.json_response(run.body()))
        )

    async def events(self, request: web.Request) -> web.Response:
        self.counts["GET /v1/runs/{run_id}/events"] += 1
        return self._not_found(request.match_info["run_id"])

    async def approve(self, request: web.Request) -> web.Response:
        self.counts["POST /v1/runs/{run_id}/approval"] += 1
        run = self.runs.get(request.match_info["run_id"])
        if run is None:
            return self._not_found(request.match_info["run_id"])
        if run.status != "waiting_for_approval":
            return web.json_response(
                {"error": {"message": "No pending approval", "code": "approval_not_pending"}},
                status=409,
            )
        choice = (await request.json())["choice"]
        run.choices.append(choice)
        run.touch("running", "approval.responded")
        if run.prompt < self.prompts:
            self._spawn_prompt(run)
        else:
            self._complete(run)
        return web.json_response(
            {
                "object": "hermes.run.approval_response",
                "run_id": run.run_id,
                "choice": choice,
                "resolved": 1,
            }
        )

    @staticmethod
    def _complete(run: StubRun) -> None:
        if run.status in ("running", "stopping"):
            run.output = f"done after {len(run.choices)} decisions"
            run.touch("completed", "run.completed")

    async def stop(self, request: web.Request) -> web.Response:
        self.counts["POST /v1/runs/{run_id}/stop"] += 1
        run = self.runs.get(request.match_info["run_id"])
        if run is None or run.status in ("completed", "failed", "cancelled"):
            return self._not_found(request.match_info["run_id"])
        run.touch("stopping", run.last_event)
        loop = asyncio.get_running_loop()
        if self.stop_mode == "cancel":
            loop.call_later(STOP_LATENCY_S, run.touch, "cancelled", "run.cancelled")
        elif self.stop_mode == "complete":
            loop.call_later(STOP_LATENCY_S, self._complete, run)
        return web.json_response({"run_id": run.run_id, "status": "stopping"})

    async def __aenter__(self) -> ScriptedHermes:
        app = web.Application()
        app.router.add_post("/v1/runs", self.start)
        app.router.add_get("/v1/runs/{run_id}", self.status)
        app.router.add_get("/v1/runs/{run_id}/events", self.events)
        app.router.add_post("/v1/runs/{run_id}/approval", self.approve)
        app.router.add_post("/v1/runs/{run_id}/stop", self.stop)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
