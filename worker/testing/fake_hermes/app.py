"""The aiohttp application: Hermes 0.19.0's route table, mirrored under `/p/{profile}`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from worker.testing.fake_hermes import (
    routes_chat,
    routes_discovery,
    routes_jobs,
    routes_responses,
    routes_runs,
    routes_sessions,
)
from worker.testing.fake_hermes.control import add_control_routes
from worker.testing.fake_hermes.middleware import MAX_REQUEST_BYTES, hermes_middleware
from worker.testing.fake_hermes.state import STATE, FakeState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SWEEP_INTERVAL_S = 1.0

ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/health", routes_discovery.health),
    ("GET", "/v1/health", routes_discovery.health),
    ("GET", "/health/detailed", routes_discovery.health_detailed),
    ("GET", "/v1/models", routes_discovery.models),
    ("GET", "/v1/capabilities", routes_discovery.capabilities),
    ("GET", "/v1/skills", routes_discovery.skills),
    ("GET", "/v1/toolsets", routes_discovery.toolsets),
    ("GET", "/api/sessions", routes_sessions.list_sessions),
    ("POST", "/api/sessions", routes_sessions.create_session),
    ("GET", "/api/sessions/{session_id}", routes_sessions.get_session),
    ("PATCH", "/api/sessions/{session_id}", routes_sessions.patch_session),
    ("DELETE", "/api/sessions/{session_id}", routes_sessions.delete_session),
    ("GET", "/api/sessions/{session_id}/messages", routes_sessions.session_messages),
    ("POST", "/api/sessions/{session_id}/fork", routes_sessions.fork_session),
    ("POST", "/api/sessions/{session_id}/chat", routes_sessions.session_chat),
    ("POST", "/api/sessions/{session_id}/chat/stream", routes_sessions.session_chat_stream),
    ("POST", "/v1/chat/completions", routes_chat.chat_completions),
    ("POST", "/v1/responses", routes_responses.create_response),
    ("GET", "/v1/responses/{response_id}", routes_responses.get_response),
    ("DELETE", "/v1/responses/{response_id}", routes_responses.delete_response),
    ("GET", "/api/jobs", routes_jobs.list_jobs),
    ("POST", "/api/jobs", routes_jobs.create_job),
    ("GET", "/api/jobs/{job_id}", routes_jobs.get_job),
    ("PATCH", "/api/jobs/{job_id}", routes_jobs.patch_job),
    ("DELETE", "/api/jobs/{job_id}", routes_jobs.delete_job),
    ("POST", "/api/jobs/{job_id}/pause", routes_jobs.pause_job),
    ("POST", "/api/jobs/{job_id}/resume", routes_jobs.resume_job),
    ("POST", "/api/jobs/{job_id}/run", routes_jobs.run_job),
    ("POST", "/v1/runs", routes_runs.create_run),
    ("GET", "/v1/runs/{run_id}", routes_runs.get_run),
    ("GET", "/v1/runs/{run_id}/events", routes_runs.run_events),
    ("POST", "/v1/runs/{run_id}/approval", routes_runs.approve_run),
    ("POST", "/v1/runs/{run_id}/stop", routes_runs.stop_run),
)


async def _janitor(state: FakeState) -> None:
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        state.runs.sweep()


def build_app(state: FakeState) -> web.Application:
    """An application serving `state`; the stores outlive it only if the caller keeps them."""
    app = web.Application(middlewares=[hermes_middleware], client_max_size=MAX_REQUEST_BYTES + 1)
    app[STATE] = state
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
        app.router.add_route(method, "/p/{profile}" + path, handler)
    add_control_routes(app)

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        janitor = asyncio.create_task(_janitor(state), name="fake-hermes janitor")
        yield
        janitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await janitor
        # Release hanging requests and stop agent tasks so shutdown never waits on them.
        state.runs.forget_all()
        state.connections.cut_all()

    app.cleanup_ctx.append(lifecycle)
    return app
