"""What arrived at the fake, so a test can assert on the traffic a client produced.

Counts are keyed by route template (`"POST /v1/runs"`, `"GET /v1/runs/{run_id}/events"`), so
"exactly one start was sent" is one dictionary lookup; the recent-request log keeps headers
and parsed bodies for asserting what a client sent (projection headers, Idempotency-Key).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.hermes.http_client import PROBE_HEADER


def is_probe(headers: Mapping[str, str]) -> bool:
    """A worker's key probe (`PROBE_HEADER`), whatever the header's case."""
    return any(name.lower() == PROBE_HEADER.lower() for name in headers)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the fake saw it."""

    method: str
    path: str
    route: str
    headers: dict[str, str]
    body: Any
    run_id: str | None
    at: float

    def to_json(self) -> dict[str, Any]:
        """The `/_fake/requests` row."""
        return {
            "method": self.method,
            "path": self.path,
            "route": self.route,
            "headers": self.headers,
            "body": self.body,
            "run_id": self.run_id,
            "at": self.at,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> RecordedRequest:
        """Rebuild a row fetched over `/_fake/requests`."""
        return cls(
            method=row["method"],
            path=row["path"],
            route=row["route"],
            headers=dict(row["headers"]),
            body=row["body"],
            run_id=row["run_id"],
            at=float(row["at"]),
        )


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Counts at one moment: per route template, per run id, and run starts per session."""

    routes: dict[str, int]
    runs: dict[str, dict[str, int]]
    session_starts: dict[str, int]
    #: Key probes per route template, apart from `routes` (see `Stats.record`).
    probes: dict[str, int] = field(default_factory=dict)

    def count(self, route: str) -> int:
        """Requests seen for a route template such as `"POST /v1/runs"` (0 when none)."""
        return self.routes.get(route, 0)

    def to_json(self) -> dict[str, Any]:
        """The `/_fake/stats` body."""
        return {
            "routes": self.routes,
            "runs": self.runs,
            "session_starts": self.session_starts,
            "probes": self.probes,
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> StatsSnapshot:
        """Rebuild a snapshot fetched over `/_fake/stats`."""
        return cls(
            routes={str(k): int(v) for k, v in body["routes"].items()},
            runs={str(r): {str(k): int(v) for k, v in c.items()} for r, c in body["runs"].items()},
            session_starts={str(k): int(v) for k, v in body["session_starts"].items()},
            probes={str(k): int(v) for k, v in body.get("probes", {}).items()},
        )


@dataclass(slots=True)
class Stats:
    """The live counters; one per server, cleared by `/_fake/reset`."""

    log_size: int
    _routes: Counter[str] = field(default_factory=Counter)
    _runs: dict[str, Counter[str]] = field(default_factory=dict)
    _session_starts: Counter[str] = field(default_factory=Counter)
    _probes: Counter[str] = field(default_factory=Counter)
    _log: deque[RecordedRequest] = field(init=False)

    def __post_init__(self) -> None:
        self._log = deque(maxlen=self.log_size)

    def record(self, request: RecordedRequest) -> None:
        """Count one request under its route template (and its run id, if the path has one).

        A worker's key probe (`PROBE_HEADER`, `worker/serving.py`) is counted apart
        (`StatsSnapshot.probes`): a test counting the requests an Action made, or asserting
        that nothing was sent, must not count the probes every worker sends at start and on
        a schedule.
        """
        if is_probe(request.headers):
            self._probes[request.route] += 1
            return
        self._routes[request.route] += 1
        if request.run_id is not None:
            self._runs.setdefault(request.run_id, Counter())[request.route] += 1
        self._log.append(request)

    def record_start(self, session_id: str) -> None:
        """Count a run actually created for a session (whatever the HTTP reply became)."""
        self._session_starts[session_id] += 1

    def snapshot(self) -> StatsSnapshot:
        """Copy the counters so later traffic cannot change what a test already read."""
        return StatsSnapshot(
            routes=dict(self._routes),
            runs={run: dict(c) for run, c in self._runs.items()},
            session_starts=dict(self._session_starts),
            probes=dict(self._probes),
        )

    def requests(self) -> list[RecordedRequest]:
        """The recent requests, oldest first."""
        return list(self._log)

    def clear(self) -> None:
        """Forget every count and logged request."""
        self._routes.clear()
        self._runs.clear()
        self._session_starts.clear()
        self._probes.clear()
        self._log.clear()


def now() -> float:
    """Wall-clock seconds, as Hermes stamps its objects."""
    return time.time()
