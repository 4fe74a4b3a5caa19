"""`/api/jobs…`: the cron jobs API with its flat `{"error": "…"}` envelope.

Quirks kept: create answers 200; bad JSON and a bad schedule are 500s; an id that is not 12
hex characters is a 400 before anything is looked up.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from worker.testing.fake_hermes.envelopes import jobs_error, json_reply
from worker.testing.fake_hermes.jobs import JOB_ID, JobError, JobStore
from worker.testing.fake_hermes.state import STATE

Handler = Callable[[web.Request], Awaitable[web.Response]]


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw or b"")
    except ValueError as exc:
        raise JobError(500, str(exc)) from None
    if not isinstance(body, dict):
        raise JobError(400, "Request body must be a JSON object")
    return body


def _guarded(action: Callable[[web.Request, JobStore], Awaitable[Any]]) -> Handler:
    """Wrap an action: id format check first, `JobError` → flat error envelope."""

    async def handler(request: web.Request) -> web.Response:
        job_id = request.match_info.get("job_id")
        if job_id is not None and not JOB_ID.match(job_id):
            return jobs_error("Invalid job ID format", status=400)
        try:
            return json_reply(await action(request, request.app[STATE].jobs))
        except JobError as exc:
            return jobs_error(exc.message, status=exc.status)

    return handler


async def _list(request: web.Request, jobs: JobStore) -> Any:
    include = request.query.get("include_disabled", "").lower() in ("true", "1")
    return {"jobs": jobs.list(include)}


async def _create(request: web.Request, jobs: JobStore) -> Any:
    body = await _json_body(request)
    peer = request.remote or "127.0.0.1"
    return {"job": jobs.create(body, peer, request.app[STATE].config.llm_model)}


async def _get(request: web.Request, jobs: JobStore) -> Any:
    return {"job": jobs.get(request.match_info["job_id"])}


async def _patch(request: web.Request, jobs: JobStore) -> Any:
    job_id = request.match_info["job_id"]
    jobs.get(job_id)
    return {"job": jobs.update(job_id, await _json_body(request))}


async def _delete(request: web.Request, jobs: JobStore) -> Any:
    jobs.delete(request.match_info["job_id"])
    return {"ok": True}


async def _pause(request: web.Request, jobs: JobStore) -> Any:
    return {"job": jobs.pause(request.match_info["job_id"])}


async def _resume(request: web.Request, jobs: JobStore) -> Any:
    return {"job": jobs.resume(request.match_info["job_id"])}


async def _run(request: web.Request, jobs: JobStore) -> Any:
    return {"job": jobs.trigger(request.match_info["job_id"])}


list_jobs = _guarded(_list)
create_job = _guarded(_create)
get_job = _guarded(_get)
patch_job = _guarded(_patch)
delete_job = _guarded(_delete)
pause_job = _guarded(_pause)
resume_job = _guarded(_resume)
run_job = _guarded(_run)
