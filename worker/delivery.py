"""One delivery, start to finish (docs/architecture.md §4): decode, trust, lease, execute,
settle, ack.

The order is the guarantee. Nothing reaches Hermes before the envelope is decoded, trusted
and leased; nothing is published as a result before the fenced settle wrote it; nothing is
acked before the result is durable on JetStream. JetStream acks are cleanup, never
authority: a worker that lost its lease stops without writing, publishing or acking, and
the fence in Redis rejects anything it might still try.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import redis.exceptions
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from schemas.action import Action
from schemas.audit import ReceiptEvent
from schemas.chunk import ChunkKind, StreamChunk, make_chunk
from schemas.codec import convert_input, decode_action, encode
from schemas.errors import EnvelopeRejected, ErrorCode, ProtocolError
from schemas.escalation import Escalation
from schemas.ids import is_action_id, split_capability
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import Subjects
from worker import faults
from worker.admission import Admission
from worker.audit import AuditLog, ReceiptScope, enter_scope
from worker.channel.egress import deliveries_for
from worker.channel.rules import EgressTable
from worker.dead_letters import DeadLetters, Kept
from worker.endpoints import Endpoint
from worker.errors import (
    ConnectorError,
    PublishFailed,
    StoreNotAccepting,
    StoreUnavailable,
    deadline_exceeded,
    unexpected_failure,
)
from worker.escalation.build import escalation_for
from worker.execution import Execution, now_ms
from worker.fingerprints import idempotency_fingerprint
from worker.hermes.http_client import HermesClient
from worker.leases import LeaseKeeper
from worker.logs import RepeatedErrors
from worker.metrics import DeliveryOutcome, FenceStep, Metrics
from worker.operations.base import (
    RECOVERY_BUDGET_MS,
    LeaseLost,
    Operation,
    OperationSpec,
    Outcome,
    Recovering,
    Registry,
)
from worker.publisher import MSG_ID, BusPublisher
from worker.settings import Settings
from worker.store.keys import ActionKeys
from worker.store.lease_store import AcquireStatus, ActionSubject, SettleStatus
from worker.stores import Stores
from worker.trust.responses import cannot_sign, sha256_hex

log = logging.getLogger(__name__)

_result_decoder = msgspec.json.Decoder(ActionResult)


@dataclass(frozen=True, slots=True)
class EndpointRuntime:
    endpoint: Endpoint
    hermes: HermesClient


@dataclass(slots=True)
class Runtime:
    """What every delivery shares; built once by the worker app."""

    settings: Settings
    subjects: Subjects
    js: JetStreamContext
    stores: Stores
    publisher: BusPublisher
    dead_letters: DeadLetters
    audit: AuditLog
    keeper: LeaseKeeper
    registry: Registry
    endpoints: dict[str, EndpointRuntime]
    admission: Admission
    worker_id: str
    metrics: Metrics
    shutting_down: bool = False
    #: Repeated delivery failures are logged once per cause per interval.
    errors: RepeatedErrors = field(default_factory=RepeatedErrors)
    #: Channel egress rules (AIPD_CHANNEL_EGRESS_FILE); None sends nothing to sessions.
    channel: EgressTable | None = None




def subject_of(action: Action) -> ActionSubject:
    """What a lease records for cancel authorization: the Action's principal (verified by
    admission before any lease that executes), tenant and capability."""
    return ActionSubject(
        principal_id=action.identity.principal_id,
        tenant_id=action.identity.tenant_id,
        capability=action.capability,
    )


class Refusal(Exception):
    """A trusted envelope that may not run: settled once as a failed result (`refuse`)."""

    def __init__(self, error: ConnectorError, *, read_only: bool) -> None:
        self.error = error
        self.read_only = read_only


#: Failures of what a delivery depends on (NATS, Redis, the network): the same envelope can
#: succeed once the dependency is back, so such a delivery is nak'd and comes back.
_DEPENDENCY_FAILURES: tuple[type[BaseException], ...] = (
    StoreUnavailable,
    OSError,
    TimeoutError,
    PublishFailed,
    redis.exceptions.RedisError,
    nats.errors.Error,
    nats.js.errors.Error,
)


def _is_dependency_failure(exc: BaseException) -> bool:
    if isinstance(exc, ConnectorError):
        return exc.to_protocol(endpoint_id=None, read_only=False).retryable
    return isinstance(exc, _DEPENDENCY_FAILURES)


class DeliveryHandler:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: Deliveries (by `id(msg)`) that reached a lease acquire. Past that point a failure
        #: is repaired by redelivery and takeover; before it, nothing was written for them.
        self._leasing: set[int] = set()

    async def handle(self, msg: Msg, endpoint_id: str) -> None:
        await self.guarded(self._handle, msg, endpoint_id)

    async def guarded(
        self, work: Callable[[Msg, str], Awaitable[None]], msg: Msg, endpoint_id: str
    ) -> None:
        """Never raises: bad input or a failing dependency must not stop the consumer loop
        (Actions and delegations alike).

        A failing dependency naks the message, which comes back after the nak delay. Any
        other failure before the lease was caused by this envelope and would recur on every
        redelivery to every worker (a poison message, nak'd forever): it is dead-lettered
        once with `connector_host.execution` instead.
        """
        try:
            await work(msg, endpoint_id)
        except StoreUnavailable as exc:
            # The store is failing or full: a known dependency failure, so no traceback and
            # no DLQ. Before a lease it is certain (nothing was leased); the nak lets a worker
            # whose store answers take the message.
            cause = "not accepting" if isinstance(exc, StoreNotAccepting) else "unavailable"
            self.rt.errors.report(
                "delivery.store", cause, log,
                "redis %s on %s (%s); redelivering later", cause, endpoint_id, exc,
                extra={"endpoint": endpoint_id},
            )
            self.rt.metrics.delivery(endpoint_id, DeliveryOutcome.DEFERRED)
            await _quiet(msg.nak(delay=self.rt.settings.nak_delay_ms / 1000))
        except Exception as exc:
            self.rt.metrics.delivery(endpoint_id, DeliveryOutcome.ERROR)
            if id(msg) not in self._leasing and not _is_dependency_failure(exc):
                self.rt.errors.report(
                    "delivery.before_lease", type(exc).__name__, log,
                    "delivery failed before its lease on %s; dead-lettering it", endpoint_id,
                    level=logging.ERROR, exc_info=True, extra={"endpoint": endpoint_id},
                )
                try:
                    await self.dead_letter(
                        msg,
                        endpoint_id,
                        ErrorCode.HOST_EXECUTION,
                        f"failed before the lease: {type(exc).__name__}",
                    )
                    return
                except Exception:
                    log.warning("could not dead-letter the delivery; redelivering it later")
            else:
                # Logged once per exception class per interval: a failing dependency fails
                # every delivery alike (37 MB of tracebacks per worker in 100 s, before).
                self.rt.errors.report(
                    "delivery", type(exc).__name__, log,
                    "delivery failed unexpectedly on %s; redelivering later", endpoint_id,
                    level=logging.ERROR, exc_info=True, extra={"endpoint": endpoint_id},
                )
            await _quiet(msg.nak(delay=self.rt.settings.nak_delay_ms / 1000))
        finally:
            self._leasing.discard(id(msg))

    def leasing(self, msg: Msg) -> None:
        """Mark `msg` as past the point where a failure may be dead-lettered (see `guarded`)."""
        self._leasing.add(id(msg))

    async def _handle(self, msg: Msg, endpoint_id: str) -> None:
        rt = self.rt
        payload = msg.data
        headers = dict(msg.headers or {})
        try:
            action = decode_action(payload, max_bytes=rt.settings.max_envelope_bytes)
        except EnvelopeRejected as exc:
            await self.dead_letter(msg, endpoint_id, exc.code, exc.reason)
            return
        faults.hit("after_decode", action.id)
        try:
            signer = rt.admission.verify_signature(payload, headers)
        except ConnectorError as exc:
            await self.dead_letter(
                msg, endpoint_id, exc.code, exc.message, claimed_action_id=action.id
            )
            return
        if not await self.msg_id_matches(msg, endpoint_id, headers, action.id):
            return
        health = rt.stores.leases.health
        if health is not None and not health.accepting:
            # Fetched by a pull request sent before the store gate closed: admission and the
            # lease would wait on a failing Redis; nak it for a worker whose store answers.
            raise StoreNotAccepting(f"not admitted: {health.reason}")
        rt.audit.emit(
            ReceiptEvent.RECEIVED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            trace_id=action.trace.trace_id if action.trace else None,
            envelope_sha256=hashlib.sha256(payload).hexdigest(),
            signer=signer,
            capability=action.capability,
        )
        cap_endpoint, operation_name = split_capability(action.capability)
        operation = rt.registry.get(operation_name)
        keys = operation.keys(action) if operation is not None else ActionKeys.of(action.id)
        params: Any = None
        try:
            runtime_endpoint = rt.endpoints[endpoint_id]
            self.require_signer()
            if cap_endpoint != endpoint_id:
                raise Refusal(
                    ConnectorError(
                        ErrorCode.HOST_ROUTE_MISMATCH,
                        f"capability names endpoint {cap_endpoint!r}, "
                        f"delivered for {endpoint_id!r}",
                    ),
                    read_only=False,
                )
            if operation is None:
                raise Refusal(
                    ConnectorError(
                        ErrorCode.CONFIGURATION_OR_INPUT,
                        f"operation {operation_name!r} is not published by this worker",
                    ),
                    read_only=False,
                )
            spec = operation.spec
            if spec.idempotency_required and action.idempotency_key is None:
                raise Refusal(
                    ConnectorError(
                        ErrorCode.CONFIGURATION_OR_INPUT,
                        f"{operation_name} requires an idempotency_key on the Action",
                    ),
                    read_only=spec.read_only,
                )
            if action.mode not in spec.modes:
                offered = ", ".join(mode.value for mode in spec.modes)
                raise Refusal(
                    ConnectorError(
                        ErrorCode.CONFIGURATION_OR_INPUT,
                        f"{operation_name} does not offer mode {action.mode.value!r} "
                        f"(it offers {offered})",
                    ),
                    read_only=spec.read_only,
                )
            try:
                params = convert_input(action.input, spec.input_type)
            except EnvelopeRejected as exc:
                raise Refusal(
                    ConnectorError(ErrorCode.CONFIGURATION_OR_INPUT, exc.reason),
                    read_only=spec.read_only,
                ) from None
            try:
                admitted = await rt.admission.admit(
                    action=action,
                    signer=signer,
                    endpoint=runtime_endpoint.endpoint,
                    spec=spec,
                    stores=rt.stores,
                )
                trusted = admitted.headers
            except ConnectorError as exc:
                raise Refusal(exc, read_only=spec.read_only) from None
            rt.audit.emit(
                ReceiptEvent.ADMITTED,
                action_id=action.id,
                endpoint_id=endpoint_id,
                facts=admitted.receipt_details,
            )
            deadline_ms = self.live_deadline(action, spec, "the Action")
        except Refusal as refusal:
            ep = runtime_endpoint if params is not None else None
            await self.recover_or_refuse(
                msg, action, keys, endpoint_id, ep, operation, params, refusal
            )
            return
        assert operation is not None
        await self.run(msg, action, keys, runtime_endpoint, operation, params, trusted, deadline_ms)

    async def msg_id_matches(
        self, msg: Msg, endpoint_id: str, headers: Mapping[str, str], action_id: str
    ) -> bool:
        """False (and dead-lettered) when the envelope's `Nats-Msg-Id` names another id.

        The stream deduplicates by `Nats-Msg-Id` before any worker sees a message, so an
        envelope carrying another Action's id there made that Action a "duplicate" the
        server dropped. Refusing the mismatch makes the squatter visible in the DLQ
        (`connector_host.replay`); without the header there is no dedupe slot to squat, and
        the envelope runs (retries of it are then deduplicated by `id` alone).
        """
        msg_id = headers.get(MSG_ID)
        if msg_id is None or msg_id == action_id:
            return True
        await self.dead_letter(
            msg,
            endpoint_id,
            ErrorCode.HOST_REPLAY,
            f"{MSG_ID} {msg_id[:80]!r} is not the envelope's Action id {action_id}",
            action_id=action_id,
        )
        return False

    def require_signer(self) -> None:
        """A Refusal (`connector_host.response_signing`, answered unsigned) when this worker
        has no signing key and unsigned responses are not allowed: nothing may run."""
        if self.rt.publisher.signer is None and not self.rt.settings.allow_unsigned_responses:
            raise Refusal(cannot_sign(), read_only=False)

    def live_deadline(self, action: Action, spec: OperationSpec, what: str) -> int:
        """The execution's deadline; a Refusal when it has already passed."""
        deadline_ms = self.deadline_of(action, spec)
        if deadline_ms <= now_ms():
            raise Refusal(
                ConnectorError(
                    ErrorCode.DEADLINE_EXCEEDED,
                    f"{what}'s deadline passed before it was started",
                    uncertain_outcome=False,
                ),
                read_only=spec.read_only,
            )
        return deadline_ms

    async def recover_or_refuse(
        self,
        msg: Msg,
        action: Action,
        keys: ActionKeys,
        endpoint_id: str,
        ep: EndpointRuntime | None,
        operation: Operation | None,
        params: Any,
        refusal: Refusal,
    ) -> None:
        """Settle the refusal, unless an earlier delivery already bound this work: then the
        refusal forbids only a new start, and what exists is observed, stopped or settled
        on the leased path (`ep` and `params` are None when the refusal came before them)."""
        if ep is not None and operation is not None and await operation.began(self.rt.stores, keys):
            recovery_deadline = max(
                now_ms() + RECOVERY_BUDGET_MS, self.deadline_of(action, operation.spec)
            )
            recovering = Recovering(params, refusal.error)
            await self.run(msg, action, keys, ep, operation, recovering, {}, recovery_deadline)
            return
        await self.refuse(msg, action, keys, endpoint_id, refusal, operation)

    def deadline_of(self, action: Action, spec: OperationSpec) -> int:
        """The earliest of the Action's deadline, its timeout, and the operation's own bound."""
        candidates = [now_ms() + spec.timeout_ms]
        if action.deadline_unix_ms is not None:
            candidates.append(action.deadline_unix_ms)
        if action.timeout_ms is not None:
            candidates.append(action.created_at_unix_ms + action.timeout_ms)
        return min(candidates)

    # --- the leased path --------------------------------------------------------------

    async def run(
        self,
        msg: Msg,
        action: Action,
        keys: ActionKeys,
        ep: EndpointRuntime,
        operation: Operation,
        params: Any,
        trusted: Mapping[str, str],
        deadline_ms: int,
    ) -> None:
        rt = self.rt
        spec = operation.spec
        owner = f"{rt.worker_id}#{secrets.token_hex(6)}"
        self.leasing(msg)
        if keys.is_resume:
            await rt.stores.leases.remember_resume(keys)
        grant = await rt.stores.leases.acquire(
            keys,
            owner,
            rt.settings.lease_ttl_ms,
            idempotency_fingerprint(action),
            subject_of(action),
        )
        if not await self.answer_without_lease(msg, action, keys, ep.endpoint.id, grant, operation):
            return
        cancel_requested = grant.cancel_requested
        if grant.cancel_pending:
            cancel_requested = await self.authorize_pending_cancels(action, keys, ep.endpoint.id)
        rt.metrics.delivery(ep.endpoint.id, DeliveryOutcome.EXECUTED)
        if grant.is_takeover:
            rt.metrics.takeover(ep.endpoint.id)
        faults.hit("after_lease", action.id)
        first_seq, prev_sha256 = (
            await self.last_chunk(ep.endpoint.id, action.id) if grant.is_takeover else (0, None)
        )
        execution = Execution(
            action=action,
            endpoint=ep.endpoint,
            operation=operation,
            hermes=ep.hermes,
            keys=keys,
            worker_id=rt.worker_id,
            owner=owner,
            fence=grant.fence,
            is_takeover=grant.is_takeover,
            attempted_fence=grant.attempted_fence,
            first_seq=first_seq,
            deadline_ms=deadline_ms,
            lease_ttl_ms=rt.settings.lease_ttl_ms,
            stores=rt.stores,
            publisher=rt.publisher,
            msg=msg,
            trusted_headers=trusted,
            cancel_requested=cancel_requested,
            metrics=rt.metrics,
            leased_at_ms=grant.now_ms,
            prev_sha256=prev_sha256,
        )
        rt.audit.emit(
            ReceiptEvent.LEASE_ACQUIRED,
            action_id=action.id,
            endpoint_id=ep.endpoint.id,
            fence=grant.fence,
            takeover=grant.is_takeover,
            previous_owner=grant.other_owner or None,
        )
        rt.keeper.add(execution)
        try:
            with rt.metrics.executing(ep.endpoint.id):
                outcome = await self.execute(execution, operation, params)
                if outcome is None:
                    return  # lease lost or shutting down: nothing settled, nothing acked
                await self.settle(execution, spec, outcome)
        finally:
            rt.keeper.remove(execution)

    async def authorize_pending_cancels(
        self, action: Action, keys: ActionKeys, endpoint_id: str
    ) -> bool:
        """Cancels recorded before any worker knew this Action: the first whose requester
        may cancel it becomes its durable intent, the others are dropped (and audited).
        True when the Action now has a durable cancel intent."""
        rt = self.rt
        authorized: bytes | None = None
        subject = subject_of(action)
        for requested_by, intent in (await rt.stores.leases.pending_cancels(keys)).items():
            try:
                await rt.admission.authorize_cancel(
                    requested_by=requested_by, subject=subject, stores=rt.stores
                )
            except ConnectorError as exc:
                rt.audit.emit(
                    ReceiptEvent.CANCEL_REFUSED,
                    action_id=action.id,
                    endpoint_id=endpoint_id,
                    requested_by=requested_by,
                    code=exc.code.value,
                )
                continue
            authorized = authorized or intent
        return await rt.stores.leases.promote_cancel(keys, authorized)

    async def answer_without_lease(
        self,
        msg: Msg,
        action: Action,
        keys: ActionKeys,
        endpoint_id: str,
        grant: Any,
        operation: Operation | None,
    ) -> bool:
        """Handle every acquire answer but ACQUIRED; True means: go on and execute."""
        rt = self.rt
        if grant.status is AcquireStatus.ACQUIRED:
            return True
        if grant.status is AcquireStatus.COLLISION:
            code = (
                operation.collision_code
                if operation is not None
                else ErrorCode.CONFIGURATION_OR_INPUT
            )
            await self.dead_letter(
                msg,
                endpoint_id,
                code,
                "idempotency collision: this Action id was first used with a different request",
                action_id=action.id,
            )
            return False
        if grant.status is AcquireStatus.SETTLED:
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.REPUBLISHED)
            await self.republish(msg, action.id, keys, endpoint_id, action)
            return False
        holder = rt.keeper.holding(action.id)
        if holder is not None:
            rt.metrics.delivery(endpoint_id, DeliveryOutcome.JOINED)
            # A redelivery of an Action this very worker is running: keep the newest handle
            # alive too, and ack it with the rest when the Action settles.
            holder.messages.append(msg)
            return False
        rt.audit.emit(
            ReceiptEvent.DUPLICATE,
            action_id=action.id,
            endpoint_id=endpoint_id,
            fence=grant.fence,
            holder=grant.other_owner,
        )
        rt.metrics.delivery(endpoint_id, DeliveryOutcome.DUPLICATE)
        wait_ms = max(50, min(grant.expires_at_ms - now_ms() + 50, rt.settings.lease_ttl_ms))
        await _quiet(msg.nak(delay=wait_ms / 1000))
        return False

    async def execute(
        self, execution: Execution, operation: Operation, params: Any
    ) -> Outcome | None:
        spec = operation.spec
        if execution.cancel_requested.is_set() and not operation.handles_cancel:
            return Outcome(
                ResultStatus.CANCELLED,
                error=ConnectorError(ErrorCode.CANCELLED, "cancelled before it started"),
            )
        if not spec.read_only and not operation.self_fenced:
            if execution.attempted_fence:
                return Outcome(
                    ResultStatus.FAILED,
                    error=ConnectorError(
                        ErrorCode.TRANSPORT,
                        "an earlier worker may have sent this request before it stopped; "
                        "the outcome is unknown and it is not sent again",
                        retryable=False,
                        uncertain_outcome=True,
                    ),
                )
            try:
                await execution.mark_unsafe_attempt()
            except LeaseLost as lost:
                self.rt.keeper.lose(execution, str(lost), cancel=False)
                return None
        faults.hit("before_execute", execution.action.id)
        execution.task = asyncio.get_running_loop().create_task(
            self._execute_bounded(execution, operation, params)
        )
        try:
            outcome: Outcome = await execution.task
        except asyncio.CancelledError:
            if execution.lease_lost or self.rt.shutting_down:
                if not execution.lease_lost:
                    await self.release(execution)
                return None
            if execution.cancel_requested.is_set():
                return Outcome(
                    ResultStatus.CANCELLED,
                    error=ConnectorError(ErrorCode.CANCELLED, "cancelled on request"),
                )
            raise
        faults.hit("after_execute", execution.action.id)
        if execution.lease_lost:
            return None
        return outcome

    async def _execute_bounded(
        self, execution: Execution, operation: Operation, params: Any
    ) -> Outcome:
        action = execution.action
        enter_scope(
            ReceiptScope(
                log=self.rt.audit,
                action_id=action.id,
                endpoint_id=execution.endpoint.id,
                fence=execution.fence,
                trace_id=action.trace.trace_id if action.trace else None,
            )
        )
        try:
            async with asyncio.timeout(execution.remaining_s()):
                outcome = await operation.execute(execution, params)
            await execution.confirm_chunks()
            return outcome
        except TimeoutError:
            return Outcome(ResultStatus.FAILED, error=deadline_exceeded(operation.spec.name))
        except ConnectorError as exc:
            return Outcome(ResultStatus.FAILED, error=exc)
        except LeaseLost as lost:
            # Found by the operation's own check (the local validity after a pause, a
            # fenced binding write): reported like the heartbeat's findings.
            self.rt.keeper.lose(execution, str(lost), cancel=False)
            raise asyncio.CancelledError("lease lost") from None
        except Exception as exc:
            if _is_dependency_failure(exc):
                # Redis, NATS or the network failed, not this Action: the delivery is nak'd
                # and the next owner takes over (and recovers what this one began), instead
                # of a terminal, uncertain result for a passing outage.
                raise
            # No typed path expected this (a bug): settle it as the host's execution failure
            # instead of redelivering the same failure forever (max_deliver is unlimited).
            log.exception("execution of %s failed unexpectedly", action.id)
            return Outcome(ResultStatus.FAILED, error=unexpected_failure(operation.spec.name, exc))

    async def release(self, execution: Execution) -> None:
        """Give the lease back unsettled (shutdown): the next owner need not wait out the TTL."""
        execution.ending = True
        try:
            await self.rt.stores.leases.release(execution.keys, execution.owner, execution.fence)
        except Exception:
            log.warning("could not release lease of %s", execution.action.id)
        for msg in execution.messages:
            await _quiet(msg.nak())
        self.rt.audit.emit(
            ReceiptEvent.LEASE_RELEASED,
            action_id=execution.action.id,
            endpoint_id=execution.endpoint.id,
            fence=execution.fence,
        )

    async def settle(self, execution: Execution, spec: OperationSpec, outcome: Outcome) -> None:
        rt = self.rt
        action = execution.action
        endpoint_id = execution.endpoint.id
        error: ProtocolError | None = None
        if outcome.error is not None:
            error = outcome.error.to_protocol(endpoint_id=endpoint_id, read_only=spec.read_only)
        terminal = execution.terminal_chunk(
            ChunkKind.ERROR if outcome.status is ResultStatus.FAILED else ChunkKind.DONE,
            {"status": outcome.status.value, "error": msgspec.to_builtins(error)},
            None,
        )
        terminal_bytes = encode(terminal)
        result = ActionResult(
            action_id=action.id,
            capability=action.capability,
            endpoint_id=endpoint_id,
            status=outcome.status,
            output=outcome.output,
            error=error,
            settled_by=rt.worker_id,
            fence=execution.fence,
            settled_at_unix_ms=now_ms(),
            last_chunk_sha256=sha256_hex(terminal_bytes),
        )
        payload = encode(result)
        oversize = self.oversize(payload, terminal_bytes)
        if oversize is not None:
            # Measured before anything is stored: a result no bus message can carry would
            # be settled, never published, and redelivered forever.
            error = oversize.to_protocol(endpoint_id=endpoint_id, read_only=spec.read_only)
            terminal = make_chunk(
                ChunkKind.ERROR,
                action_id=action.id,
                endpoint_id=endpoint_id,
                seq=terminal.seq,
                ts_unix_ms=terminal.ts_unix_ms,
                payload={"status": ResultStatus.FAILED.value, "error": msgspec.to_builtins(error)},
                prev_sha256=terminal.prev_sha256,
            )
            terminal_bytes = encode(terminal)
            result = msgspec.structs.replace(
                result,
                status=ResultStatus.FAILED,
                output=None,
                error=error,
                last_chunk_sha256=sha256_hex(terminal_bytes),
            )
            payload = encode(result)
        try:
            execution.ensure_lease()
        except LeaseLost as lost:
            rt.keeper.lose(execution, str(lost), cancel=False)
            return
        execution.ending = True
        stored = await rt.stores.leases.settle(
            execution.keys, execution.owner, execution.fence, payload
        )
        if stored.status is SettleStatus.FENCED_OUT:
            rt.metrics.fenced_out(endpoint_id, FenceStep.SETTLE)
            rt.audit.emit(
                ReceiptEvent.FENCED_OUT,
                action_id=action.id,
                endpoint_id=endpoint_id,
                fence=execution.fence,
            )
            rt.keeper.lose(execution, "settle refused: a newer owner holds the lease", cancel=False)
            return
        if stored.status is SettleStatus.EXISTS and not _is_own(stored.stored, execution):
            rt.keeper.lose(execution, "another owner settled this Action first", cancel=False)
            await self.republish_bytes(
                execution.messages, action.id, endpoint_id, stored.stored, action=action
            )
            return
        rt.audit.emit(
            ReceiptEvent.SETTLED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            fence=execution.fence,
            status=outcome.status.value,
            code=error.code.value if error else None,
        )
        log.info(
            "settled %s %s%s",
            action.id,
            outcome.status.value,
            f" ({error.code.value})" if error else "",
            extra=execution.log_fields(),
        )
        rt.metrics.settled(
            action.capability, outcome.status.value, error.code.value if error else None,
            uncertain=bool(error and error.uncertain_outcome),
        )
        faults.hit("after_settle", action.id)
        escalation = await self.escalate(result, action)
        faults.hit("after_escalation", action.id)
        await self.channel_out(result, action, escalation)
        faults.hit("after_channel_publish", action.id)
        # The terminal chunk is sent first (same connection, so it arrives first) and
        # confirmed together with the awaited result: one round trip, not two.
        pending_terminal = await rt.publisher.chunk(terminal, terminal_bytes)
        await rt.publisher.result_bytes(endpoint_id, action.id, payload)
        await rt.publisher.confirm([(terminal, pending_terminal)])
        rt.metrics.chunk_published(endpoint_id, str(terminal.__struct_config__.tag))
        faults.hit("after_result_publish", action.id)
        faults.hit("before_ack", action.id)
        await self.ack_all(execution.messages)

    def oversize(self, payload: bytes, terminal: bytes) -> ConnectorError | None:
        """`stream_publication` when the encoded result, or the terminal chunk (which may
        carry a provider's terminal event), is larger than one bus message may be."""
        limit = self.rt.publisher.max_message_bytes()
        size, what = len(payload), "result"
        if size <= limit:
            size, what = len(terminal), "terminal chunk"
        if size <= limit:
            return None
        return ConnectorError(
            ErrorCode.STREAM_PUBLICATION,
            f"the provider's answer makes a {size}-byte {what}, over the {limit} bytes one "
            "bus message may carry (NATS max_payload); it was not stored or published",
        )

    # --- answers without execution ----------------------------------------------------

    async def refuse(
        self,
        msg: Msg,
        action: Action,
        keys: ActionKeys,
        endpoint_id: str,
        refusal: Refusal,
        operation: Operation | None,
    ) -> None:
        """Settle a failed result for a trusted envelope that may not run (exactly once)."""
        rt = self.rt
        error = refusal.error.to_protocol(endpoint_id=endpoint_id, read_only=refusal.read_only)
        rt.audit.emit(
            ReceiptEvent.REFUSED,
            action_id=action.id,
            endpoint_id=endpoint_id,
            code=error.code.value,
        )
        owner = f"{rt.worker_id}#{secrets.token_hex(6)}"
        self.leasing(msg)
        grant = await rt.stores.leases.acquire(
            keys,
            owner,
            rt.settings.lease_ttl_ms,
            idempotency_fingerprint(action),
            subject_of(action),
        )
        if not await self.answer_without_lease(msg, action, keys, endpoint_id, grant, operation):
            return
        settled_at = now_ms()
        chunk = _refusal_chunk(action.id, endpoint_id, error, settled_at)
        result = ActionResult(
            action_id=action.id,
            capability=action.capability,
            endpoint_id=endpoint_id,
            status=ResultStatus.FAILED,
            error=error,
            settled_by=rt.worker_id,
            fence=grant.fence,
            settled_at_unix_ms=settled_at,
            last_chunk_sha256=sha256_hex(encode(chunk)),
        )
        stored = await rt.stores.leases.settle(keys, owner, grant.fence, encode(result))
        if stored.status is SettleStatus.FENCED_OUT:
            return
        payload = stored.stored or encode(result)
        stored_result = _decoded_result(stored.stored) or result
        if stored.stored is not None and stored_result.error is not None:
            # An earlier refusal's result: its chunk is a function of it, rebuilt exactly.
            chunk = _refusal_chunk(
                action.id, endpoint_id, stored_result.error, stored_result.settled_at_unix_ms
            )
        escalation = await self.escalate(stored_result, action)
        await self.channel_out(stored_result, action, escalation)
        # Like every Action, a refused one ends its chunk stream before its result, so a
        # consumer following the chunks learns the outcome too.
        await rt.publisher.chunk_awaited(chunk)
        await rt.publisher.result_bytes(endpoint_id, action.id, payload)
        rt.metrics.delivery(endpoint_id, DeliveryOutcome.REFUSED)
        rt.metrics.settled(action.capability, ResultStatus.FAILED.value, error.code.value)
        await self.ack_all([msg])

    async def republish(
        self,
        msg: Msg,
        action_id: str,
        keys: ActionKeys,
        endpoint_id: str,
        action: Action | None = None,
    ) -> None:
        stored = await self.rt.stores.leases.get_result(keys)
        await self.republish_bytes([msg], action_id, endpoint_id, stored, action=action)

    async def republish_bytes(
        self,
        msgs: list[Msg],
        action_id: str,
        endpoint_id: str,
        stored: bytes | None,
        *,
        action: Action | None = None,
    ) -> None:
        """A duplicate of a settled Action: the stored result again (same Msg-Id), then ack."""
        if stored is None:
            # The result expired between the two reads; the lease still remembers the Action.
            for msg in msgs:
                await _quiet(msg.nak(delay=self.rt.settings.nak_delay_ms / 1000))
            return
        if not await self.result_on_stream(endpoint_id, action_id):
            # Only when it is missing (a crash between settle and publish, or expired): a
            # republish after the duplicate window would otherwise store a second copy.
            # The escalation went out before the result, so it may be missing too: the same
            # one again (same id, a server-side duplicate if the first one was stored).
            stored_result = _decoded_result(stored)
            if action is not None and stored_result is not None:
                escalation = await self.escalate(stored_result, action, republished=True)
                await self.channel_out(stored_result, action, escalation)
            await self.rt.publisher.result_bytes(endpoint_id, action_id, stored)
            self.rt.audit.emit(
                ReceiptEvent.REPUBLISHED, action_id=action_id, endpoint_id=endpoint_id
            )
        await self.ack_all(msgs)

    async def escalate(
        self, result: ActionResult, action: Action, *, republished: bool = False
    ) -> Escalation | None:
        """Publish the escalation `result` raises, if any (worker/escalation/rules.py).

        Called only after this worker's own fenced settle, or when a stored result is
        republished: a stale owner, refused by the fence, never gets here.
        """
        escalation = escalation_for(
            result, action, approval_ttl_ms=self.rt.settings.hermes_operator_timeout_ms
        )
        if escalation is None:
            return None
        await self.rt.publisher.escalation(escalation)
        if republished:
            return escalation
        self.rt.metrics.escalation_raised(result.endpoint_id, escalation.kind.value)
        log.info(
            "escalation %s raised for %s (%s)",
            escalation.escalation_id,
            action.id,
            escalation.code.value if escalation.code else result.status.value,
            extra={"endpoint": result.endpoint_id, "action_id": action.id},
        )
        return escalation

    async def channel_out(
        self, result: ActionResult, action: Action, escalation: Escalation | None
    ) -> None:
        """Queue the channel deliveries the egress rules make of this result (and its
        escalation), before the result is published (docs/channels.md)."""
        if self.rt.channel is None:
            return
        for delivery in deliveries_for(self.rt.channel, result, action, escalation):
            await self.rt.publisher.channel_delivery(delivery)

    async def result_on_stream(self, endpoint_id: str, action_id: str) -> bool:
        subjects = self.rt.subjects
        try:
            await self.rt.js.get_last_msg(
                subjects.stream_name("results"), subjects.results(endpoint_id, action_id)
            )
        except NotFoundError:
            return False
        return True

    async def dead_letter(
        self,
        msg: Msg,
        endpoint_id: str,
        code: ErrorCode,
        reason: str,
        *,
        action_id: str | None = None,
        claimed_action_id: str | None = None,
    ) -> None:
        """Keep the rejected envelope (its first bytes, size and sha256) with its reason,
        then `term()` it; over the DLQ rate or with the DLQ full it is only counted.

        `action_id` is given only for an authenticated envelope: its `dead_lettered` receipt
        joins that Action's chain. An envelope that failed authentication may name any id
        (`claimed_action_id`), a victim's too: its receipt goes under the DLQ entry's own id
        (`Aip-Dlq-Id`), so nothing unauthenticated ever appends to an Action's chain. A
        refusal that was not kept gets no receipt either: a flood must not fill the audit
        stream instead.
        """
        rt = self.rt
        seq = _stream_seq(msg)
        dlq_id = _dlq_id(msg.subject, seq)
        kept = await rt.dead_letters.write(
            endpoint_id,
            dlq_id=dlq_id,
            subject=msg.subject,
            stream_seq=seq,
            payload=msg.data,
            code=code,
            reason=reason,
        )
        if kept is Kept.WRITTEN:
            if action_id is not None:
                rt.audit.emit(
                    ReceiptEvent.DEAD_LETTERED,
                    action_id=action_id,
                    endpoint_id=endpoint_id,
                    code=code.value,
                    dlq_id=dlq_id,
                )
            elif claimed_action_id is not None:
                rt.audit.emit(
                    ReceiptEvent.DEAD_LETTERED,
                    action_id=dlq_id,
                    endpoint_id=endpoint_id,
                    code=code.value,
                    claimed_action_id=(
                        claimed_action_id if is_action_id(claimed_action_id) else None
                    ),
                )
            rt.metrics.dead_lettered(endpoint_id, code.value)
            log.warning(
                "dead-lettered %s seq %s: %s (%s)",
                msg.subject,
                seq,
                code.value,
                reason,
                extra={"endpoint": endpoint_id, "action_id": action_id},
            )
        await _quiet(msg.term())

    async def last_chunk(self, endpoint_id: str, action_id: str) -> tuple[int, str | None]:
        """After a takeover, continue after the last chunk the stream holds: the next seq
        (gap-free) and the hash of that chunk's bytes (the chain goes on from it)."""
        subjects = self.rt.subjects
        try:
            last = await self.rt.js.get_last_msg(
                subjects.stream_name("chunks"), subjects.chunks(endpoint_id, action_id)
            )
        except NotFoundError:
            return 0, None
        data = last.data or b"{}"
        seq = msgspec.json.decode(data).get("seq")
        if not isinstance(seq, int):
            return 0, None
        return seq + 1, sha256_hex(data)

    async def ack_all(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            try:
                await msg.ack_sync(timeout=5.0)
            except Exception:
                log.info("ack not confirmed; a redelivery will republish the stored result")


def _refusal_chunk(
    action_id: str, endpoint_id: str, error: ProtocolError, settled_at_ms: int
) -> StreamChunk:
    """The one chunk of a refused Action, made only from its result's facts, so the same
    bytes (and hash) come back whichever delivery publishes it."""
    return make_chunk(
        ChunkKind.ERROR,
        action_id=action_id,
        endpoint_id=endpoint_id,
        seq=0,
        ts_unix_ms=settled_at_ms,
        payload={"status": ResultStatus.FAILED.value, "error": msgspec.to_builtins(error)},
    )


def _is_own(stored: bytes | None, execution: Execution) -> bool:
    """True when the stored result is this execution's own write (its reply was lost)."""
    if stored is None:
        return False
    try:
        result = _result_decoder.decode(stored)
    except msgspec.DecodeError:
        return False
    return result.fence == execution.fence and result.settled_by == execution.worker_id


def _decoded_result(stored: bytes | None) -> ActionResult | None:
    if stored is None:
        return None
    try:
        return _result_decoder.decode(stored)
    except msgspec.DecodeError:
        return None


def _dlq_id(subject: str, seq: int) -> str:
    """The DLQ entry's id: derived from where the envelope was stored, so a second attempt
    to dead-letter the same delivery names the same entry (and the server drops the copy)."""
    if seq == 0:
        return "dlq_" + secrets.token_hex(16)
    return "dlq_" + hashlib.sha256(f"{subject}:{seq}".encode()).hexdigest()[:32]


def _stream_seq(msg: Msg) -> int:
    try:
        return int(msg.metadata.sequence.stream)
    except Exception:
        return 0


async def _quiet(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception:
        log.debug("jetstream ack/nak failed", exc_info=True)
