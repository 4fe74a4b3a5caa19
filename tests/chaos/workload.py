"""The workload: what clients do while the nemesis breaks things, recorded in the history.

Operations, chosen by the campaign's seeded `random.Random`:

* `read`: a `models` Action (read-only, re-executed by a new owner; Hermes answers it slowly).
* `objective`: an approved operator objective (unsafe: one `POST /v1/runs` at most), plain
  or a streamed slow reply.
* `approval_objective`: an objective whose agent asks for approval (result
  `requires_human`), then one or two approved resume Actions for it (two compete for the
  same approval generation: at most one may be applied).
* `chat`: a streamed `chat_completions` turn (unsafe, no approval needed).
* `cancel`: a cancel of a random objective still in flight.
* `duplicate`: an earlier Action published again, with its `Nats-Msg-Id` (JetStream drops
  it inside the window) or without one (stored again: a redelivery the worker must answer
  with the stored result).

Each client step is recorded (`invoke`, then `ok` / `fail` / `info`); each result the
client sees is recorded as an `observe`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from schemas.action import Action
from schemas.ids import new_action_id
from tests.chaos.checker import PlannedAction
from tests.chaos.history import History
from tests.integration.stack import Stack
from worker.testing.identities import USER_UNTENANTED
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY

KINDS = ("read", "objective", "approval_objective", "chat", "cancel", "duplicate")
WEIGHTS = (34, 28, 8, 12, 6, 12)
PUBLISH_TIMEOUT_S = 5.0
#: Every Action's own deadline: whatever the faults did, each one is settled by then, so an
#: acknowledged Action without a result after the campaign's wait is lost, not slow.
ACTION_TIMEOUT_MS = 60_000
RESULT_TIMEOUT_S = 45.0


@dataclass
class Workload:
    stack: Stack
    history: History
    rng: random.Random
    planned: dict[str, PlannedAction] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)
    published: dict[str, Action] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    operations: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, duration_s: float, *, max_ops: int = 10_000) -> None:
        """Start operations for `duration_s`, then wait (bounded) for the ones in flight."""
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        while loop.time() < end and self.operations < max_ops:
            kind = self.rng.choices(KINDS, WEIGHTS)[0]
            self.operations += 1
            task = asyncio.create_task(self._guarded(kind))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(self.rng.uniform(0.15, 0.5))
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=RESULT_TIMEOUT_S + 30)
        for task in list(self._tasks):
            task.cancel()

    async def _guarded(self, kind: str) -> None:
        try:
            await getattr(self, f"_{kind}")()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a client step failing under faults is history, not a bug
            self.history.add("info", kind, None, error=f"{type(exc).__name__}: {exc}"[:200])

    # --- operations --------------------------------------------------------------------

    async def _read(self) -> None:
        action = self.stack.action(
            "models", action_id=new_action_id(), timeout_ms=ACTION_TIMEOUT_MS
        )
        if await self._publish(action, "read"):
            await self._await_result(action)

    async def _objective(self) -> None:
        slow = self.rng.random() < 0.5
        action_id = new_action_id()
        text = f"{SLOW_REPLY if slow else 'summarize'} chaos objective {action_id}"
        action = self.stack.action(
            "operator", {"objective": text}, action_id=action_id, timeout_ms=ACTION_TIMEOUT_MS
        )
        if await self._approve(action) and await self._publish(action, "objective"):
            self.in_flight.add(action.id)
            await self._await_result(action)
            self.in_flight.discard(action.id)

    async def _approval_objective(self) -> None:
        action_id = new_action_id()
        text = f"{NEEDS_APPROVAL} chaos approval {action_id}"
        action = self.stack.action(
            "operator", {"objective": text}, action_id=action_id, timeout_ms=ACTION_TIMEOUT_MS
        )
        if not (await self._approve(action) and await self._publish(action, "approval_objective")):
            return
        result = await self._await_result(action)
        if result is None or result.status.value != "requires_human":
            return
        resumes = 2 if self.rng.random() < 0.4 else 1
        await asyncio.gather(*(self._resume(action.id) for _ in range(resumes)))

    async def _resume(self, source_id: str) -> None:
        resume = self.stack.action(
            "operator",
            {"resume": {"source_action_id": source_id, "choice": "once"}},
            action_id=new_action_id(),
            timeout_ms=ACTION_TIMEOUT_MS,
        )
        if await self._approve(resume) and await self._publish(resume, "resume", source_id):
            await self._await_result(resume)

    async def _chat(self) -> None:
        action_id = new_action_id()
        action = self.stack.action(
            "chat_completions",
            {"messages": [{"role": "user", "content": f"chaos chat {action_id}"}], "stream": True},
            action_id=action_id,
            timeout_ms=ACTION_TIMEOUT_MS,
        )
        if await self._publish(action, "chat"):
            await self._await_result(action)

    async def _cancel(self) -> None:
        if not self.in_flight:
            return
        action_id = self.rng.choice(sorted(self.in_flight))
        self.history.add("invoke", "cancel", action_id)
        try:
            reply = await asyncio.wait_for(
                self.stack.client.handle("h1", action_id).cancel(
                    requested_by=USER_UNTENANTED, reason="chaos"
                ),
                PUBLISH_TIMEOUT_S,
            )
        except Exception as exc:
            self.history.add("info", "cancel", action_id, error=type(exc).__name__)
            return
        self.history.add("ok", "cancel", action_id, accepted=reply.accepted, state=reply.state)

    async def _duplicate(self) -> None:
        if not self.published:
            return
        action = self.published[self.rng.choice(sorted(self.published))]
        dedupe = self.rng.random() < 0.5
        self.history.add("invoke", "duplicate", action.id, dedupe=dedupe)
        try:
            await asyncio.wait_for(self.stack.publish(action, dedupe=dedupe), PUBLISH_TIMEOUT_S)
        except Exception as exc:
            self.history.add("info", "duplicate", action.id, error=type(exc).__name__)
            return
        self.history.add("ok", "duplicate", action.id, dedupe=dedupe)

    # --- steps -------------------------------------------------------------------------

    async def _approve(self, action: Action) -> bool:
        self.history.add("invoke", "approve", action.id)
        try:
            await asyncio.wait_for(self.stack.approve(action), PUBLISH_TIMEOUT_S)
        except Exception as exc:
            self.history.add("fail", "approve", action.id, error=type(exc).__name__)
            return False
        self.history.add("ok", "approve", action.id)
        return True

    async def _publish(self, action: Action, kind: str, source_id: str | None = None) -> bool:
        self.planned[action.id] = PlannedAction(action.id, kind, source_id)
        self.history.add("invoke", "publish", action.id, kind=kind)
        try:
            await asyncio.wait_for(self.stack.publish(action), PUBLISH_TIMEOUT_S)
        except TimeoutError:
            # The PubAck did not come back: the Action may or may not be on the stream.
            self.history.add("info", "publish", action.id, error="timeout")
            self.published[action.id] = action
            return False
        except Exception as exc:
            self.history.add("fail", "publish", action.id, error=type(exc).__name__)
            return False
        self.acked.add(action.id)
        self.published[action.id] = action
        self.history.add("ok", "publish", action.id, kind=kind)
        return True

    async def _await_result(self, action: Action) -> Any:
        handle = self.stack.client.handle("h1", action.id)
        try:
            result = await handle.result(timeout_s=RESULT_TIMEOUT_S)
        except Exception as exc:
            self.history.add("info", "result", action.id, error=type(exc).__name__)
            return None
        self.history.add(
            "observe",
            "result",
            action.id,
            status=result.status.value,
            settled_by=result.settled_by,
            fence=result.fence,
            code=result.error.code.value if result.error else None,
            uncertain=bool(result.error and result.error.uncertain_outcome),
            last_chunk=result.last_chunk_sha256,
        )
        return result
