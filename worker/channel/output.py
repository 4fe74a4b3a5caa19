"""The channel deliveries a settled result (and its escalation) makes: an Outbox output.

Registered by the wiring (`worker/app.py`) after the escalation output when channel egress
is configured (`AIPD_CHANNEL_EGRESS_FILE`), so the deliveries are queued on the egress work
queue before the result is published (docs/channels.md); a crash in between queues them
again under the same delivery ids, which the stream's duplicate window drops.
"""

from __future__ import annotations

from worker.bus.publisher import BusPublisher
from worker.channel.egress import deliveries_for
from worker.channel.rules import EgressTable
from worker.pipeline.outbox import Owed


class ChannelOutput:
    """Queues what the egress rules make of a settled result and its escalation."""

    fault_point = "after_channel_publish"

    def __init__(self, publisher: BusPublisher, table: EgressTable) -> None:
        self.publisher = publisher
        self.table = table

    async def publish(self, owed: Owed) -> None:
        for delivery in deliveries_for(self.table, owed.result, owed.action, owed.escalation):
            await self.publisher.channel_delivery(delivery)
