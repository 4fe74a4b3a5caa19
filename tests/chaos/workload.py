"""The workload: what clients do while the nemesis breaks things, recorded in the history.

Operations, chosen by the campaign's seeded `random.Random`:

* `read`: a `models` Action (read-only, re-executed by a new owner; Hermes answers it slowly).
* `objective`: an approved operator objective (unsafe: one `POST /v1/runs` at most), plain
  or a streamed slow reply.
* `approval_objective`: an objective whose agent asks for approval (result
  `requires_human`), then one or two approved resume Actions for it (two compete for the
  same approval generation: at most one may be applied).
* `chat`: a `chat_stream` turn (unsafe, no approval needed).
* `approval_objective` is sometimes answered by one forged resume instead: its approval
  record is signed by a key the approval authority does not name, or carries no signature
  (`forged_resume`); no genuine resume answers that prompt, so any approval Hermes sees
  for its run took effect unsigned (checker rule `signed_only`).
* `cancel`: a cancel of a random objective still in flight.
* `forged_cancel`: a cancel of another objective in flight, signed by an untrusted key or
  not signed at all; no genuine cancel names that objective.
* `delegate`: a read delegated through the AIP gateway (MCP `aip_call`, as the Hermes of
  h1 calls it), sync or async, sometimes called twice with the same contract (a client
  retry): one child Action, whatever the calls and the faults (checker rule `delegation`).
* `duplicate`: an earlier Action published again, with its `Nats-Msg-Id` (JetStream drops
  it inside the window) or without one (stored again: a redelivery the worker must answer
  with the stored result).

The real-Hermes campaign runs the same operations with `REAL_MIX`: fewer of them (a longer
gap between starts) and a larger share of operator objectives and approvals, since what the
real Hermes adds over the fake is its own run, approval and stop semantics; reads and
delegations (reads too) exercise only `GET /v1/models` there.

Each client step is recorded (`invoke`, then `ok` / `fail` / `info`); each result the
client sees is recorded as an `observe`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis

from schemas.action import Action
from schemas.ids import new_action_id
from tests.chaos.checker import PlannedAction
from tests.chaos.deployment import DELEGATOR
from tests.chaos.history import History
from tests.integration.stack import ENDPOINT, Stack
from worker.client import AipClient
from worker.fingerprints import approval_fingerprint
from worker.gateway.service import namespaced_action_id
from worker.store.approvals import ApprovalRecords
from worker.testing.gateway import call_tool
from worker.testing.identities import USER_UNTENANTED
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY
from worker.trust.signing import generate_keypair, public_key_of, sign_detached, write_seed_file

KINDS = (
    "read",
    "objective",
    "approval_objective",
    "chat",
    "cancel",
    "forged_cancel",
    "delegate",
    "duplicate",
)
WEIGHTS = (30, 28, 8, 12, 6, 4, 6, 12)


@dataclass(frozen=True, slots=True)
class Mix:
    """How often each operation comes (`KINDS` order) and the gap between two starts."""

    weights: tuple[int, ...] = WEIGHTS
    gap_s: tuple[float, float] = (0.15, 0.5)


FAKE_MIX = Mix()
REAL_MIX = Mix(weights=(16, 26, 14, 12, 6, 4, 6, 10), gap_s=(0.6, 1.6))
#: The capability every delegation calls (a read: the child is cheap and re-executable).
DELEGATED_CAPABILITY = f"cap:hermes_agent:{ENDPOINT}:models"
#: Bound on one `aip_call` (a sync call waits for the child's result, up to its timeout).
CALL_TIMEOUT_S = 40.0
#: How often a prompt for approval is answered by one forged resume instead of genuine ones.
FORGED_RESUME_P = 0.3
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
    #: The gateway's MCP URL and the delegating principal's token ("": no delegations).
    gateway_url: str = ""
    gateway_token: str = ""
    mix: Mix = FAKE_MIX
    planned: dict[str, PlannedAction] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)
    published: dict[str, Action] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    #: Targets of genuine cancels, and of forged ones (the two are kept apart).
    cancelled: set[str] = field(default_factory=set)
    forged_cancels: set[str] = field(default_factory=set)
    operations: int = 0
    #: A seed no trust file names: what forgeries are signed with.
    _untrusted_seed: bytes = field(default_factory=lambda: generate_keypair().seed)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, duration_s: float, *, max_ops: int = 10_000) -> None:
        """Start operations for `duration_s`, then wait (bounded) for the ones in flight."""
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        while loop.time() < end and self.operations < max_ops:
            kind = self.rng.choices(KINDS, self.mix.weights)[0]
            self.operations += 1
            task = asyncio.create_task(self._guarded(kind))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(self.rng.uniform(*self.mix.gap_s))
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
        if self.rng.random() < FORGED_RESUME_P:
            await self._forged_resume(action.id, signed=self.rng.random() < 0.5)
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

    async def _forged_resume(self, source_id: str, *, signed: bool) -> None:
        """A resume whose approval record copies the source's genuine one (same approver,
        live, this request's fingerprint) but is signed by an untrusted key, or not at all."""
        resume = self.stack.action(
            "operator",
            {"resume": {"source_action_id": source_id, "choice": "once"}},
            action_id=new_action_id(),
            timeout_ms=ACTION_TIMEOUT_MS,
        )
        how = "untrusted key" if signed else "unsigned"
        self.history.add("invoke", "forge_approval", resume.id, how=how)
        try:
            await asyncio.wait_for(self._forge_approval(source_id, resume, signed), 5)
        except Exception as exc:
            self.history.add("fail", "forge_approval", resume.id, error=type(exc).__name__)
            return
        self.history.add("ok", "forge_approval", resume.id, how=how)
        if await self._publish(resume, "forged_resume", source_id):
            await self._await_result(resume)

    async def _forge_approval(self, source_id: str, resume: Action, signed: bool) -> None:
        client = Redis.from_url(self.stack.redis_url)
        try:
            templates = await ApprovalRecords(client).read(source_id)
            if not templates:
                raise LookupError(f"no approval record of {source_id} to copy")
            record = msgspec.structs.replace(
                templates[0],
                decision_id="apr_" + new_action_id()[4:],
                action_id=resume.id,
                input_fingerprint=approval_fingerprint(resume),
                revision=1,
            )
            raw = msgspec.json.encode(record)
            seed = self._untrusted_seed
            signature, signer = (
                (sign_detached(raw, seed), public_key_of(seed)) if signed else ("", "")
            )
            await ApprovalRecords(client).write(
                record, raw, signature, signer, read_revision=0, required=1
            )
        finally:
            await client.aclose()

    async def _chat(self) -> None:
        action_id = new_action_id()
        action = self.stack.action(
            "chat_stream",
            {"messages": [{"role": "user", "content": f"chaos chat {action_id}"}]},
            action_id=action_id,
            timeout_ms=ACTION_TIMEOUT_MS,
        )
        if await self._publish(action, "chat"):
            await self._await_result(action)

    async def _cancel(self) -> None:
        targets = sorted(self.in_flight - self.forged_cancels)
        if not targets:
            return
        action_id = self.rng.choice(targets)
        self.cancelled.add(action_id)
        self.history.add("invoke", "cancel", action_id)
        try:
            reply = await asyncio.wait_for(
                # Answered at once (wait 0): the Action's result if it has ended, else a
                # retryable error saying whether the intent is recorded.
                self.stack.client.handle("h1", action_id).cancel(
                    requested_by=USER_UNTENANTED, reason="chaos", wait_s=0
                ),
                PUBLISH_TIMEOUT_S,
            )
        except Exception as exc:
            self.history.add("info", "cancel", action_id, error=type(exc).__name__)
            return
        self.history.add(
            "ok",
            "cancel",
            action_id,
            accepted=reply.accepted,
            state=reply.state,
            code=reply.error.code.value if reply.error else None,
        )

    async def _forged_cancel(self) -> None:
        targets = sorted(self.in_flight - self.cancelled)
        if not targets:
            return
        action_id = self.rng.choice(targets)
        signed = self.rng.random() < 0.5
        self.forged_cancels.add(action_id)
        how = "untrusted key" if signed else "unsigned"
        self.history.add("invoke", "forged_cancel", action_id, how=how)
        key: Path | None = None
        if signed:
            key = self.stack.root / "untrusted.seed"
            if not key.exists():
                write_seed_file(key, self._untrusted_seed)
        # A forged Cancel Envelope: unsigned, or signed by a key no worker trusts, naming
        # the Action's own principal as its requester (`from`).
        forger = AipClient(self.stack.nc, sign_key=key)
        try:
            reply = await asyncio.wait_for(
                forger.cancel(
                    ENDPOINT, action_id, requested_by=USER_UNTENANTED, reason="forged", wait_s=0
                ),
                PUBLISH_TIMEOUT_S,
            )
        except Exception as exc:
            self.history.add("info", "forged_cancel", action_id, error=type(exc).__name__)
            return
        self.history.add(
            "ok",
            "forged_cancel",
            action_id,
            accepted=reply.accepted,
            state=reply.state,
            code=reply.error.code.value if reply.error else None,
        )

    async def _delegate(self) -> None:
        if not self.gateway_url:
            return
        supplied = new_action_id()
        child = namespaced_action_id(DELEGATOR, None, supplied)
        mode = self.rng.choice(["sync", "async"])
        contract = {
            "action_id": supplied,
            "capability_id": DELEGATED_CAPABILITY,
            "input": {},
            "mode": mode,
            "timeout_ms": ACTION_TIMEOUT_MS,
            "idempotency_key": "idem-" + supplied[4:24],
        }
        self.planned[child] = PlannedAction(
            child, "delegation", operation=DELEGATED_CAPABILITY.rsplit(":", 1)[-1]
        )
        for _ in range(2 if self.rng.random() < 0.3 else 1):
            self.history.add("invoke", "delegate", child, mode=mode)
            try:
                answer = await asyncio.wait_for(
                    call_tool(self.gateway_url, self.gateway_token, "aip_call", contract),
                    CALL_TIMEOUT_S,
                )
            except Exception as exc:  # the call may or may not have reached the gateway
                self.history.add("info", "delegate", child, error=type(exc).__name__)
                continue
            document = answer.document
            if answer.is_error:
                error = document.get("error")
                code = error.get("code") if isinstance(error, dict) else error
                self.history.add("info", "delegate", child, error=str(code or document)[:200])
                continue
            # The gateway answered for a child: it is on the bus (acknowledged).
            self.acked.add(child)
            self.history.add(
                "ok",
                "delegate",
                child,
                # The answer names the caller's id; the child on the bus is its namespaced id.
                child=child if answer.aip.get("action_id", supplied) == supplied else None,
                state=answer.aip.get("status") or (document.get("ack") or {}).get("status"),
                duplicate=answer.aip.get("duplicate", False),
            )

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
        self.planned[action.id] = PlannedAction(
            action.id, kind, source_id, operation=action.capability.rsplit(":", 1)[-1]
        )
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
