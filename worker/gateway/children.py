"""Dispatch a child Action to the subjects that serve it, and settle its records from its result.

The order is the runtime's contract with the delegation resolver (docs/delegation.md):
queue entry `queued` (written before anything is sent) -> the child published as a signed
envelope under its content-bound `Nats-Msg-Id` (its id and the sha256 prefix of its
bytes; the envelope is a pure function of the record, so every re-send carries the same)
-> queue entry `running` (the dispatch is durable) ->
... its one ActionResult ... -> the lifecycle record with the result -> the queue entry
terminal. Every step is derived from durable state only (the queue entry and the child's
result on the bus), so any gateway can take any step again: a re-publish of the child is
dropped by JetStream's duplicate window and by the worker's exactly-once, and a re-written
record carries the same `Nats-Msg-Id` as the first.

With trusted worker keys (`AIPD_TRUSTED_WORKER_KEYS_FILE`), a result on the bus is the
child's only when a trusted worker signed exactly its bytes (worker/trust/responses.py):
anyone else with publish rights on the results subject could otherwise answer for the
child, and the gateway would sign that answer into the lifecycle record the delegation
resolver believes. A result that does not verify is refused and counted, and the wait goes
on for the real one (`Refused` says only such results were seen).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import msgspec
from msgspec.structs import replace
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from schemas.action import Action
from schemas.delegation import ChildAction
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.lifecycle import ChildResult, LifecycleRecord, LifecycleState, QueueRecord
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import envelope_msg_id
from worker import faults, tracing
from worker.aip.signing import AipSigner
from worker.bus.stream_reads import SubjectFollower
from worker.errors import ActionIdTaken, UnverifiedResponse
from worker.gateway.observe import GatewayMetrics
from worker.gateway.records import RuntimeStoreWriter
from worker.gateway.routes import Route
from worker.trust.responses import check_worker_signed, sha256_hex, verify_result
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.actions import GATEWAY_SENDER, aip_principal_kind, encode_action
from worker.wire.cancels import (
    CancelOutcome,
    decode_cancel_reply,
    encode_cancel,
    requester_principal,
)

log = logging.getLogger(__name__)

#: How much longer than the wait it asked for a cancel request waits for the answer.
CANCEL_REPLY_MARGIN_S = 5.0
#: Bound on `stored_result` reading the results subject again when its last message was
#: refused (an earlier one may be the real result; it stops at the last stored message).
RESCAN_TIMEOUT_S = 2.0
#: Refused result messages remembered so each is counted and logged once.
MAX_REMEMBERED_REFUSALS = 4_096


@dataclass(frozen=True, slots=True)
class Refused:
    """Results were on the bus for the child, but none verified against the trusted worker
    keys: nothing may be recorded as its result (`connector_host.response_signing`)."""

    reason: str


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def child_result(result: ActionResult) -> ChildResult:
    """The native result as the lifecycle store keeps it (a parked child counts as failed:
    the runtime's stores know only completed, failed and cancelled)."""
    status = result.status.value
    if result.status is ResultStatus.REQUIRES_HUMAN:
        status = "failed"
    error = None if result.error is None else msgspec.to_builtins(result.error)
    return ChildResult(
        action_id=result.action_id,
        capability=result.capability,
        status=status,
        output=result.output,
        error=error,
        settled_at_unix_ms=result.settled_at_unix_ms,
    )


class Children:
    """The child-side steps; stateless between calls (every input is a durable record)."""

    def __init__(
        self,
        nc: NATS,
        writer: RuntimeStoreWriter,
        seed: bytes,
        *,
        trusted_worker_keys: TrustedGatewayKeys | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.writer = writer
        self.seed = seed
        #: The same key as the AIP signer of the Action Envelopes sent to Hermes workers.
        self.signer = AipSigner.from_nkey_seed(seed)
        #: Whose signed results are the child's; None believes what is on the subject.
        self.trusted_worker_keys = trusted_worker_keys
        self.metrics = metrics
        self._refusals: OrderedDict[tuple[str, int], None] = OrderedDict()

    def believe(self, action_id: str, data: bytes, envelope_sha256: str) -> ActionResult:
        """Child `action_id`'s result in the `action_result` Envelope `data`;
        `UnverifiedResponse` when it is no result Envelope, when trusted worker keys are
        configured and none of them made its AIP signature, or when the result names
        another Action or another envelope than the one dispatched (`envelope_sha256`): a
        genuine answer to someone else's Action under this id, or replayed onto this
        subject, is not this child's."""
        result = verify_result(data, self.trusted_worker_keys)
        if result.action_id != action_id:
            raise UnverifiedResponse(f"the result on the subject of {action_id} names another")
        if result.action_sha256 != envelope_sha256:
            raise UnverifiedResponse(
                f"the result on the subject of {action_id} answers another envelope than the "
                "one this gateway dispatched"
            )
        return result

    def _refused(self, action_id: str, seq: int | None, exc: UnverifiedResponse) -> Refused:
        """Count and log a refused result once per stream message (recovery sweeps and
        followers read the same message again)."""
        key = (action_id, seq or 0)
        if key not in self._refusals:
            self._refusals[key] = None
            if len(self._refusals) > MAX_REMEMBERED_REFUSALS:
                self._refusals.popitem(last=False)
            if self.metrics is not None:
                self.metrics.unverified_result()
            log.warning(
                "a result for %s is refused: %s (%s)",
                action_id,
                exc,
                ErrorCode.HOST_RESPONSE_SIGNING.value,
                extra={"action_id": action_id},
            )
        return Refused(str(exc))

    async def dispatch(
        self, record: QueueRecord, route: Route, *, first: bool = False
    ) -> QueueRecord:
        """Publish the child (signed, under its content-bound `Nats-Msg-Id`), then record the
        dispatch.

        `first` is the publish right after this gateway created the queue entry: nothing of
        this gateway's can be in the duplicate window then, so a `duplicate` PubAck means
        someone else stored these very bytes first, and `ActionIdTaken` is raised. Another
        envelope under the same id no longer makes the dispatch a duplicate (the dedupe id
        is bound to the bytes): it cannot pre-empt the child, and its result, naming
        another envelope, is never the child's. A recovery re-send expects the duplicate."""
        payload = self.envelope(record.action, route, self.signer)
        msg_id = envelope_msg_id(record.action.id, payload)
        headers = {"Nats-Msg-Id": msg_id}
        subject = route.subjects.actions
        with tracing.producing(
            subject,
            headers,
            {"messaging.message.id": msg_id, "aip.action_id": record.action.id},
        ):
            ack = await self.js.publish(route.subjects.actions, payload, headers=headers)
        if first and ack.duplicate:
            raise ActionIdTaken(record.action.id)
        faults.hit("gateway_after_dispatch", record.action.id)
        running = replace(record, state=LifecycleState.RUNNING, updated_at_unix_ms=now_ms())
        await self.writer.update_queue_entry(running)
        return running

    async def served(self, route: Route) -> bool:
        """Whether a stream on this bus takes the route's actions subject. Work queues bind
        only the endpoints some worker pool provisioned: a child for any other would be
        refused by NATS (`no response from stream`), so it is refused before it is enqueued."""
        try:
            await self.js.find_stream_name_by_subject(route.subjects.actions)
        except NotFoundError:
            return False
        return True

    async def on_bus(self, route: Route, action_id: str) -> bool:
        """Whether a result or a chunk is already stored under `action_id` on the route's
        subjects: someone else's Action holds the id, and nothing there is this child's
        (`aip_action_events` would pass its chunks through)."""
        for subject in (route.subjects.results(action_id), route.subjects.chunks(action_id)):
            try:
                stream = await self.js.find_stream_name_by_subject(subject)
                await self.js.get_last_msg(stream, subject)
            except NotFoundError:
                continue
            return True
        return False

    @staticmethod
    def envelope(child: ChildAction, route: Route, signer: AipSigner | None = None) -> bytes:
        """The child as every executor decodes it (a Hermes worker or another route's
        executor alike): an AIP Action Envelope signed by the gateway (`signer`), whose
        `message_id` and `sent_at` come from the child's id and creation time
        (`encode_action`), so the bytes are a pure function of the recorded child and the
        gateway key: a recovery re-send is the same message. A Hermes route's child must
        also be a Hermes `Action` (an endpoint's capability).

        `delegation` is never sent: a caller of `aip_call` could write any chain there, and
        a worker would project it to Hermes as `X-AIP-Delegation-Chain` (and an operator
        binding would record it). Delegation comes from a signed `DelegationRequest` only;
        the queue record keeps the field for the delegation resolver to compare.
        """
        child = replace(child, delegation=None)
        action: Action = child
        if route.endpoint_id is not None:
            action = msgspec.convert(msgspec.to_builtins(child), Action)
        return encode_action(action, signer=signer, sender=GATEWAY_SENDER)

    @classmethod
    def envelope_sha256(
        cls, child: ChildAction, route: Route, signer: AipSigner | None = None
    ) -> str:
        """What the child's result must name as `action_sha256` (the envelope is a pure
        function of the recorded child and the gateway key, so every gateway signing with
        that key computes the same)."""
        return sha256_hex(cls.envelope(child, route, signer))

    async def wait_result(
        self, route: Route, child: ChildAction, timeout_s: float, *, until_drained: bool = False
    ) -> ActionResult | Refused | None:
        """The child's one (verified) result; when none arrived within `timeout_s`, `Refused`
        if results that did not verify were seen, else None. `until_drained` stops at the
        last message already stored instead of waiting for a new one.

        Read with message gets from the stream (worker/bus/stream_reads.py), woken by the
        connection's one shared subscription per results pattern: no consumer is created,
        and a NATS reconnect while following loses nothing (the next read resumes at the
        next stream sequence).
        """
        action_id = child.id
        expected = self.envelope_sha256(child, route, self.signer)
        subject = route.subjects.results(action_id)
        deadline = time.monotonic() + max(timeout_s, 0.0)
        stream = await self._results_stream(subject, deadline)
        if stream is None:
            return None  # no stream binds the route's results: nothing to follow
        refused: Refused | None = None
        async with SubjectFollower(self.nc, stream, subject) as follower:
            while True:
                wait = 0.0 if until_drained else deadline - time.monotonic()
                msg = await follower.next(wait)
                if msg is None:
                    return refused
                try:
                    return self.believe(action_id, msg.data or b"", expected)
                except UnverifiedResponse as exc:
                    # Not a trusted worker's: the real result may still follow.
                    refused = self._refused(action_id, msg.seq, exc)

    async def _results_stream(self, subject: str, deadline: float) -> str | None:
        """The stream that stores `subject` (None: none does); NATS errors (a reconnect)
        are retried until `deadline`."""
        while True:
            try:
                return await self.js.find_stream_name_by_subject(subject)
            except NotFoundError:
                return None
            except Exception as exc:  # NATS reconnecting: try again within the bound
                if time.monotonic() >= deadline:
                    return None
                log.info("cannot follow %s yet: %s", subject, type(exc).__name__)
                await asyncio.sleep(0.5)

    async def stored_result(
        self, route: Route, child: ChildAction
    ) -> ActionResult | Refused | None:
        """The child's result if it is already on the bus (no waiting for a new one): the
        last message, or when that one is refused, the first earlier one that verifies."""
        action_id = child.id
        subject = route.subjects.results(action_id)
        try:
            stream = await self.js.find_stream_name_by_subject(subject)
            msg = await self.js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        try:
            expected = self.envelope_sha256(child, route, self.signer)
            return self.believe(action_id, msg.data or b"", expected)
        except UnverifiedResponse as exc:
            refused = self._refused(action_id, msg.seq, exc)
        found = await self.wait_result(route, child, RESCAN_TIMEOUT_S, until_drained=True)
        return found or refused

    async def settle(self, record: QueueRecord, result: ChildResult) -> QueueRecord:
        """Lifecycle result first, then the queue entry terminal (the ordering contract)."""
        state = LifecycleState(result.status)
        await self.writer.write_lifecycle(
            LifecycleRecord(
                action_id=record.action.id,
                state=state,
                result=result,
                updated_at_unix_ms=now_ms(),
            )
        )
        terminal = replace(record, state=state, updated_at_unix_ms=now_ms())
        await self.writer.update_queue_entry(terminal)
        return terminal

    async def cancel(
        self,
        route: Route,
        action_id: str,
        *,
        requested_by: str,
        reason: str,
        requester_kind: str | None = None,
        wait_s: float = 0.0,
    ) -> CancelOutcome:
        """An AIP Cancel on the child's cancel subject, signed by the gateway key as
        `requested_by` (`requester_kind`: the caller's own kind word); the executor's answer
        (the child's terminal result once the cancel settles it within `wait_s`, or an
        error). With trusted worker keys the answer must be a trusted worker's
        (UnverifiedResponse otherwise)."""
        kind = aip_principal_kind(requester_kind) if requester_kind is not None else None
        payload = encode_cancel(
            action_id,
            requester=requester_principal(requested_by, kind),
            signer=self.signer,
            reason=reason,
            wait_ms=int(wait_s * 1000),
        )
        headers: dict[str, str] = {}
        tracing.inject(headers)
        reply = await self.nc.request(
            route.subjects.cancel,
            payload,
            timeout=wait_s + CANCEL_REPLY_MARGIN_S,
            headers=headers or None,
        )
        try:
            outcome, opened = decode_cancel_reply(reply.data or b"")
        except EnvelopeRejected as exc:
            raise UnverifiedResponse(f"cancel reply: {exc.reason}") from None
        if opened.envelope.get("in_response_to") != msgspec.json.decode(payload)["message_id"]:
            raise UnverifiedResponse("cancel reply: it does not answer this Cancel")
        if self.trusted_worker_keys is not None:
            check_worker_signed(opened, self.trusted_worker_keys, what="cancel reply")
        return outcome
