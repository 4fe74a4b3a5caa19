"""A fake Hermes Agent 0.19.0 API server, faithful to the observed wire behaviour, with faults.

Use it in-process::

    async with FakeHermes(api_key="k" * 32) as fake:      # port 0: a free loopback port
        ...  # client against fake.url with "Authorization: Bearer <key>"
        fake.faults.add(StartDrop(input_contains="boom"))  # break exactly one action
        assert fake.stats().count("POST /v1/runs") == 1
        await fake.restart()                               # Hermes forgets every run

or as a process (prints exactly ``listening on http://127.0.0.1:N`` when ready)::

    python -m worker.testing.fake_hermes --port 0 --api-key-file KEYFILE [--host 127.0.0.1]

and drive it with ``FakeHermesControl(url)``.

What the agent does is chosen by the words of ``worker.testing.scenario`` in the input (plain
reply, ``TOOL_ECHO``, ``NEEDS_APPROVAL``, ``SLOW_REPLY``, ``LLM_ERROR``), the same words the
project's fake LLM reads when the real Hermes is under test. Timers (keepalive, approval
timeout, agent build delay, the slow 404 of a consumed stream, …) are ``FakeConfig`` fields.

Control routes (test-only, **unauthenticated**, never counted in the stats):

``GET /_fake/stats``
    ``{"routes": {"POST /v1/runs": 3, …}, "runs": {run_id: {route: n}},
    "session_starts": {session_id: n}}``. Routes are templates, ``/p/{profile}`` stripped;
    ``session_starts`` counts runs actually created, whatever the HTTP reply became.
``GET /_fake/requests[?route=POST%20/v1/runs]``
    ``{"requests": [{"method","path","route","headers","body","run_id","at"}, …]}``, oldest
    first (the last ``FakeConfig.request_log_size``); ``body`` is the parsed JSON or null.
``GET /_fake/faults`` / ``POST /_fake/faults`` / ``DELETE /_fake/faults``
    List, arm (one fault object or a list) or clear faults. A fault is
    ``{"kind": …, "times": 1, "input_contains": null, "run_id": null, …}``; ``times: null``
    fires until cleared. Kinds: ``start_server_error``, ``start_drop``, ``start_no_run_id``,
    ``start_reject``, ``start_hang`` (on ``POST /v1/runs``); ``events_not_found``,
    ``events_hang``, ``events_slow``, ``events_malformed``, ``events_oversize``,
    ``events_flood``, ``events_disconnect``, ``events_noise``, ``events_huge_answer`` (on
    ``GET /v1/runs/{id}/events``); ``redirect``,
    ``route_error``, ``delay`` (any route, optional ``route`` template). See ``faults.py``.
``POST /_fake/restart``
    Forget every run, cut open streams and hanging requests, drop the idempotency cache
    (sessions, stored responses and jobs survive, as on disk in Hermes).
``POST /_fake/reset``
    Clear the stats, the request log and every fault.

After 0.19 (``FakeConfig`` flags, all off by default; ``upstream(config)`` or ``--upstream``
turns them on): a durable ``Idempotency-Key`` on ``POST /v1/runs`` advertised as
``features.runs_idempotency`` (its store survives ``restart``), ``interrupted`` runs after a
restart, 409 ``run_not_active`` on a finished run, and approval ``request_id`` / ``choices``.
"""

from worker.testing.fake_hermes.config import UPSTREAM_FLAGS, FakeConfig, upstream
from worker.testing.fake_hermes.control_client import FakeHermesControl
from worker.testing.fake_hermes.faults import (
    EventsDisconnect,
    EventsFault,
    EventsFlood,
    EventsHang,
    EventsHugeAnswer,
    EventsMalformed,
    EventsNoise,
    EventsNotFound,
    EventsOversize,
    EventsSlow,
    Fault,
    Faults,
    RouteDelay,
    RouteDraining,
    RouteError,
    RouteFault,
    RouteRedirect,
    StartDrop,
    StartFault,
    StartHang,
    StartNoRunId,
    StartReject,
    StartServerError,
)
from worker.testing.fake_hermes.runs import RunStatus
from worker.testing.fake_hermes.server import FakeHermes
from worker.testing.fake_hermes.stats import RecordedRequest, StatsSnapshot

__all__ = [
    "UPSTREAM_FLAGS",
    "EventsDisconnect",
    "EventsFault",
    "EventsFlood",
    "EventsHang",
    "EventsHugeAnswer",
    "EventsMalformed",
    "EventsNoise",
    "EventsNotFound",
    "EventsOversize",
    "EventsSlow",
    "FakeConfig",
    "FakeHermes",
    "FakeHermesControl",
    "Fault",
    "Faults",
    "RecordedRequest",
    "RouteDelay",
    "RouteDraining",
    "RouteError",
    "RouteFault",
    "RouteRedirect",
    "RunStatus",
    "StartDrop",
    "StartFault",
    "StartHang",
    "StartNoRunId",
    "StartReject",
    "StartServerError",
    "StatsSnapshot",
    "upstream",
]
