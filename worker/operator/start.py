"""Fence the provider start: one claim, one `POST /v1/runs`, and an asymmetric outcome table.

`POST /v1/runs` is not idempotent in Hermes 0.19, so the connector's own fence is the only
thing between a redelivery and a second agent run (spec "Fence provider start"):

* the claim (claim id, instance id, acquisition time, expiry) is taken by compare-and-set
  on the binding before the request, and only its winner sends it;
* other invocations wait for a bound `run_id` or a terminal record;
* a claim whose owner was replaced (a higher fence on the Action's lease: it can no longer
  bind) or that expired unbound is never stolen: the outcome becomes unknown;
* 4xx -> `failed` (`operator_start_rejected`); 2xx + run_id -> bound before any event is
  read; 2xx without run_id, 5xx, transport failure -> `outcome_unknown`.

Departure (docs/architecture.md §8 "Endpoint capacity"): a 429 is not a definitive rejection. Hermes
answers it before creating anything, so the claim holder waits `Retry-After` (1 s when
absent) and sends again within the deadline, then fails `remote_temporary` with
`uncertain_outcome: false`. A request that provably never left this process (no
connection could be had) is retried the same way: only a transport failure after which
Hermes may have received the request is an unknown outcome. A run slot of the endpoint's
shared semaphore is taken before the claim, so the claim window covers only the request
itself; an endpoint that stays full until the deadline fails `connector_host.capacity`
(the host's limit, nothing started).

Departure, for a Hermes newer than 0.19 only: when the endpoint advertises durable run
idempotency (`runs_idempotency` in `GET /v1/capabilities`, worker/hermes/features.py), the
claim records an `Idempotency-Key` derived from the Action (`run_start_key`) and the sha256
of the exact body, and the start is sent with that key. A start whose answer was lost (an
earlier holder died or was replaced after sending, its claim expired, or the reply was a
5xx or lost in transport) is then re-sent byte for byte with the same key: Hermes answers
the run it already has (or starts it, when the first request never arrived), and the run is
bound and observed instead of settled `outcome_unknown`. A re-send happens only while the
endpoint *still* advertises the feature (read again just before), with the same body, no
cancel wanted and no refused redelivery; a 4xx to a re-send (a 409
`idempotency_key_conflict` included) proves nothing about the first send, so it is unknown.
Without the advertisement every step above is exactly the 0.19 path.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from schemas.audit import ReceiptEvent
from schemas.errors import ErrorCode
from schemas.operator import OperatorObjective
from worker import faults
from worker.bus.audit import handed_over, receipt
from worker.errors import ConnectorError
from worker.fingerprints import operator_fingerprint
from worker.hermes.feature_probe import read_features
from worker.operator import provider
from worker.operator.binding import BindingState, OperatorBinding, StartClaim
from worker.operator.policy import HermesOperatorPolicy
from worker.operator.session import OperatorSession
from worker.trust.projection import IDEMPOTENCY_KEY

S = BindingState
log = logging.getLogger(__name__)

#: A claim holder does not send with less than this left on its claim or deadline: a start
#: that cannot be bound in time would only manufacture an unknown outcome. It stays below
#: the smallest claim TTL the policy allows (1 s), so every valid policy can start a run.
MIN_SEND_BUDGET_S = 0.5
#: Waiters re-read the binding at most this often while another delivery holds the claim.
MAX_WAIT_POLL_S = 0.1

PAYLOAD_KIND = "aip_operator_objective"

#: Domain of the derived run-start key: bump the suffix if its inputs ever change.
RUN_KEY_DOMAIN = b"aip-hermes-worker/runs-idempotency/v1"
RUN_KEY_PREFIX = "aip-run-"
#: The `error.code` of a 409 for a key already used with another body.
KEY_CONFLICT = "idempotency_key_conflict"


def run_start_key(endpoint_id: str, action_id: str, fingerprint: str) -> str:
    """The `Idempotency-Key` of an Action's `POST /v1/runs`: the same for every worker and
    every takeover of the Action (its id and its request fingerprint, both in the binding),
    different for any other Action, and derived from nothing secret. The envelope's own
    idempotency key is not used: AIP scopes it to the capability, so two Actions may share
    it, and Hermes would answer the second with the first one's run."""
    digest = hashlib.sha256(
        b"\0".join(
            (RUN_KEY_DOMAIN, endpoint_id.encode(), action_id.encode(), fingerprint.encode())
        )
    ).hexdigest()
    return RUN_KEY_PREFIX + digest


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def provider_payload(
    session: OperatorSession, objective: OperatorObjective, session_id: str
) -> bytes:
    """The `POST /v1/runs` body: the objective as data, deployment instructions and model.

    Nothing from the Action selects the endpoint, the credential, the instructions or the
    model route (spec "Submit a direct objective").
    """
    action = session.ctx.action
    request_input: dict[str, Any] = {
        "kind": PAYLOAD_KIND,
        "operator_action_id": action.id,
        "objective": objective.objective,
        "context": objective.context,
        "candidate_capabilities": objective.candidate_capabilities,
        "constraints": objective.constraints,
    }
    return run_body(session.policy, request_input, session_id, what="operator")


def run_body(
    policy: HermesOperatorPolicy,
    request_input: dict[str, Any],
    session_id: str,
    *,
    what: str,
    extra_instructions: str = "",
) -> bytes:
    """The `POST /v1/runs` body around a provider input: refused over `max_input_bytes`,
    with the deployment's instructions (plus `extra_instructions`) and model route."""
    serialized = msgspec.json.encode(request_input)
    if len(serialized) > policy.max_input_bytes:
        raise ConnectorError(
            ErrorCode.CONFIGURATION_OR_INPUT,
            f"serialized {what} input is {len(serialized)} bytes, over the "
            f"{policy.max_input_bytes}-byte policy limit",
        )
    body: dict[str, Any] = {
        "input": serialized.decode("utf-8"),
        "session_id": session_id,
        "instructions": policy.system_instructions + extra_instructions,
    }
    if policy.model is not None:
        body["model"] = policy.model
    return msgspec.json.encode(body)


def _nothing_started(message: str, code: ErrorCode = ErrorCode.REMOTE_TEMPORARY) -> ConnectorError:
    # Nothing reached Hermes (or Hermes created nothing): certain, and not auto-retried,
    # because the binding is now terminal for this Action id.
    return ConnectorError(code, message, retryable=False, uncertain_outcome=False)


class StartFence:
    """Bring a `starting` binding to a bound run or a terminal state, sending at most once."""

    def __init__(
        self,
        session: OperatorSession,
        body: bytes,
        *,
        forbid_start: ConnectorError | None = None,
    ) -> None:
        self.s = session
        self.body = body
        #: Why a start may no longer be sent (a redelivery refused by admission, recovering
        #: an existing binding): an unclaimed binding ends failed with it, certain that
        #: nothing was sent, instead of being claimed.
        self.forbid_start = forbid_start
        self.claim_id = "clm_" + secrets.token_hex(16)
        #: True once this invocation bound the run id it started.
        self.bound = False
        #: The key and body hash a claim of this invocation records, when the endpoint
        #: advertised durable run idempotency (None: the 0.19 path, no key is sent).
        self.idempotency_key: str | None = None
        self.request_sha256: str | None = None
        ctx = session.ctx
        if ctx.hermes.features.runs_idempotency:
            fingerprint = operator_fingerprint(ctx.endpoint.id, ctx.action)
            self.idempotency_key = run_start_key(ctx.endpoint.id, ctx.action.id, fingerprint)
            self.request_sha256 = _sha256(body)
        #: True while this holder sends a start another send may already have created
        #: (a takeover, or after an unknown answer): a 4xx then proves nothing.
        self.replaying = False

    async def run(self) -> OperatorBinding:
        handle = self.s.handle
        binding = handle.binding
        while binding.status is S.STARTING:
            claim = binding.start_claim
            if claim is None:
                binding = await self._claim_or_settle()
                continue
            if claim.claim_id == self.claim_id:
                # Claimed just now, or already at creation (`create`).
                receipt(
                    ReceiptEvent.START_CLAIMED,
                    claim_id=self.claim_id,
                    expires_at_ms=claim.expires_at_ms,
                )
                try:
                    return await self._send(claim)
                finally:
                    # Sent, or never to be sent by this claim: a run observed for hours
                    # need not keep its start body (figure 4 of the bench: ~2 KiB a run).
                    self.body = b""
            if claim.fence < self.s.ctx.fence or claim.expires_at_ms <= handle.now_ms:
                if await self._may_resend(claim):
                    binding = await self._take_over(claim)
                    continue
                if claim.fence < self.s.ctx.fence:
                    return await self._unknown(
                        f"the start claim of an earlier delivery (fence {claim.fence}) was "
                        "never bound to a run id; it may have reached Hermes, so it is not "
                        "sent again"
                    )
                return await self._unknown(
                    "the start claim expired before a run id was bound; it may have reached "
                    "Hermes, so it is not sent again"
                )
            # Another invocation of this delivery holds the claim: wait for its run id.
            wait_ms = min(claim.expires_at_ms - handle.now_ms, MAX_WAIT_POLL_S * 1000)
            await self.s.pause(wait_ms / 1000)
            binding = await handle.read() or binding
        return binding

    async def _claim_or_settle(self) -> OperatorBinding:
        """Cancel before anything was sent, take a run slot and the claim, or fail cleanly."""
        s = self.s
        if self.forbid_start is not None:
            return await self._fail_unclaimed(self.forbid_start)
        if s.cancel_wanted():
            return await s.handle.update(
                lambda b, now: (
                    b.ended(S.CANCELLED, now, cancel_requested=True)
                    if b.status is S.STARTING and b.start_claim is None
                    else None
                )
            )
        if s.remaining_s() < MIN_SEND_BUDGET_S:
            return await self._fail_unclaimed(
                _nothing_started(
                    "the Action's deadline left no time to start the operator run",
                    ErrorCode.DEADLINE_EXCEEDED,
                )
            )
        if not await s.capacity.acquire(s.remaining_s() - MIN_SEND_BUDGET_S):
            # The host's own limit, not a provider answer: `connector_host.capacity`.
            return await self._fail_unclaimed(
                _nothing_started(
                    f"endpoint {s.ctx.endpoint.id} stayed at its open-run capacity until the "
                    "deadline; nothing was started",
                    ErrorCode.HOST_CAPACITY,
                )
            )
        def claim(b: OperatorBinding, now: int) -> OperatorBinding | None:
            if b.status is not S.STARTING or b.start_claim is not None:
                return None
            return b.changed(now, start_claim=self._claim(now))

        return await s.handle.update(claim)

    def _claim(self, now: int) -> StartClaim:
        ctx = self.s.ctx
        return StartClaim(
            claim_id=self.claim_id,
            instance_id=ctx.worker_id,
            owner=ctx.owner,
            fence=ctx.fence,
            acquired_at_ms=now,
            expires_at_ms=now + self.s.policy.start_claim_ttl_ms,
            idempotency_key=self.idempotency_key,
            request_sha256=self.request_sha256,
        )

    async def _may_resend(self, claim: StartClaim) -> bool:
        """Whether a start claim left unbound may be re-sent to learn its run: it was sent
        with a durable key, this body is byte-identical to the one it recorded, nothing
        forbids a start now, and the endpoint still advertises the feature (read afresh:
        a Hermes without it would start a second run)."""
        s = self.s
        if claim.idempotency_key is None or claim.request_sha256 is None or not self.body:
            return False
        if _sha256(self.body) != claim.request_sha256:
            return False
        if self.forbid_start is not None or s.cancel_wanted():
            return False
        if s.remaining_s() < MIN_SEND_BUDGET_S * 2:
            return False
        features = await read_features(s.ctx.hermes, s.remaining_s() - MIN_SEND_BUDGET_S)
        if features is None or not features.runs_idempotency:
            return False
        s.ctx.hermes.features = features
        return True

    async def _take_over(self, claim: StartClaim) -> OperatorBinding:
        """Replace the unbound claim by ours, keeping its key and body hash (fenced on the
        claim id: whoever replaced it first re-sends, the others wait for its run id)."""
        self.idempotency_key = claim.idempotency_key
        self.request_sha256 = claim.request_sha256
        self.replaying = True

        def take(b: OperatorBinding, now: int) -> OperatorBinding | None:
            if b.status is not S.STARTING or b.start_claim != claim:
                return None
            return b.changed(now, start_claim=self._claim(now))

        binding = await self.s.handle.update(take)
        if binding.start_claim is not None and binding.start_claim.claim_id == self.claim_id:
            # The run this key names may exist already: count it in the endpoint's slots.
            await self.s.capacity.keep(force=True)
            receipt(
                ReceiptEvent.START_CLAIMED,
                claim_id=self.claim_id,
                expires_at_ms=binding.start_claim.expires_at_ms,
                resend_of=claim.claim_id,
            )
        return binding

    def _start_headers(self, claim: StartClaim) -> Mapping[str, str]:
        """The trusted projection, with the derived key in place of the envelope's when the
        claim is keyed; exactly the projection otherwise (Hermes 0.19 ignores the header
        on this route)."""
        headers = self.s.headers()
        if claim.idempotency_key is None:
            return headers
        return {**headers, IDEMPOTENCY_KEY: claim.idempotency_key}

    async def create(self, make: Callable[[int], OperatorBinding]) -> OperatorBinding:
        """The Action's binding (`BindingHandle.create`), created already claimed by this
        invocation when it may send at once: one script instead of a create and a claim.

        Only on a first lease (the handle creates without reading, nothing can exist yet),
        with nothing to refuse or cancel, time left to send, and a run slot free right now;
        otherwise the binding is created unclaimed and `run` claims it as before. The slot
        is taken before the claimed binding exists, as `_claim_or_settle` takes it before
        its claim, so a crash leaves either no binding (the next delivery starts cleanly)
        or a claimed one (never sent twice: outcome unknown), exactly the states a crash
        around the separate claim left (tests/integration/test_operator_through_workers.py).
        """
        s = self.s
        handle = s.handle
        claim_now = (
            handle.creates_without_reading
            and self.forbid_start is None
            and not s.cancel_wanted()
            and s.remaining_s() >= MIN_SEND_BUDGET_S
            and await s.capacity.acquire(0.0)
        )
        if not claim_now:
            return await handle.create(make)
        faults.hit("before_create", s.ctx.action.id)
        binding = await handle.create(
            lambda now: make(now).changed(now, start_claim=self._claim(now))
        )
        if binding.terminal:
            # A finished binding existed after all: the slot (held by the Action id) was
            # released by its terminal hook and taken again just now; give it back. A live
            # one shares the slot with this execution, which claims (or waits) as usual.
            await s.capacity.release()
        return binding

    async def _fail_unclaimed(self, error: ConnectorError) -> OperatorBinding:
        return await self.s.handle.update(
            lambda b, now: (
                b.ended(S.FAILED, now, error=error)
                if b.status is S.STARTING and b.start_claim is None
                else None
            )
        )

    async def _claim_budget_s(self, claim: StartClaim, *, fresh_clock: bool) -> float:
        """Seconds this holder may spend on one attempt: what is left on the claim (Redis
        time) and on the deadline, whichever ends first."""
        now_ms = await self.s.handle.read_clock() if fresh_clock else self.s.handle.now_ms
        left_on_claim = (claim.expires_at_ms - now_ms) / 1000
        return min(left_on_claim, self.s.remaining_s())

    async def _send(self, claim: StartClaim) -> OperatorBinding:
        """The one place `POST /v1/runs` is sent, only while this claim is ours."""
        s = self.s
        attempt = 0
        while True:
            budget = await self._claim_budget_s(claim, fresh_clock=attempt > 0)
            attempt += 1
            if budget < MIN_SEND_BUDGET_S:
                return await self._end_claimed(
                    S.FAILED,
                    _nothing_started(
                        "no time was left on the start claim or the deadline to send the start",
                        ErrorCode.DEADLINE_EXCEEDED,
                    ),
                )
            faults.hit("after_claim", s.ctx.action.id)
            # The receipts that led here (`start_claimed`) reach the bus before the start
            # leaves, so a process killed once it is sent has left them behind.
            await handed_over()
            outcome = await provider.start_run(
                s.ctx.hermes, self.body, self._start_headers(claim), budget
            )
            faults.hit("after_post_run", s.ctx.action.id)
            match outcome:
                case provider.StartAccepted(run_id=run_id):
                    bound = await self._bind(run_id)
                    faults.hit("after_bind", s.ctx.action.id)
                    return bound
                case provider.StartRejected(status=status, code=code) if (
                    self.replaying or code == KEY_CONFLICT
                ):
                    # A re-send's 4xx says nothing of the first send; a key conflict says
                    # a run exists under our key (for another body): neither is a rejection.
                    return await self._unknown(
                        f"the keyed start answered HTTP {status}"
                        f"{f' ({code})' if code else ''}; an earlier send may have started "
                        "the run",
                        remote_status=status,
                    )
                case provider.StartRejected(status=status):
                    return await self._end_claimed(
                        S.FAILED,
                        ConnectorError(
                            ErrorCode.OPERATOR_START_REJECTED,
                            f"POST /v1/runs answered HTTP {status}: the run was rejected "
                            "before acceptance",
                            remote_status=status,
                        ),
                    )
                case provider.StartUnknown(reason=reason, remote_status=status):
                    if claim.idempotency_key is None or s.cancel_wanted():
                        return await self._unknown(reason, remote_status=status)
                    # Keyed: the same request again names the same run; the claim (and its
                    # key) stays recorded, so a takeover can still learn it if we die.
                    self.replaying = True
                    if s.remaining_s() < provider.NOT_SENT_RETRY_S + MIN_SEND_BUDGET_S:
                        return await self._unknown(reason, remote_status=status)
                    renewed = await self._renew(provider.NOT_SENT_RETRY_S)
                    if renewed is None:
                        return s.handle.binding
                    claim = renewed
                    await s.pause(provider.NOT_SENT_RETRY_S)
                case provider.StartRateLimited(retry_after_s=wait_s, why=why):
                    if wait_s + MIN_SEND_BUDGET_S > s.remaining_s():
                        return await self._end_claimed(
                            S.FAILED,
                            _nothing_started(
                                f"POST /v1/runs {why} until the deadline; nothing was started",
                            ),
                        )
                    renewed = await self._renew(wait_s)
                    if renewed is None:
                        return s.handle.binding
                    claim = renewed
                    await s.pause(wait_s)
                    if s.cancel_wanted():
                        return await self._end_claimed(S.CANCELLED, None)

    async def _renew(self, wait_s: float) -> StartClaim | None:
        """Extend our claim over the Retry-After wait and one more attempt (fenced: a
        replaced holder sends nothing). None when the claim is no longer ours."""
        extra_ms = int(wait_s * 1000) + self.s.policy.start_claim_ttl_ms

        def extend(b: OperatorBinding, now: int) -> OperatorBinding | None:
            if b.start_claim is None or b.start_claim.claim_id != self.claim_id:
                return None
            renewed = msgspec.structs.replace(b.start_claim, expires_at_ms=now + extra_ms)
            return b.changed(now, start_claim=renewed)

        binding = await self.s.handle.update(extend)
        mine = binding.start_claim
        if mine is None or mine.claim_id != self.claim_id or binding.status is not S.STARTING:
            return None
        return mine

    async def _bind(self, run_id: str) -> OperatorBinding:
        """Persist the run id before reading a single event."""
        cancel = self.s.cancel_wanted()

        def bind(b: OperatorBinding, now: int) -> OperatorBinding | None:
            if b.start_claim is None or b.start_claim.claim_id != self.claim_id:
                return None
            state = S.CANCELLING if (cancel or b.cancel_requested) else S.RUNNING
            return b.moved(state, now, run_id=run_id, start_claim=None)

        binding = await self.s.handle.update(bind)
        self.bound = binding.run_id == run_id
        receipt(ReceiptEvent.RUN_BOUND, run_id=run_id, bound=self.bound)
        if not self.bound:
            # Our claim was declared unknown while the request was in flight: the record
            # stays as it is (terminal is write-once), so the run id survives only here.
            log.warning(
                "operator %s: Hermes accepted run %s after its start claim was declared "
                "unknown; the binding keeps outcome %s",
                self.s.ctx.action.id,
                run_id,
                binding.status,
            )
        return binding

    async def _end_claimed(
        self, state: BindingState, error: ConnectorError | None
    ) -> OperatorBinding:
        return await self.s.handle.update(
            lambda b, now: (
                b.ended(state, now, error=error)
                if b.start_claim is not None and b.start_claim.claim_id == self.claim_id
                else None
            )
        )

    async def _unknown(self, reason: str, *, remote_status: int | None = None) -> OperatorBinding:
        error = ConnectorError(
            ErrorCode.OPERATOR_OUTCOME_UNKNOWN, reason, remote_status=remote_status
        )
        return await self.s.handle.update(
            lambda b, now: (
                b.ended(S.OUTCOME_UNKNOWN, now, error=error) if b.status is S.STARTING else None
            )
        )
