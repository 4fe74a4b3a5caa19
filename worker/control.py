"""The request/reply side of a worker: cancel and discovery (docs/architecture.md §3).

Both are NATS micro endpoints in one service, so `$SRV.PING|INFO|STATS.aip-hermes-worker`
discovers every worker and what it serves; `$SRV.STATS` also carries each worker's live
status (slots in use, leases held, readiness) as its endpoints' `data`. Requests are
load-balanced by the micro queue group; a cancel is persisted in Redis first (so it holds
even if no worker runs the Action yet), then announced on an internal subject that every
worker hears, so the holder re-reads the intent at once instead of at its next heartbeat.
The announcement grants nothing: only the durable intent cancels
(`worker.execution.cancel_notices`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from schemas.aip.extensions import CancelFacts
from schemas.aip.manifest import Manifest
from schemas.audit import ReceiptEvent
from schemas.errors import EnvelopeRejected, ErrorCode
from worker import __version__, tracing
from worker.aip.signing import AipSigner
from worker.endpoints import Endpoint
from worker.errors import ConnectorError, protocol_error
from worker.operations.base import Registry
from worker.pipeline.runtime import Runtime
from worker.store.keys import ActionKeys
from worker.store.lease_store import CancelAnswer, CancelState
from worker.tasks import stop_tasks
from worker.wire.cancels import (
    MAX_NOTICE_BYTES,
    cancel_of,
    claimed_reply,
    encode_cancel_notice,
    encode_cancel_result,
    encode_error,
    notice_action_id,
    open_cancel,
)
from worker.wire.envelopes import DEFAULT_MAX_ENVELOPE_BYTES, ReplyRecipe, sent_at_ms
from worker.wire.manifests import (
    EndpointFacts,
    build_manifest,
    decode_manifest_request,
    encode_manifest_error,
    encode_manifest_response,
    select,
)
from worker.wire.results import decode_result

if TYPE_CHECKING:
    from worker.store.stores import Stores

log = logging.getLogger(__name__)

#: Answers after which a durable, authorized intent exists (the holder must re-read it).
async def gather_replies(nc: NATS, verb: str, *, wait_s: float) -> list[bytes]:
    """`$SRV.{verb}.aip-hermes-worker` asked once, and every answer that arrives within
    `wait_s` (there is one per worker, and no count to wait for): how the gateway finds the
    manifests (`INFO`) and the console the workers' live state (`STATS`)."""
    inbox = nc.new_inbox()
    answers: list[bytes] = []

    async def keep(msg: Msg) -> None:
        answers.append(msg.data)

    sub = await nc.subscribe(inbox, cb=keep)
    try:
        await nc.publish(f"$SRV.{verb}.{SERVICE_NAME}", b"", reply=inbox)
        await asyncio.sleep(wait_s)
    finally:
        await sub.unsubscribe()
    return answers


_DURABLE = frozenset({CancelState.RECORDED, CancelState.ALREADY_REQUESTED})

SERVICE_NAME = "aip-hermes-worker"
QUEUE_GROUP = "aip-hermes-worker"


class BindingCancelHook(Protocol):
    """Records the intent in an operator binding and returns the binding's state."""

    def __call__(
        self, stores: Stores, action_id: str, *, source_action_id: str | None = None
    ) -> Awaitable[str | None]: ...


#: Notices buffered per subscription before the client drops more (a dropped notice only
#: delays a cancel until the next heartbeat, so a flood is shed instead of queued).
NOTICE_PENDING_MSGS = 4_096
#: Cancel requests waiting for their Action to settle, per worker; past it a cancel is
#: answered at once (a retryable error unless the Action has already ended).
MAX_CANCEL_WAITS = 256
#: The stored result is polled first after this long, then at doubling intervals up to the max.
SETTLE_POLL_FIRST_S = 0.05
SETTLE_POLL_MAX_S = 0.5
#: How long a stopping worker gives the waiting cancel replies to end.
STOP_WAITS_S = 2.0


def manifest_of(
    registry: Registry,
    endpoint: Endpoint,
    *,
    actions_subject: str,
    max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
    idempotency_ttl_ms: int | None = None,
) -> Manifest:
    """The endpoint's AIP manifest, with its tenant binding: the gateway lists a bound
    endpoint only to the tenant this worker admits (worker.trust.tenancy)."""
    descriptor = endpoint.descriptor
    facts = EndpointFacts(
        endpoint_id=endpoint.id,
        actions_subject=actions_subject,
        worker_version=__version__,
        tenant_id=descriptor.tenant_id,
        tenant_expires_at_unix_ms=descriptor.tenant_expires_at_unix_ms,
        shared=descriptor.shared,
        max_envelope_bytes=max_envelope_bytes,
        idempotency_ttl_ms=idempotency_ttl_ms,
    )
    return build_manifest([op.spec for op in registry.operations.values()], facts)


class ControlPlane:
    def __init__(
        self,
        nc: NATS,
        rt: Runtime,
        *,
        binding_cancel: BindingCancelHook | None = None,
        status: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        self.nc = nc
        self.rt = rt
        self.binding_cancel = binding_cancel
        #: This worker's live status (slots, leases, readiness), the `data` of each
        #: endpoint in `$SRV.STATS`: what the console's workers page shows.
        self.status = status
        self.service: Service | None = None
        #: Cancel replies waiting for their Action to settle (`MAX_CANCEL_WAITS`).
        self._waits: set[asyncio.Task[None]] = set()
        self._manifests = {
            endpoint_id: manifest_of(
                rt.registry,
                served.endpoint,
                actions_subject=rt.subjects.actions(endpoint_id),
                max_envelope_bytes=rt.settings.max_envelope_bytes,
                idempotency_ttl_ms=rt.settings.effective_idempotency_ttl_ms,
            )
            for endpoint_id, served in rt.endpoints.items()
        }

    async def start(self) -> None:
        subjects = self.rt.subjects
        self.service = await add_service(
            self.nc,
            name=SERVICE_NAME,
            version=__version__,
            description="Drives Hermes Agent endpoints for AIP Actions on JetStream",
            queue_group=QUEUE_GROUP,
            metadata={"worker_id": self.rt.worker_id},
            stats_handler=self._stats,
        )
        for endpoint_id in self.rt.endpoints:
            await self.service.add_endpoint(
                name=f"manifest-{endpoint_id}",
                subject=subjects.manifest(endpoint_id),
                handler=self._manifest_handler(endpoint_id),
            )
            await self.service.add_endpoint(
                name=f"cancel-{endpoint_id}",
                subject=subjects.cancel(endpoint_id),
                handler=self._cancel_handler(endpoint_id),
            )
            await self.nc.subscribe(
                subjects.cancel_notice(endpoint_id),
                cb=self._on_cancel_notice,
                pending_msgs_limit=NOTICE_PENDING_MSGS,
                pending_bytes_limit=NOTICE_PENDING_MSGS * MAX_NOTICE_BYTES * 4,
            )

    def _stats(self, _: object) -> dict[str, object] | None:
        return None if self.status is None else self.status()

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
        await stop_tasks(self._waits, STOP_WAITS_S)

    def _manifest_handler(self, endpoint_id: str) -> Callable[[Request], Awaitable[None]]:
        async def handle(request: Request) -> None:
            await request.respond(self.answer_manifest(endpoint_id, request.data))

        return handle

    def answer_manifest(self, endpoint_id: str, data: bytes) -> bytes:
        """The signed answer to one manifest request: a `manifest_response` with the
        capabilities its filter selects, or an `aip.core.v1.error` for a request that is not
        a readable `manifest_request` Envelope (or whose signature does not verify). An
        unsigned request is answered: the manifest is what every worker publishes in `$SRV`
        to anyone on the bus, and the answer itself is signed."""
        signer = self.rt.publisher.signer
        aip_signer = signer.aip if signer is not None else None
        try:
            asked, opened = decode_manifest_request(
                data, max_bytes=self.rt.settings.max_envelope_bytes
            )
        except EnvelopeRejected as exc:
            error = protocol_error(exc.code, exc.reason, endpoint_id=endpoint_id, read_only=True)
            return encode_manifest_error(
                error, endpoint_id=endpoint_id, signer=aip_signer, request=None
            )
        return encode_manifest_response(
            select(self._manifests[endpoint_id], asked),
            endpoint_id=endpoint_id,
            signer=aip_signer,
            request=opened,
        )

    def _cancel_handler(self, endpoint_id: str) -> Callable[[Request], Awaitable[None]]:
        async def handle(request: Request) -> None:
            headers = request.headers or {}
            if len(self._waits) >= MAX_CANCEL_WAITS:
                # Answered at once (no wait) rather than queued: a flood of cancels must
                # not hold the subscription that every cancel of this endpoint shares.
                await self._answer(request, endpoint_id, headers, may_wait=False)
                return
            task = asyncio.get_running_loop().create_task(
                self._answer(request, endpoint_id, headers, may_wait=True),
                name=f"cancel-reply-{endpoint_id}",
            )
            self._waits.add(task)
            task.add_done_callback(self._waits.discard)

        return handle

    async def _answer(
        self, request: Request, endpoint_id: str, headers: dict[str, str], *, may_wait: bool
    ) -> None:
        with tracing.span(
            "process aip.hermes.{endpoint}.cancel",
            kind="consumer",
            carrier=tracing.trace_context(headers),
        ):
            reply = await self.cancel(endpoint_id, request.data, may_wait=may_wait)
        try:
            await request.respond(reply)
        except Exception as exc:  # the requester's connection is gone: nothing to answer
            log.info("cancel reply not sent: %s", type(exc).__name__)

    async def cancel(self, endpoint_id: str, data: bytes, *, may_wait: bool = True) -> bytes:
        """Authorize, persist the intent durably, announce it, then answer as AIP answers a
        Cancel: the Action's terminal result once the cancel settles it (or at once if it
        had already ended), or an error Envelope when refused or not settled within the
        wait (`worker.wire.cancels`). A refused request changes nothing."""
        rt = self.rt
        answer_error = partial(self._error_reply, endpoint_id)
        try:
            opened = open_cancel(data, max_bytes=rt.settings.max_envelope_bytes)
        except EnvelopeRejected as exc:
            return answer_error(claimed_reply(data), None, exc.code, exc.reason)
        reply = ReplyRecipe.answering(opened)
        try:
            request = cancel_of(opened)
        except EnvelopeRejected as exc:
            return answer_error(reply, None, exc.code, exc.reason)
        try:
            rt.gate.verify_action_signer(opened.verified)
            await rt.gate.check_fresh(sent_at_ms(opened), rt.stores, opened.message_id)
        except ConnectorError as exc:
            return answer_error(reply, request.action_id, exc.code, exc.message)
        except Exception as exc:
            log.warning("cancel of %s not checked: %s", request.action_id, type(exc).__name__)
            return answer_error(
                reply, request.action_id, ErrorCode.HOST_NOT_READY, "cancel not checked"
            )
        intent = msgspec.json.encode(
            {
                "requested_by": request.requested_by,
                "reason": request.reason,
                "at_unix_ms": time.time_ns() // 1_000_000,
            }
        )
        try:
            keys = await rt.stores.leases.keys_of(request.action_id)
            answer = await self._authorized_record(request.requested_by, keys, intent)
            binding_state = None
            if self.binding_cancel is not None and answer.state is not CancelState.PENDING:
                binding_state = await self.binding_cancel(
                    rt.stores,
                    request.action_id,
                    source_action_id=keys.slot_action_id if keys.is_resume else None,
                )
        except ConnectorError as exc:
            rt.audit.emit(
                ReceiptEvent.CANCEL_REFUSED,
                action_id=request.action_id,
                endpoint_id=endpoint_id,
                requested_by=request.requested_by,
                code=exc.code.value,
            )
            return answer_error(reply, request.action_id, exc.code, exc.message)
        except Exception as exc:
            log.warning("cancel of %s not recorded: %s", request.action_id, type(exc).__name__)
            return answer_error(
                reply,
                request.action_id,
                ErrorCode.HOST_NOT_READY,
                "cancel intent not recorded",
            )
        state = answer.state
        rt.audit.emit(
            ReceiptEvent.CANCEL_REQUESTED,
            action_id=request.action_id,
            endpoint_id=endpoint_id,
            requested_by=request.requested_by,
            state=state.value,
        )
        if state in _DURABLE:
            notice: dict[str, str] = {}
            tracing.inject(notice)
            await self.nc.publish(
                rt.subjects.cancel_notice(endpoint_id),
                encode_cancel_notice(
                    request.action_id,
                    endpoint_id=endpoint_id,
                    signer=self._signer(),
                    correlation_id=opened.message_id,
                ),
                headers=notice or None,
            )
        if state is CancelState.PENDING:
            reported = "pending"
        elif state is CancelState.SETTLED:
            reported = binding_state or "settled"
        else:
            reported = binding_state or ("running" if answer.owner else "pending")
        # `accepted` means the intent is durable (pending: until the leasing worker
        # authorizes it against the Action); a settled Action records none.
        facts = CancelFacts(
            accepted=state in _DURABLE or state is CancelState.PENDING, state=reported
        )
        bound = rt.settings.cancel_reply_wait_ms
        wait_ms = min(bound, request.wait_ms) if request.wait_ms is not None else bound
        settled = await self._settled(keys, wait_ms if may_wait else 0)
        if settled is None:
            return answer_error(
                reply,
                request.action_id,
                ErrorCode.HOST_NOT_READY,
                f"the cancel is {'recorded' if facts.accepted else 'not recorded'}; the Action "
                f"did not settle within {wait_ms if may_wait else 0} ms: ask again for its "
                "result",
                facts,
            )
        try:
            # Whoever the Action's result is shown to may cancel it: checked against the
            # principal its lease records now (a cancel taken before any worker leased the
            # Action was checked only against the directory).
            subject = await rt.stores.leases.cancel_subject(keys)
            if subject is None:
                raise ConnectorError(
                    ErrorCode.HOST_NOT_READY, "the Action's principal is not recorded yet"
                )
            await rt.gate.authorize_cancel(
                requested_by=request.requested_by, subject=subject, stores=rt.stores
            )
            result, _ = decode_result(settled)
        except ConnectorError as exc:
            return answer_error(
                reply,
                request.action_id,
                exc.code,
                exc.message,
                CancelFacts(accepted=False, state="settled"),
            )
        except Exception as exc:
            log.warning("cancel of %s: result not read: %s", request.action_id, type(exc).__name__)
            return answer_error(
                reply, request.action_id, ErrorCode.HOST_NOT_READY, "the result was not read"
            )
        return encode_cancel_result(
            result, reply=reply, signer=self._signer(), endpoint_id=endpoint_id, cancel=facts
        )

    async def _settled(self, keys: ActionKeys, wait_ms: int) -> bytes | None:
        """The Action's stored result (its Envelope bytes), waiting up to `wait_ms` for the
        settle; None when there is none by then (or the store cannot say)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_ms / 1000
        delay = SETTLE_POLL_FIRST_S
        while True:
            try:
                stored, _, _ = await self.rt.stores.leases.get_settled(keys)
            except Exception as exc:
                log.info("cancel: the stored result was not read: %s", type(exc).__name__)
                stored = None
            if stored is not None:
                return stored
            remaining = until - loop.time()
            if remaining <= 0:
                return None
            await asyncio.sleep(min(delay, remaining))
            delay = min(delay * 2, SETTLE_POLL_MAX_S)

    def _signer(self) -> AipSigner | None:
        signer = self.rt.publisher.signer
        return signer.aip if signer is not None else None

    def _error_reply(
        self,
        endpoint_id: str,
        reply: ReplyRecipe,
        action_id: str | None,
        code: ErrorCode,
        message: str,
        facts: CancelFacts | None = None,
    ) -> bytes:
        return encode_error(
            protocol_error(code, message, endpoint_id=endpoint_id),
            reply=reply,
            signer=self._signer(),
            endpoint_id=endpoint_id,
            action_id=action_id,
            cancel=facts or CancelFacts(accepted=False, state="unknown"),
        )

    async def _authorized_record(
        self, requested_by: str, keys: ActionKeys, intent: bytes
    ) -> CancelAnswer:
        """Authorize `requested_by` against the principal the Action's lease records, and
        record the intent if that principal is still the one checked (a lease taken in
        between is re-checked once). Raises ConnectorError when refused."""
        rt = self.rt
        subject = await rt.stores.leases.cancel_subject(keys)
        for _ in range(2):
            await rt.gate.authorize_cancel(
                requested_by=requested_by, subject=subject, stores=rt.stores
            )
            answer = await rt.stores.leases.request_cancel(
                keys,
                intent,
                requested_by=requested_by,
                authorized_for=subject.principal_id if subject else "",
            )
            if answer.state is CancelState.PENDING_FULL:
                raise ConnectorError(
                    ErrorCode.HOST_CAPACITY,
                    "too many cancel requests wait for this Action to be delivered",
                )
            if answer.state is not CancelState.CHANGED:
                return answer
            subject = await rt.stores.leases.cancel_subject(keys)
        raise ConnectorError(ErrorCode.HOST_NOT_READY, "the Action's lease kept changing")

    async def _on_cancel_notice(self, msg: Msg) -> None:
        """Read, not verified: it only asks for a re-read of the durable intent
        (`worker.wire.cancels.notice_action_id`); what is not a notice is dropped."""
        try:
            action_id = notice_action_id(msg.data)
        except EnvelopeRejected:
            return
        self.rt.keeper.cancel_notice(action_id)
