"""Resume a provider approval through the source binding's command ledger.

Spec "Resume a provider approval": each resume command is recorded in the source binding
(resume Action id, canonical fingerprint, approval generation, decision, claim owner,
timestamps) *before* Hermes is contacted, so

* an exact replay of a resume sends nothing and returns the stored progress;
* a resume Action id reused with changed input is refused;
* a command is bound to the generation it answered: a replay can never approve a later
  prompt, and one generation takes one decision;
* a 4xx is `rejected` (nothing applied); a 5xx or transport failure leaves both the command
  and the source binding `outcome_unknown` (Hermes may have applied it): never resent.

A Hermes newer than 0.19 names each prompt (`request_id`) and the decisions it accepts
(`choices`) in `approval.request`: the command records the id and sends it with the
decision, so it can only answer the prompt it was claimed for; a choice the prompt did not
offer is refused before anything is recorded or sent (`approval_choice_not_offered`), and a
409 `run_not_active` (the run finished first) is `operator_run_not_active`. Without them
(0.19, or a prompt seen only by polling) the decision goes to the oldest prompt, as before.

After a decision is applied the resume keeps observing the run by polling (the source's
single-use event stream is gone) until a terminal state or the next approval.

A redelivery that admission refused (its deadline passed, say) after an earlier delivery
recorded this resume's command is recovered, not refused (`Operation.began`,
`forbid_claim`): the command is settled as it stands, a claim whose holder is gone as
`approval_outcome_unknown`, since its approval may have reached Hermes. It never claims or
sends anything.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from schemas.audit import ReceiptEvent
from schemas.errors import ErrorCode
from schemas.operator import OperatorResume
from worker import faults
from worker.bus.audit import receipt
from worker.errors import ConnectorError
from worker.fingerprints import operator_fingerprint
from worker.operator import provider
from worker.operator.binding import (
    MAX_APPROVAL_COMMANDS,
    ApprovalCommand,
    BindingState,
    CommandState,
    OperatorBinding,
    ProviderSnapshot,
)
from worker.operator.events import ProviderStatus
from worker.operator.observe import OBSERVE, Observer
from worker.operator.session import OperatorSession

S = BindingState
C = CommandState

#: Bound on one approval request or its status read.
MAX_COMMAND_REQUEST_S = 10.0
MAX_WAIT_POLL_S = 0.1


def policy_error(message: str) -> ConnectorError:
    return ConnectorError(ErrorCode.OPERATOR_POLICY, message)


@dataclass(frozen=True, slots=True)
class ResumeEnd:
    """How a resume ended: the source binding, and this command's own failure if any."""

    binding: OperatorBinding
    error: ConnectorError | None = None
    #: This resume was cancelled before its decision was sent (the source is untouched).
    cancelled: bool = False


class ResumeLedger:
    """One resume Action against its source binding."""

    def __init__(
        self,
        session: OperatorSession,
        resume: OperatorResume,
        *,
        forbid_claim: ConnectorError | None = None,
    ) -> None:
        self.s = session
        self.resume = resume
        #: Why no decision may be claimed or sent (a redelivery admission refused, recovering
        #: the command an earlier delivery recorded, `Recovering`): the recorded command is
        #: settled as it stands (applied, rejected, or unknown once its claim holder is
        #: gone), and without one the refusal itself is the answer.
        self.forbid_claim = forbid_claim
        ctx = session.ctx
        self.resume_id = ctx.action.id
        self.fingerprint = operator_fingerprint(ctx.endpoint.id, ctx.action)
        self.claim_id = "clm_" + secrets.token_hex(16)

    async def run(self) -> ResumeEnd:
        handle = self.s.handle
        binding = await handle.read()
        if binding is None:
            raise policy_error("no operator binding exists for the resume's source Action")
        if binding.endpoint_id != self.s.ctx.endpoint.id:
            raise policy_error("the resume endpoint does not match the source binding's endpoint")
        while True:
            command = binding.command_for(self.resume_id)
            if command is None:
                if self.forbid_claim is not None:
                    raise self.forbid_claim  # nothing of this resume was recorded or sent
                if binding.terminal:
                    return ResumeEnd(binding)  # nothing left to decide: the source outcome
                if self.s.ctx.cancel_requested.is_set():
                    return ResumeEnd(binding, cancelled=True)
                binding = await self._claim(binding)
                mine = binding.command_for(self.resume_id)
                if mine is not None and mine.claim_id == self.claim_id:
                    return await self._apply(mine)
                continue
            if command.fingerprint != self.fingerprint:
                raise policy_error(
                    "idempotency collision: this resume Action id was recorded with a "
                    "different input"
                )
            match command.state:
                case C.APPLIED:
                    return await self._observe(command.baseline)
                case C.REJECTED:
                    return ResumeEnd(binding, _rejected(command.remote_status))
                case C.OUTCOME_UNKNOWN:
                    return ResumeEnd(binding, _approval_unknown("an earlier attempt"))
                case C.CLAIMED:
                    if command.fence < self.s.ctx.fence or command.expires_at_ms <= handle.now_ms:
                        return await self._abandoned(command)
                    await self.s.pause(
                        min(MAX_WAIT_POLL_S, (command.expires_at_ms - handle.now_ms) / 1000)
                    )
                    binding = await handle.read() or binding

    async def _claim(self, binding: OperatorBinding) -> OperatorBinding:
        """Record `claimed` for the current generation, or refuse with a policy error."""
        if binding.status is not S.WAITING_FOR_APPROVAL:
            raise policy_error(
                f"the source binding is {binding.status.value}, not waiting for approval"
            )
        if binding.cancel_requested:
            raise policy_error("the source binding is being cancelled; no new approval is sent")
        offered = offered_choices(binding.pending_approval)
        if offered is not None and self.resume.choice.value not in offered:
            raise ConnectorError(
                ErrorCode.APPROVAL_CHOICE_NOT_OFFERED,
                f"choice {self.resume.choice.value!r} is not one the pending prompt offers "
                f"({', '.join(offered)}); nothing was sent",
            )
        request_id = prompt_request_id(binding.pending_approval)
        generation = binding.approval_generation
        taken = _answering(binding, generation)
        if taken:
            raise policy_error(
                f"approval generation {generation} was already answered by resume Action "
                f"{taken[0].resume_action_id}"
            )
        if len(binding.approval_commands) >= MAX_APPROVAL_COMMANDS:
            raise policy_error(
                f"the source run's approval ledger holds its maximum of {MAX_APPROVAL_COMMANDS}"
            )
        ctx = self.s.ctx
        ttl = self.s.policy.start_claim_ttl_ms

        def claim(b: OperatorBinding, now: int) -> OperatorBinding | None:
            # Checked again inside the compare-and-set: another resume that read the same
            # binding may have claimed this generation since (the loop in `run` then
            # refuses this one with the policy error above).
            if (
                b.command_for(self.resume_id) is not None
                or b.status is not S.WAITING_FOR_APPROVAL
                or b.approval_generation != generation
                or _answering(b, generation)
            ):
                return None
            return b.with_command(
                ApprovalCommand(
                    resume_action_id=self.resume_id,
                    fingerprint=self.fingerprint,
                    generation=generation,
                    choice=self.resume.choice.value,
                    resolve_all=self.resume.resolve_all,
                    state=C.CLAIMED,
                    claim_id=self.claim_id,
                    owner=ctx.owner,
                    fence=ctx.fence,
                    instance_id=ctx.worker_id,
                    claimed_at_ms=now,
                    expires_at_ms=now + ttl,
                    updated_at_ms=now,
                    request_id=request_id,
                ),
                now,
            )

        return await self.s.handle.update(claim)

    def _request_budget_s(self) -> float:
        return max(0.1, min(MAX_COMMAND_REQUEST_S, self.s.remaining_s()))

    async def _baseline(self, run_id: str) -> ProviderSnapshot:
        """The prompt as Hermes shows it right before the decision (stale-prompt detection).

        When the status cannot be read, the prompt is described by its event name only.
        """
        read = await provider.read_status(
            self.s.ctx.hermes, run_id, self.s.headers(), self._request_budget_s()
        )
        if isinstance(read, provider.StatusRead):
            last_event = read.body.get("last_event")
            updated_at = read.body.get("updated_at")
            return ProviderSnapshot(
                status=str(read.body.get("status")),
                last_event=last_event if isinstance(last_event, str) else None,
                updated_at=float(updated_at) if isinstance(updated_at, int | float) else None,
            )
        return ProviderSnapshot(
            status=ProviderStatus.WAITING_FOR_APPROVAL.value, last_event="approval.request"
        )

    async def _apply(self, command: ApprovalCommand) -> ResumeEnd:
        binding = self.s.handle.binding
        run_id = binding.run_id
        if run_id is None:
            raise ConnectorError(ErrorCode.ERROR, "a waiting binding without a run id")
        baseline = await self._baseline(run_id)
        outcome = await provider.send_approval(
            self.s.ctx.hermes,
            run_id,
            command.choice,
            command.resolve_all,
            self.s.headers(),
            self._request_budget_s(),
            request_id=command.request_id,
        )
        faults.hit("after_post_approval", self.resume_id)
        receipt(
            ReceiptEvent.APPROVAL_COMMAND,
            run_id=run_id,
            generation=command.generation,
            choice=str(command.choice),
            outcome=type(outcome).__name__,
        )
        match outcome:
            case provider.CommandApplied():

                def applied(b: OperatorBinding, now: int) -> OperatorBinding:
                    ledger = b.with_command(command.moved(C.APPLIED, now, baseline=baseline), now)
                    if ledger.status is S.WAITING_FOR_APPROVAL:
                        return ledger.moved(
                            S.RUNNING, now, pending_approval=None, pending_command_sealed=None
                        )
                    return ledger

                await self.s.handle.update(applied)
                await self.s.capacity.keep(force=True)
                return await self._observe(baseline)
            case provider.CommandRejected(status=status, code=code):
                return await self._rejected(command, status, baseline, code)
            case provider.CommandUnknown(reason=reason, remote_status=status):
                error = _approval_unknown(reason, status)
                binding = await self.s.handle.update(
                    lambda b, now: b.with_command(
                        command.moved(C.OUTCOME_UNKNOWN, now, remote_status=status), now
                    ).ended(S.OUTCOME_UNKNOWN, now, error=error)
                )
                return ResumeEnd(binding, error)

    async def _rejected(
        self,
        command: ApprovalCommand,
        status: int,
        baseline: ProviderSnapshot,
        code: str | None = None,
    ) -> ResumeEnd:
        """Hermes refused the decision before applying it; the source keeps waiting unless
        the refusal shows the run itself is gone or over."""
        binding = await self.s.handle.update(
            lambda b, now: b.with_command(
                command.moved(C.REJECTED, now, remote_status=status, baseline=baseline), now
            )
        )
        error = _rejected(status, code)
        if status in (404, 409):
            # 404: Hermes forgot the run; 409: it may have ended (an unanswered prompt times
            # out as a deny). Read it once so the source binding does not wait forever.
            binding = await Observer(self.s).read_once()
        return ResumeEnd(binding, error)

    async def _abandoned(self, command: ApprovalCommand) -> ResumeEnd:
        error = _approval_unknown(
            "the claim owner was replaced or its claim expired before it recorded Hermes' answer"
        )

        def give_up(b: OperatorBinding, now: int) -> OperatorBinding | None:
            current = b.command_for(self.resume_id)
            if current is None or current.state is not C.CLAIMED:
                return None
            return b.with_command(current.moved(C.OUTCOME_UNKNOWN, now), now).ended(
                S.OUTCOME_UNKNOWN, now, error=error
            )

        return ResumeEnd(await self.s.handle.update(give_up), error)

    async def _observe(self, answered: ProviderSnapshot | None) -> ResumeEnd:
        """Follow the run after an applied decision, by polling, until it is terminal or
        asks again; a terminal or waiting binding is returned as stored."""
        binding = self.s.handle.binding
        if binding.terminal or binding.status is S.WAITING_FOR_APPROVAL:
            return ResumeEnd(binding)
        observer = Observer(self.s, answered_prompt=answered)
        return ResumeEnd(await observer.poll(self.s.deadline, OBSERVE), None)


def _rejected(status: int | None, provider_code: str | None = None) -> ConnectorError:
    if provider_code == provider.RUN_NOT_ACTIVE:
        return ConnectorError(
            ErrorCode.OPERATOR_RUN_NOT_ACTIVE,
            f"POST /v1/runs/{{run_id}}/approval answered HTTP {status} run_not_active: the run "
            "had already finished, the decision was not applied",
            remote_status=status,
        )
    code = ErrorCode.AUTHENTICATION if status in (401, 403) else ErrorCode.REMOTE_REJECTED
    return ConnectorError(
        code,
        f"POST /v1/runs/{{run_id}}/approval answered HTTP {status}: the decision was not applied",
        remote_status=status,
    )


#: Bounds on what a prompt may name: an id is an opaque token, the choices a short list.
MAX_REQUEST_ID_CHARS = 256
MAX_CHOICES = 16


def offered_choices(pending: dict[str, Any] | None) -> tuple[str, ...] | None:
    """The decisions the pending prompt offers, or None when it does not say (0.19 always
    offers the four; a prompt seen only by polling carries none): then nothing is refused
    here and Hermes itself answers an unknown choice 400."""
    raw = None if pending is None else pending.get("choices")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_CHOICES:
        return None
    if not all(isinstance(c, str) for c in raw):
        return None
    return tuple(c.strip().lower() for c in raw)


def prompt_request_id(pending: dict[str, Any] | None) -> str | None:
    """The pending prompt's `request_id` (Hermes after 0.19), when it is a sane token."""
    raw = None if pending is None else pending.get("request_id")
    if isinstance(raw, str) and 0 < len(raw) <= MAX_REQUEST_ID_CHARS and raw.isprintable():
        return raw
    return None


def _approval_unknown(reason: str, status: int | None = None) -> ConnectorError:
    return ConnectorError(
        ErrorCode.APPROVAL_OUTCOME_UNKNOWN,
        f"the approval decision may have been applied ({reason}); it is never resent",
        remote_status=status,
    )


def _answering(binding: OperatorBinding, generation: int) -> list[ApprovalCommand]:
    """The commands that answer (or may have answered) `generation`: one decision each."""
    return [
        c
        for c in binding.approval_commands
        if c.generation == generation and c.state is not C.REJECTED
    ]
