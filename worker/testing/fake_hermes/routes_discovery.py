"""Health and discovery routes: `/health`, `/health/detailed`, models, capabilities, skills,
toolsets."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime

from aiohttp import web

from worker.testing.fake_hermes import catalog
from worker.testing.fake_hermes.config import ADVERTISED_MODEL, HERMES_VERSION
from worker.testing.fake_hermes.envelopes import json_reply
from worker.testing.fake_hermes.state import STATE


async def health(request: web.Request) -> web.Response:
    """GET /health and /v1/health (no auth)."""
    return json_reply({"status": "ok", "platform": "hermes-agent", "version": HERMES_VERSION})


async def health_detailed(request: web.Request) -> web.Response:
    """GET /health/detailed: readiness checks and the live run count."""
    state = request.app[STATE]
    disk = shutil.disk_usage(os.getcwd())
    stamp = datetime.fromtimestamp(state.started_at, UTC).isoformat()
    active = state.runs.active_runs
    ok = {"status": "ok"}
    return json_reply(
        {
            "status": "ok",
            "readiness": {
                "status": "ok",
                "checks": {
                    "state_db": ok,
                    "config": ok,
                    "model": ok,
                    "disk": {
                        "status": "ok",
                        "used_percent": round(100 * disk.used / disk.total, 1),
                        "free_bytes": disk.free,
                    },
                    "gateway": {
                        "status": "ok",
                        "state": "running",
                        "connected_platforms": 1,
                        "platforms": 1,
                    },
                    "background_queues": {
                        "status": "ok",
                        "active_api_runs": active,
                        "process_completions": 0,
                        "active_delegations": 0,
                    },
                },
            },
            "platform": "hermes-agent",
            "version": HERMES_VERSION,
            "gateway_state": "running",
            "platforms": {
                "api_server": {
                    "state": "connected",
                    "error_code": None,
                    "error_message": None,
                    "updated_at": stamp,
                }
            },
            "active_agents": active,
            "gateway_busy": active > 0,
            "gateway_drainable": True,
            "exit_reason": None,
            "updated_at": datetime.now(UTC).isoformat(),
            "pid": os.getpid(),
        }
    )


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one advertised model."""
    state = request.app[STATE]
    return json_reply(
        {
            "object": "list",
            "data": [
                {
                    "id": ADVERTISED_MODEL,
                    "object": "model",
                    "created": int(state.started_at),
                    "owned_by": "hermes",
                    "permission": [],
                    "root": ADVERTISED_MODEL,
                    "parent": None,
                }
            ],
        }
    )


async def capabilities(request: web.Request) -> web.Response:
    """GET /v1/capabilities."""
    config = request.app[STATE].config
    return json_reply(catalog.capabilities(runs_idempotency=config.runs_idempotency))


async def skills(request: web.Request) -> web.Response:
    """GET /v1/skills: a fresh Hermes home has none."""
    return json_reply({"object": "list", "data": []})


async def toolsets(request: web.Request) -> web.Response:
    """GET /v1/toolsets."""
    return json_reply(catalog.toolsets())
