"""Everything one fake server holds, and what a restart keeps or forgets."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from worker.testing.fake_hermes.config import FakeConfig
from worker.testing.fake_hermes.connections import Connections
from worker.testing.fake_hermes.faults import Faults
from worker.testing.fake_hermes.idempotency import IdempotencyCache
from worker.testing.fake_hermes.jobs import JobStore
from worker.testing.fake_hermes.responses_store import ResponseStore
from worker.testing.fake_hermes.run_keys import RunKeys
from worker.testing.fake_hermes.runs import RunRegistry
from worker.testing.fake_hermes.sessions import SessionStore
from worker.testing.fake_hermes.stats import Stats, now


@dataclass(slots=True)
class FakeState:
    """The stores of one server; handlers reach it through `STATE`."""

    config: FakeConfig
    faults: Faults
    stats: Stats
    sessions: SessionStore
    runs: RunRegistry
    responses: ResponseStore
    jobs: JobStore
    idempotency: IdempotencyCache
    connections: Connections = field(default_factory=Connections)
    #: `POST /v1/runs` keys (only with `config.runs_idempotency`); a restart keeps them.
    run_keys: RunKeys = field(default_factory=RunKeys)
    started_at: float = field(default_factory=now)

    @classmethod
    def new(cls, config: FakeConfig, faults: Faults | None = None) -> FakeState:
        """Fresh stores for a config."""
        sessions = SessionStore(config.llm_model)
        return cls(
            config=config,
            faults=faults if faults is not None else Faults(),
            stats=Stats(config.request_log_size),
            sessions=sessions,
            runs=RunRegistry(config, sessions),
            responses=ResponseStore(),
            jobs=JobStore(),
            idempotency=IdempotencyCache(config.idempotency_ttl_s),
        )

    def restart(self) -> None:
        """A Hermes restart: runs, open streams and the idempotency cache are gone.

        Sessions, stored responses and jobs live on disk in Hermes, so they survive; so do
        the run keys (after 0.19). With `interrupt_on_restart` the runs stay too, every
        live one ended `interrupted`.
        """
        if self.config.interrupt_on_restart:
            self.runs.interrupt_all()
        else:
            self.runs.forget_all()
        self.idempotency.clear()
        self.connections.cut_all()
        self.started_at = now()


STATE = web.AppKey("fake_hermes_state", FakeState)
