"""Finish what a gateway left unfinished, from durable state only.

No gateway holds authority in memory: a child's progress is its queue entry plus its result
on the bus. Every `gateway_recovery_interval_ms`, each gateway reads the last queue entry of
every child in the open index (worker/gateway/open_children.py: the children not settled
yet, whatever the history) and, for each one still `queued` or `running`:

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
from worker.errors import ConnectorError
from worker.gateway.children import Children, Refused, child_result, now_ms
from worker.gateway.observe import GatewayMetrics
from worker.gateway.open_children import OpenChildren
from worker.gateway.records import RuntimeStoreReader
from worker.gateway.routes import RouteTable
from worker.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


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

        From the open index (worker/gateway/open_children.py), never from the queue
        stream's history: one message get per open child, so a sweep costs the same with
        a day of settled children behind it as with none. An id whose entry is terminal
        (its gateway died before taking it out) or was never created (died between the
        two) is taken out of the index here; an entry this gateway cannot verify is not
        its own and is never acted on.
        """
        index = self.reader_open()
        found: list[QueueRecord] = []
        now = now_ms()
        for action_id, added_at in (await index.snapshot()).items():
            try:
                record = await self.reader.queue(action_id)
            except ConnectorError:
                continue
            if record is None:
                if now - added_at >= self.settings.gateway_redispatch_after_ms:
                    await index.remove(action_id)
                continue
            if record.state.terminal:
                await index.remove(action_id)
                continue
            found.append(record)
        return found

    def reader_open(self) -> OpenChildren:
        """The index the writer keeps (one instance per process: its batching is shared)."""
        return self.children.writer.open_children

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
