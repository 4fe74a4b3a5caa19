"""Finish what a gateway left unfinished, from durable state only.

No gateway holds authority in memory: a child's progress is its queue entry plus its result
on the bus. Every `gateway_recovery_interval_ms`, each gateway reads the last queue entry of
every child and, for each one still `queued` or `running`:

- its result is on the bus -> the lifecycle record, then the terminal queue entry;
- `queued` and not updated for `gateway_redispatch_after_ms` (its gateway died between
  enqueue and dispatch) -> dispatched again under the same id and content-bound
  `Nats-Msg-Id`: if the first dispatch did happen, JetStream's duplicate window and the
  worker's exactly-once drop this one, so a child never runs twice and never gets a second id;
- past its timeout plus `gateway_settle_grace_ms` without a result -> a cancel request to
  its executor, then settled `failed` (`deadline_exceeded`, outcome uncertain), or
  `connector_host.response_signing` (outcome uncertain) when results were on the bus but
  none verified against the trusted worker keys.

Two gateways doing this at once write the same records under the same `Nats-Msg-Id`s.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from schemas.errors import ErrorCode
from schemas.lifecycle import ChildResult, LifecycleState, QueueRecord
from schemas.result import ActionResult
from worker.bus.stream_reads import drain
from worker.errors import ConnectorError
from worker.gateway.children import Children, Refused, child_result, now_ms
from worker.gateway.observe import GatewayMetrics
from worker.gateway.records import RuntimeStoreReader
from worker.gateway.routes import RouteTable
from worker.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)

#: The most entries one sweep reads (a bound on one pass, not on the stream).
MAX_ENTRIES_PER_SWEEP = 10_000


class Recovery:
    def __init__(
        self,
        settings: GatewaySettings,
        children: Children,
        reader: RuntimeStoreReader,
        routes: RouteTable,
        metrics: GatewayMetrics,
    ) -> None:
        self.settings = settings
        self.children = children
        self.reader = reader
        self.routes = routes
        self.metrics = metrics
        #: The latest entry (with its stream sequence) of every queue subject read so far
        #: whose entry is not terminal, and the sequence to read on from.
        self._open: dict[str, tuple[int, QueueRecord]] = {}
        self._read_from = 1

    async def run(self) -> None:
        """Sweep forever (cancel to stop); a failed sweep is logged and tried again."""
        interval_s = self.settings.gateway_recovery_interval_ms / 1000
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("recovery sweep failed: %s", type(exc).__name__)
            await asyncio.sleep(interval_s)

    async def open_entries(self) -> list[QueueRecord]:
        """The current queue entry of every child that is not terminal.

        Read with message gets (worker/bus/stream_reads.py: the gateway role may create no
        consumer). Each sweep reads only what was stored since the last one, at most
        `MAX_ENTRIES_PER_SWEEP` messages, into the latest entry per subject, as a
        LAST_PER_SUBJECT read would see them: a terminal entry is forgotten (nothing follows
        it), and so is one whose message the stream's retention dropped. While a long
        stream is still being read (the first sweeps of a new gateway) nothing is returned:
        an entry read so far may not be its subject's latest yet.
        """
        js = self.children.js
        subjects = self.reader.subjects
        stream = subjects.runtime_stream_name("queue")
        state = (await js.stream_info(stream)).state
        if state.last_seq < self._read_from - 1:  # the stream was made again: read it anew
            self._open.clear()
            self._read_from = 1
        read = await drain(
            js,
            stream,
            subjects.all_runtime_queue(),
            start_seq=self._read_from,
            limit=MAX_ENTRIES_PER_SWEEP,
        )
        for msg in read:
            seq = msg.seq or 0
            self._read_from = seq + 1
            try:
                record = self.reader.decode_queue(msg.data or b"", msg.headers or {})
            except ConnectorError:
                # Not a record this gateway can vouch for: never acted on, and it does not
                # hide the last good entry of its subject.
                continue
            if record.state.terminal:
                self._open.pop(msg.subject or "", None)
            else:
                self._open[msg.subject or ""] = (seq, record)
        if len(read) >= MAX_ENTRIES_PER_SWEEP:
            return []  # more is stored: the next sweep reads on
        for subject in [s for s, (seq, _) in self._open.items() if seq < state.first_seq]:
            del self._open[subject]
        return [record for _, record in self._open.values()]

    async def sweep(self) -> int:
        """One pass; returns how many entries it moved on."""
        moved = 0
        for record in await self.open_entries():
            try:
                if await self.recover(record):
                    moved += 1
            except Exception as exc:
                log.warning(
                    "recovering %s failed: %s",
                    record.action.id,
                    type(exc).__name__,
                    extra={"action_id": record.action.id},
                )
        return moved

    async def recover(self, record: QueueRecord) -> bool:
        route = self.routes.resolve(record.action.capability)
        if route is None:
            return False
        child_id = record.action.id
        result = await self.children.stored_result(route, record.action)
        now = now_ms()
        if isinstance(result, ActionResult):
            await self.children.settle(record, child_result(result))
            self.metrics.recovered("settled")
            log.info(
                "recovered %s: settled from its result", child_id, extra={"action_id": child_id}
            )
            return True
        if (
            record.state is LifecycleState.QUEUED
            and now - record.updated_at_unix_ms >= self.settings.gateway_redispatch_after_ms
        ):
            await self.children.dispatch(record, route)
            self.metrics.recovered("redispatched")
            log.info(
                "recovered %s: dispatched again (same id)", child_id, extra={"action_id": child_id}
            )
            return True
        timeout_ms = record.action.timeout_ms or self.settings.gateway_call_timeout_ms
        if now >= record.enqueued_at_unix_ms + timeout_ms + self.settings.gateway_settle_grace_ms:
            try:
                await self.children.cancel(
                    route, child_id, requested_by="aip-gateway", reason="child timed out"
                )
            except Exception as exc:  # best effort: the settle below stands either way
                log.info("cancel of timed-out %s not confirmed: %s", child_id, type(exc).__name__)
            if isinstance(result, Refused):
                failure = ConnectorError(
                    ErrorCode.HOST_RESPONSE_SIGNING,
                    "no result of the child verified against the trusted worker keys "
                    f"within its timeout ({result.reason}); it may have run",
                    uncertain_outcome=True,
                )
            else:
                failure = ConnectorError(
                    ErrorCode.DEADLINE_EXCEEDED,
                    "the child produced no result within its timeout",
                    uncertain_outcome=True,
                )
            error = failure.to_protocol(endpoint_id=route.endpoint_id, read_only=False)
            await self.children.settle(
                record,
                ChildResult(
                    action_id=child_id,
                    capability=record.action.capability,
                    status="failed",
                    error=msgspec.to_builtins(error),
                    settled_at_unix_ms=now,
                ),
            )
            self.metrics.recovered("timed_out" if result is None else "unverified")
            return True
        return False
