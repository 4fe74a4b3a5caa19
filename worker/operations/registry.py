"""The table of every operation a worker serves, built once at startup.

One operation per route of the pinned Hermes 0.19.0 API server (the operator capability is
registered by the runtime next to these). The read retry policy and the stream bounds come
from the settings so every operation applies the same ones.
"""

from __future__ import annotations

from worker.hermes.sse import SSELimits
from worker.operations.base import Registry
from worker.operations.discovery import discovery_operations
from worker.operations.jobs import job_operations
from worker.operations.retry import ReadRetryPolicy
from worker.operations.runs import run_operations
from worker.operations.sessions import session_operations
from worker.operations.turns import turn_operations
from worker.settings import Settings


def default_registry(
    settings: Settings | None = None, *, limits: SSELimits | None = None
) -> Registry:
    """Every Hermes route as an operation.

    `settings` supplies the read retry budget (`hermes_read_retry_attempts`) and the bounds
    on bytes and time without an event; `limits`, when given, all SSE bounds (default 1 MiB
    frames, 4096 events).
    """
    retry = ReadRetryPolicy(retries=2 if settings is None else settings.hermes_read_retry_attempts)
    bounds = limits or (
        SSELimits()
        if settings is None
        else SSELimits(
            max_idle_bytes=settings.hermes_stream_max_idle_bytes,
            max_idle_s=settings.hermes_stream_max_idle_ms / 1000,
        )
    )
    registry = Registry()
    for operation in (
        *discovery_operations(retry),
        *turn_operations(retry, bounds),
        *session_operations(retry, bounds),
        *run_operations(retry, bounds),
        *job_operations(retry),
    ):
        registry.add(operation)
    return registry
