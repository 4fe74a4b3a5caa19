"""Dispatch a child Action to the subjects that serve it, and settle its records from its result.

The order is the runtime's contract with the delegation resolver (docs/delegation.md):
queue entry `queued` (written before anything is sent) -> the child published as a signed
envelope with `Nats-Msg-Id` = its id -> queue entry `running` (the dispatch is durable) ->
... its one ActionResult ... -> the lifecycle record with the result -> the queue entry
terminal. Every step is derived from durable state only (the queue entry and the child's
result on the bus), so any gateway can take any step again: a re-publish of the child is
dropped by JetStream's duplicate window and by the worker's exactly-once, and a re-written
record carries the same `Nats-Msg-Id` as the first.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from msgspec.structs import replace
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from schemas.action import Action
from schemas.cancel import CancelReply, CancelRequest
from schemas.codec import encode
from schemas.delegation import ChildAction
from schemas.lifecycle import ChildResult, LifecycleRecord, LifecycleState, QueueRecord
from schemas.result import ActionResult, ResultStatus
from worker import faults
from worker.gateway.records import RuntimeStoreWriter
from worker.gateway.routes import Route
from worker.trust.signing import sign_envelope

log = logging.getLogger(__name__)

_result_decoder = msgspec.json.Decoder(ActionResult)
_reply_decoder = msgspec.json.Decoder(CancelReply)
CANCEL_TIMEOUT_S = 5.0


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

    def __init__(self, nc: NATS, writer: RuntimeStoreWriter, seed: bytes) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.writer = writer
        self.seed = seed

    async def dispatch(self, record: QueueRecord, route: Route) -> QueueRecord:
        """Publish the child (signed, `Nats-Msg-Id` = its id), then record the dispatch."""
        payload = self.envelope(record.action, route)
        headers = {"Nats-Msg-Id": record.action.id, **sign_envelope(payload, self.seed)}
        await self.js.publish(route.actions, payload, headers=headers)
        faults.hit("gateway_after_dispatch", record.action.id)
        running = replace(record, state=LifecycleState.RUNNING, updated_at_unix_ms=now_ms())
        await self.writer.update_queue_entry(running)
        return running

    async def served(self, route: Route) -> bool:
        """Whether a stream on this bus takes the route's actions subject. Work queues bind
        only the endpoints some worker pool provisioned: a child for any other would be
        refused by NATS (`no response from stream`), so it is refused before it is enqueued."""
        try:
            await self.js.find_stream_name_by_subject(route.actions)
        except NotFoundError:
            return False
        return True

    @staticmethod
    def envelope(child: ChildAction, route: Route) -> bytes:
        """The child as its executor decodes it: a Hermes worker takes a plain `Action`."""
        if route.endpoint_id is not None:
            return encode(msgspec.convert(msgspec.to_builtins(child), Action))
        return encode(child)

    async def wait_result(
        self, route: Route, action_id: str, timeout_s: float
    ) -> ActionResult | None:
        """The child's one result, or None when none arrived within `timeout_s`.

        An ordered consumer re-creates itself after a NATS reconnect and starts again from
        the first message, so a disconnect while following loses nothing.
        """
        subject = route.results(action_id)
        deadline = time.monotonic() + max(timeout_s, 0.0)
        sub = None
        try:
            while sub is None:
                try:
                    sub = await self.js.subscribe(
                        subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
                    )
                except NotFoundError:
                    return None  # no stream binds the route's results: nothing to follow
                except Exception as exc:  # NATS reconnecting: try again within the bound
                    if time.monotonic() >= deadline:
                        return None
                    log.info("cannot follow %s yet: %s", action_id, type(exc).__name__)
                    await asyncio.sleep(0.5)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                try:
                    msg = await sub.next_msg(timeout=min(remaining, 5.0))
                except NatsTimeout:
                    continue
                try:
                    return _result_decoder.decode(msg.data)
                except msgspec.DecodeError:
                    log.warning("an undecodable result on %s is ignored", subject)
        finally:
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except Exception as exc:  # a closed connection: nothing to clean up
                    log.debug("unsubscribe failed: %s", type(exc).__name__)

    async def stored_result(self, route: Route, action_id: str) -> ActionResult | None:
        """The child's result if it is already on the bus (no waiting)."""
        subject = route.results(action_id)
        try:
            stream = await self.js.find_stream_name_by_subject(subject)
            msg = await self.js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        try:
            return _result_decoder.decode(msg.data or b"")
        except msgspec.DecodeError:
            return None

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
        self, route: Route, action_id: str, *, requested_by: str, reason: str
    ) -> CancelReply:
        """A signed CancelRequest on the child's cancel subject; the executor's reply."""
        payload = encode(
            CancelRequest(action_id=action_id, reason=reason, requested_by=requested_by)
        )
        reply = await self.nc.request(
            route.cancel,
            payload,
            timeout=CANCEL_TIMEOUT_S,
            headers=sign_envelope(payload, self.seed),
        )
        return _reply_decoder.decode(reply.data)
