"""The campaign's history: every client operation, observation and fault, timestamped.

One append-only list of `Event`s, shared by the workload and the nemesis (one event loop,
so appends need no lock). `t` is seconds since the campaign started (monotonic), `wall`
the real Unix time (the workers' skewed clocks never enter it). A client operation is an
`invoke` followed by one `ok`, `fail` (certainly had no effect) or `info` (may or may not
have had one: a publish that timed out), as in Jepsen's histories; `observe` is something
the client saw (a result, a chunk); `nemesis` events are faults starting and healing.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Event:
    t: float
    wall: float
    type: str  # invoke | ok | fail | info | observe | nemesis
    op: str
    action_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        who = f" {self.action_id}" if self.action_id else ""
        extra = " ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"{self.t:8.3f} {self.type:<8} {self.op}{who} {extra}".rstrip()


@dataclass
class History:
    started: float = field(default_factory=time.monotonic)
    events: list[Event] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def add(self, type: str, op: str, action_id: str | None = None, **detail: Any) -> Event:
        event = Event(self.now(), time.time(), type, op, action_id, detail)
        self.events.append(event)
        return event

    def about(self, action_id: str) -> list[Event]:
        return [e for e in self.events if e.action_id == action_id]

    def dump(self, path: Path) -> None:
        with path.open("w", encoding="utf-8") as out:
            for event in self.events:
                out.write(json.dumps(asdict(event), default=str) + "\n")
