"""The knobs of one fake Hermes instance.

Every default copies what `hermes-agent==0.19.0` was observed to do; tests shorten the
timers (keepalive, approval timeout, the slow 404 of a consumed event stream) so they run in
milliseconds instead of the real server's seconds.

Four flags (all off: 0.19, unchanged) model what upstream Hermes added after 0.19, as its
pull requests describe it (docs/operator.md "Newer Hermes" cites them); `upstream(config)`
turns all four on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

#: What `/health` and `/health/detailed` report.
HERMES_VERSION = "0.19.0"
#: The model name the API server advertises (`/v1/models`, run status, responses).
ADVERTISED_MODEL = "hermes-agent"


@dataclass(frozen=True, slots=True)
class FakeConfig:
    """Settings of one fake server; immutable so a running server never changes under a test."""

    api_key: str
    #: Seconds of silence before an SSE stream sends `: keepalive`.
    keepalive_s: float = 30.0
    #: Seconds an `approval.request` waits before Hermes denies it on its own.
    approval_timeout_s: float = 120.0
    #: Seconds between `POST /v1/runs` and the first event (building the agent).
    build_delay_s: float = 0.05
    #: Open agent runs (runs, chat completions, responses) before a 429.
    max_concurrent_runs: int = 10
    #: Seconds a finished run stays visible to `GET /v1/runs/{id}`.
    terminal_retention_s: float = 3600.0
    #: Seconds an event buffer nobody subscribed to is kept.
    unsubscribed_stream_ttl_s: float = 300.0
    #: Seconds `GET /events` takes to answer 404 (Hermes polls 20 x 50 ms for the stream).
    missing_stream_delay_s: float = 1.0
    #: Seconds of the Idempotency-Key cache of non-streaming chat completions and responses.
    idempotency_ttl_s: float = 300.0
    #: The model the (imaginary) LLM reports; sessions record it after their first turn.
    llm_model: str = "fake-model"
    #: Seconds between `POST /stop` (status `stopping`) and `run.cancelled`.
    stop_latency_s: float = 0.06
    #: How many recent requests `/_fake/requests` keeps.
    request_log_size: int = 1000
    # --- after 0.19 (off: Hermes 0.19.0) ------------------------------------------------
    #: `POST /v1/runs` honours `Idempotency-Key` from a store a restart keeps: the same key
    #: and body answer the original run (even at the run cap), the same key with another
    #: body is 409 `idempotency_key_conflict`; `/v1/capabilities` advertises
    #: `features.runs_idempotency: true`.
    runs_idempotency: bool = False
    #: A restart marks every live run `interrupted` (error "Gateway shutdown interrupted the
    #: run.", last event `run.interrupted`) and keeps every run pollable, instead of
    #: forgetting them all.
    interrupt_on_restart: bool = False
    #: Stop or approval on a finished run is 409 `run_not_active` (0.19: a stop is 404
    #: `run_not_found`, an approval 409 `approval_not_active`).
    run_not_active: bool = False
    #: Each `approval.request` carries a `request_id`; an approval naming one answers that
    #: prompt only (an unknown id resolves nothing: 409 `approval_not_pending`).
    approval_request_ids: bool = False
    #: The choices prompts offer (None: the four of 0.19); another choice is a 400.
    approval_choices: tuple[str, ...] | None = None


#: The flags of `upstream`.
UPSTREAM_FLAGS: dict[str, bool] = {
    "runs_idempotency": True,
    "interrupt_on_restart": True,
    "run_not_active": True,
    "approval_request_ids": True,
}


def upstream(config: FakeConfig) -> FakeConfig:
    """`config` with every post-0.19 behaviour on."""
    return dataclasses.replace(config, **UPSTREAM_FLAGS)  # type: ignore[arg-type]
