"""The scripted story: what a publisher and an operator see, each step with its expected end.

Every step publishes signed Actions through the same `AipClient` a real publisher uses,
follows their chunk subjects live (a streaming capability's; any other one has none, as in
AIP), waits for the one ActionResult, which says the Action ended, and compares it with the
state the step expects. A step never raises: whatever goes wrong becomes its row in the
summary ("operator not available", "no result in 30 s", …), so the story always finishes
and the exit code says whether every step reached its state.

The operator requires AIP approval, so before publishing an operator Action the demo acts
as the approval authority: it records a decision with the trust layer's `approve`, as the
demo approver principal of the trust files, exactly as `aip-hermes-worker approve` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from schemas.action import Action, DelegationRef, Identity, Mode
from schemas.approval import ApprovalDecision
from schemas.chunk import ChunkKind, StreamChunk
from schemas.delegation import DELEGATE_PREFIX, ChildAction, DelegationRequest
from schemas.escalation import EscalationResolution
from schemas.ids import new_action_id
from schemas.result import ActionResult, ResultStatus
from worker.client import ActionHandle, AipClient, ChunkRetraction
from worker.demo.console import Console, StepReport
from worker.demo.environment import DELEGATED_PREFIX, ENDPOINT, DemoEnvironment, DemoError
from worker.store.keys import ActionKeys
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
)
from worker.testing.scenario import NEEDS_APPROVAL, SLOW_REPLY
from worker.trust.approval_ledger import approve
from worker.trust.authority import ApprovalAuthority
from worker.wire.manifests import operation_of

OPERATOR_UNAVAILABLE = "operator not available"
DELEGATED_EXPECTED = "completed, child verified"


@dataclass(frozen=True, slots=True)
class Pace:
    """How long the story waits; `--short` keeps the results' bounds and drops the pauses."""

    pause_s: float
    result_s: float
    takeover_result_s: float

    @classmethod
    def of(cls, *, short: bool) -> Pace:
        if short:
            return cls(pause_s=0.0, result_s=30.0, takeover_result_s=40.0)
        return cls(pause_s=1.0, result_s=60.0, takeover_result_s=60.0)


@dataclass
class Followed:
    """An Action being followed: its chunks as they arrive, then its result."""

    handle: ActionHandle
    chunks: list[StreamChunk] = field(default_factory=list)
    first_output: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def kinds(self) -> set[str]:
        return {str(chunk.__struct_config__.tag) for chunk in self.chunks}


class StepFailed(DemoError):
    """A step could not go on; the message becomes its "got" column."""


class Story:
    def __init__(
        self,
        env: DemoEnvironment,
        client: AipClient,
        redis: Any,
        authority: ApprovalAuthority,
        console: Console,
        pace: Pace,
    ) -> None:
        self.env = env
        self.client = client
        self.redis = redis
        self.authority = authority
        self.console = console
        self.pace = pace
        self.operator_available = False
        #: The Action step d1 left waiting for a human; step d2 resumes it.
        self.paused_action_id: str | None = None
        #: Step a's Action, whose result step h finds in the Hermes session.
        self.read_only_action_id: str | None = None

    async def run(self) -> list[StepReport]:
        manifest = await self.client.manifest(ENDPOINT)
        operations = {operation_of(entry) for entry in manifest.get("capabilities", [])}
        self.operator_available = "operator" in operations
        self.console.note(
            f"{ENDPOINT} serves {len(operations)} capabilities"
            + ("" if self.operator_available else f"; {OPERATOR_UNAVAILABLE} in this build")
        )
        steps: list[tuple[str, str, str, bool, Callable[[], Awaitable[str]]]] = [
            ("a", "read-only call: models", "completed", False, self.read_only),
            ("b", "streamed chat: chat_stream", "completed, streamed", False, self.chat),
            ("c", "operator objective streams deltas", "completed, streamed",
             True, self.operator_objective),
            ("d1", "operator pauses for approval", "requires_human", True, self.pause),
            ("d2", "escalation resolved with one command: once", "completed",
             True, self.resume),
            ("e", "operator run cancelled", "cancelled", True, self.cancelled),
            ("f", "worker killed mid-run", "completed by the other worker",
             True, self.takeover),
        ]  # fmt: skip
        steps.append(
            ("h", "step a's result delivered into a Hermes session", "delivered once",
             False, self.delivered)
        )  # fmt: skip
        if self.env.gateway_url is not None:
            steps.append(
                ("g", "delegation: Hermes calls aip_call once", DELEGATED_EXPECTED,
                 True, self.delegation)
            )  # fmt: skip
        else:
            self.console.note("step g (delegation) needs the demo's own AIP MCP server: skipped")
        reports = []
        for key, title, expected, needs_operator, body in steps:
            self.console.step(key, title)
            started = time.monotonic()
            if needs_operator and not self.operator_available:
                got, reached = OPERATOR_UNAVAILABLE, False
                self.console.note("skipped: the workers do not register cap:…:operator")
            else:
                got, reached = await self._attempt(body, expected)
            report = StepReport(key, title, expected, got, reached, time.monotonic() - started)
            self.console.outcome(report)
            reports.append(report)
            if self.pace.pause_s:
                await asyncio.sleep(self.pace.pause_s)
        return reports

    async def _attempt(self, body: Callable[[], Awaitable[str]], expected: str) -> tuple[str, bool]:
        try:
            got = await body()
        except StepFailed as exc:
            return str(exc), False
        except Exception as exc:
            return f"error: {type(exc).__name__}: {exc}"[:120], False
        return got, got == expected

    # --- the steps -----------------------------------------------------------------------

    async def read_only(self) -> str:
        followed = await self.publish(self.action("models", {}))
        result = await self.result_of(followed, self.pace.result_s)
        self.read_only_action_id = result.action_id
        return result.status.value

    async def chat(self) -> str:
        action = self.action(
            "chat_stream",
            {"messages": [{"role": "user", "content": "Say hello to the demo"}]},
            mode=Mode.STREAM,
        )
        followed = await self.publish(action)
        result = await self.result_of(followed, self.pace.result_s)
        return self.streamed(result, followed)

    async def operator_objective(self) -> str:
        followed = await self.publish_approved(
            self.objective("Summarize why fenced leases matter, in one sentence")
        )
        result = await self.result_of(followed, self.pace.result_s)
        return self.streamed(result, followed)

    async def pause(self) -> str:
        followed = await self.publish_approved(
            self.objective(f"Tidy the scratch file ({NEEDS_APPROVAL})")
        )
        result = await self.result_of(followed, self.pace.result_s)
        if result.status is not ResultStatus.REQUIRES_HUMAN:
            return result.status.value
        if "pending_approval" not in followed.kinds():
            return "requires_human without a pending_approval chunk"
        self.paused_action_id = result.action_id
        return result.status.value

    async def resume(self) -> str:
        """What an operator does: `aip-hermes-worker escalations resolve ESC --choice once`."""
        from schemas.escalation import EscalationKind
        from schemas.operator import ApprovalChoice
        from worker.commands.escalation_admin import resolve_approval
        from worker.escalation.ledger import Unreadable, read_escalations
        from worker.settings import Settings

        source = self.paused_action_id
        if source is None:
            raise StepFailed("nothing to resume: step d1 did not pause")
        views = await read_escalations(
            self.client.nc.jetstream(),
            self.client.subjects,
            ENDPOINT,
            Unreadable(),
            trusted=self.client.trusted_worker_keys,
        )
        found = [v.escalation for v in views if v.escalation.action_id == source]
        if len(found) != 1 or found[0].kind is not EscalationKind.APPROVAL:
            raise StepFailed(f"{len(found)} approval escalations for {source}, not one")
        escalation = found[0]
        self.console.note(
            f"aip-hermes-worker escalations resolve {escalation.escalation_id} --choice once "
            f"--as {APPROVER_UNTENANTED} --key … --sign-key …"
        )
        assert self.env.nats is not None
        assert self.env.redis is not None
        assert self.env.trust is not None
        settings = Settings(
            nats_url=self.env.nats.url,
            redis_url=self.env.redis.url,
            approval_authority_file=self.env.trust.authority_file,
        )
        resolution = await resolve_approval(
            settings,
            escalation,
            choice=ApprovalChoice.ONCE,
            resolve_all=False,
            as_principal=APPROVER_UNTENANTED,
            reason="the demo approves this one command",
            sign_key=self.env.trust.seed_file,
            approver_seed=self.env.trust.approver_seed(APPROVER_UNTENANTED),
        )
        assert isinstance(resolution, EscalationResolution)  # the demo's quorum is one
        assert resolution.resume_action_id is not None
        self.console.published(resolution.resume_action_id, "operator")
        followed = self.follow(resolution.resume_action_id)
        result = await self.result_of(followed, self.pace.result_s)
        return result.status.value

    async def delivered(self) -> str:
        """Step a's `models` result, sent once into the demo's Hermes session by the channel
        egress rule, and read back from the session's own messages."""
        import httpx

        from worker.channel.egress import delivery_id
        from worker.demo.environment import DESK_SESSION

        source = self.read_only_action_id
        if source is None:
            raise StepFailed("step a did not settle a result to deliver")
        delivered_id = delivery_id("demo-desk", source)
        self.console.note(f"delivery Action {delivered_id} -> session {DESK_SESSION}")
        result = await self.result_of(self.follow(delivered_id), self.pace.result_s)
        if result.status is not ResultStatus.COMPLETED:
            return result.status.value
        assert self.env.hermes is not None
        key = self.env.hermes.key_file.read_text(encoding="utf-8").strip()
        async with httpx.AsyncClient(
            base_url=self.env.hermes.url, headers={"Authorization": f"Bearer {key}"}
        ) as http:
            answer = await http.get(f"/api/sessions/{DESK_SESSION}/messages")
        users = [
            m for m in answer.json().get("data", [])
            if m.get("role") == "user" and source in str(m.get("content"))
        ]
        self.console.note(f"the session holds {len(users)} user message(s) naming {source}")
        return "delivered once" if len(users) == 1 else f"{len(users)} deliveries"

    async def cancelled(self) -> str:
        followed = await self.publish_approved(
            self.objective(f"Write a long answer slowly ({SLOW_REPLY})")
        )
        await self.wait_output(followed)
        reply = await self.client.cancel(
            ENDPOINT, followed.handle.action_id, reason="the demo changed its mind",
            requested_by=USER_UNTENANTED,
        )
        self.console.note(f"cancel requested: accepted={reply.accepted} state={reply.state}")
        result = await self.result_of(followed, self.pace.result_s)
        return result.status.value

    async def takeover(self) -> str:
        followed = await self.publish_approved(
            self.objective(f"Write another long answer slowly ({SLOW_REPLY})")
        )
        await self.wait_output(followed)
        lease = ActionKeys.of(followed.handle.action_id).lease
        owner = await self.redis.hget(lease, "owner")
        owner = owner.decode() if isinstance(owner, bytes) else str(owner or "")
        victim = self.env.worker(owner.partition("#")[0])
        if victim is None or not victim.alive:
            raise StepFailed(f"lease owner {owner!r} is not a running demo worker")
        self.console.note(f"kill -9 {victim.worker_id} (pid {victim.pid}): it owns the lease")
        await asyncio.to_thread(victim.kill)
        self.console.note("the other worker takes over when the lease expires")
        result = await self.result_of(followed, self.pace.takeover_result_s)
        if result.status is not ResultStatus.COMPLETED:
            return result.status.value
        if result.settled_by == victim.worker_id:
            return f"completed by the killed worker {victim.worker_id}"
        return "completed by the other worker"

    async def delegation(self) -> str:
        """A DelegationRequest: the fake Hermes calls `aip_call` on the AIP gateway, which
        records the child and dispatches it to the echo capability; the worker verifies it."""
        echo = self.env.echo
        if self.env.gateway_url is None or echo is None:
            raise StepFailed("no AIP gateway in this demo")
        request = self.delegation_request()
        record = await approve(
            self.redis, self.authority, request.action, APPROVER_UNTENANTED,
            "delegated child approved by the demo's approval authority",
            ApprovalDecision.APPROVED, seed=self.approver_seed(),
        )  # fmt: skip
        self.console.note(
            f"child {request.action.id} ({request.action.capability}) approved: "
            f"{record.decision_id}"
        )
        handle = await self.client.delegate(request)
        self.console.published(handle.action_id, "delegation")
        followed = Followed(handle)
        followed.task = asyncio.get_running_loop().create_task(self._follow(followed))
        result = await self.result_of(followed, self.pace.result_s)
        if result.status is not ResultStatus.COMPLETED:
            return result.status.value
        child = ((result.output or {}).get("delegation_result") or {}).get("result") or {}
        runs = [c for c in echo.executed if c.id == request.action.id]
        if child.get("action_id") != request.action.id or len(runs) != 1:
            return f"completed, but the child ran {len(runs)} time(s)"
        self.console.note(f"verified native child result: {child.get('output')}")
        return DELEGATED_EXPECTED

    def delegation_request(self) -> DelegationRequest:
        delegate = DELEGATE_PREFIX + ENDPOINT
        delegation_id = "dlg-demo-" + secrets.token_hex(6)
        now = time.time_ns() // 1_000_000
        child = ChildAction(
            id=new_action_id(),
            capability=DELEGATED_PREFIX + "case.get",
            input={"case_id": "case-2030"},
            identity=Identity(principal_id=delegate, principal_kind="agent"),
            created_at_unix_ms=now,
            idempotency_key="demo-" + secrets.token_hex(6),
            delegation=DelegationRef(
                delegation_id=delegation_id,
                parent_action_id=new_action_id(),
                chain=[USER_UNTENANTED],
            ),
        )
        return DelegationRequest(
            delegation_id=delegation_id,
            delegator=Identity(
                principal_id=USER_UNTENANTED,
                principal_kind=PRINCIPAL_KIND,
                authentication_issuer=ISSUER,
                credential_revision=REVISION,
            ),
            delegate=delegate,
            action=child,
            chain=[USER_UNTENANTED],
            scopes=["support.read"],
            created_at_unix_ms=now,
            deadline_unix_ms=now + int(self.pace.result_s * 1000),
        )

    # --- helpers -------------------------------------------------------------------------

    def action(self, operation: str, input: dict[str, Any], *, mode: Mode = Mode.ASYNC) -> Action:
        return self.client.build_action(
            endpoint_id=ENDPOINT,
            operation=operation,
            input=input,
            principal_id=USER_UNTENANTED,
            principal_kind=PRINCIPAL_KIND,
            authentication_issuer=ISSUER,
            credential_revision=REVISION,
            mode=mode,
            timeout_ms=int(self.pace.takeover_result_s * 1000),
        )

    def objective(self, text: str) -> Action:
        return self.action("operator", {"objective": text}, mode=Mode.STREAM)

    def approver_seed(self) -> bytes:
        """The demo approver's signing seed (from the demo's trust files)."""
        if self.env.trust is None:
            raise StepFailed("the demo's trust files are not written")
        return self.env.trust.approver_seed(APPROVER_UNTENANTED)

    async def publish_approved(self, action: Action) -> Followed:
        """Record the demo approver's decision on exactly this Action, then publish it."""
        record = await approve(
            self.redis, self.authority, action, APPROVER_UNTENANTED,
            "approved by the demo's approval authority", ApprovalDecision.APPROVED,
            seed=self.approver_seed(),
        )
        self.console.note(f"approval {record.decision_id} recorded by {APPROVER_UNTENANTED}")
        return await self.publish(action)

    async def publish(self, action: Action) -> Followed:
        handle = await self.client.publish(action)
        self.console.published(action.id, action.capability.rsplit(":", 1)[-1])
        followed = Followed(handle)
        followed.task = asyncio.get_running_loop().create_task(self._follow(followed))
        return followed

    def follow(self, action_id: str) -> Followed:
        """Follow an Action someone else published (a resume, a channel delivery)."""
        followed = Followed(self.client.handle(ENDPOINT, action_id))
        followed.task = asyncio.get_running_loop().create_task(self._follow(followed))
        return followed

    async def _follow(self, followed: Followed) -> None:
        async for chunk in followed.handle.chunks():
            if isinstance(chunk, ChunkRetraction):  # shown, but not the Action's: forget them
                followed.chunks = [c for c in followed.chunks if c.seq < chunk.from_seq]
                self.console.line(
                    f"      #{chunk.from_seq}..#{chunk.to_seq} retracted: not the Action's chain"
                )
                continue
            followed.chunks.append(chunk)
            self.console.chunk(chunk)
            if chunk.__struct_config__.tag in (ChunkKind.DATA, ChunkKind.TOOL, ChunkKind.PROGRESS):
                followed.first_output.set()

    async def wait_output(self, followed: Followed) -> None:
        """Until the run produced output: it is running on a worker now."""
        try:
            await asyncio.wait_for(followed.first_output.wait(), self.pace.result_s)
        except TimeoutError:
            raise StepFailed(f"no output within {self.pace.result_s:.0f} s") from None

    async def result_of(self, followed: Followed, timeout_s: float) -> ActionResult:
        try:
            result = await followed.handle.result(timeout_s=timeout_s)
        except Exception:  # nats raises its own TimeoutError type
            raise StepFailed(f"no result within {timeout_s:.0f} s") from None
        if followed.task is not None:
            # The terminal chunk is published before the result: let the follower print it.
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(followed.task), 1.0)
            followed.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await followed.task
        if result.last_chunk_sha256 is None and not followed.chunks:
            # As in AIP, only a streaming capability publishes chunks.
            self.console.note("no chunks: this capability does not stream, its result is all")
        self.console.status(result)
        return result

    @staticmethod
    def streamed(result: ActionResult, followed: Followed) -> str:
        if result.status is not ResultStatus.COMPLETED:
            return result.status.value
        deltas = sum(1 for c in followed.chunks if c.__struct_config__.tag == ChunkKind.DATA)
        return "completed, streamed" if deltas >= 2 else f"completed with {deltas} data chunk(s)"
