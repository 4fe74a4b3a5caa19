"""Write and read the runtime's queue and lifecycle records (`aip.runtime.{queue,lifecycle}.*`).

The gateway is the only writer of these streams. Every record is an AIP
`aip.lifecycle.v1.action_status` Envelope (`worker.wire.runtime_records`) signed with the
gateway key (workers trust it through `AIPD_TRUSTED_GATEWAY_KEYS_FILE`) and carries a
`Nats-Msg-Id` per
(child, store, state), so two gateways finishing the same child write each state once. The
first queue entry of a child is written with `Nats-Expected-Last-Subject-Sequence: 0`: of
two gateways racing on one `action_id`, exactly one creates it; the other reads the winner's.
Reads verify the signature like the workers do: a record this gateway cannot verify is
treated as not its own and never acted on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TypeVar

from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from schemas.lifecycle import LifecycleRecord, QueueRecord
from subjects.grammar import Subjects
from subjects.streams import StreamPolicy, runtime_store_configs
from worker import tracing
from worker.aip.signing import AipSigner
from worker.delegation.stores import StoreRecords, decode_record
from worker.errors import QueueEntryExists
from worker.gateway.open_children import OpenChildren
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.runtime_records import encode_lifecycle_record, encode_queue_record

log = logging.getLogger(__name__)

T = TypeVar("T", QueueRecord, LifecycleRecord)

#: JetStream's "wrong last sequence" error: another writer created the entry first.
WRONG_LAST_SEQUENCE = 10071


@dataclass
class RuntimeStoreWriter:
    """Signs and publishes records; the one place the gateway writes the runtime's stores."""

    js: JetStreamContext
    subjects: Subjects
    seed: bytes
    #: Tests wrap this class to break one invariant at a time; production always signs.
    sign: bool = True
    #: Which children are open (the recovery sweep's index, worker/gateway/open_children.py):
    #: a child is added before its queue entry exists and removed once it is terminal.
    open_children: OpenChildren = field(init=False)

    def __post_init__(self) -> None:
        self.open_children = OpenChildren(self.js, self.subjects, self.seed)
        self._signer = AipSigner.from_nkey_seed(self.seed)

    def _signer_now(self) -> AipSigner | None:
        return self._signer if self.sign else None

    async def provision(self, policy: StreamPolicy | None = None) -> None:
        """Create both streams if they are missing; existing ones are left as they are.

        Where roles are separated (compose), the gateway may not create streams: an admin
        runs `aip-hermes-worker provision --runtime-stores` first, and this only checks.
        """
        for config in runtime_store_configs(self.subjects, policy or StreamPolicy()):
            assert config.name is not None
            try:
                await self.js.stream_info(config.name)
            except NotFoundError:
                await self.js.add_stream(config)

    async def create_queue_entry(self, record: QueueRecord) -> None:
        """The first record of a child; raises QueueEntryExists when another writer won.
        The child is in the open index first, so a gateway dying after the entry leaves
        it where the recovery sweep looks."""
        await self.open_children.add(record.action.id)
        headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
        try:
            await self._publish(
                self.subjects.runtime_queue(record.action.id),
                encode_queue_record(record, signer=self._signer_now(), sender=GATEWAY_SENDER),
                msg_id=f"{record.action.id}:queue:create",
                extra=headers,
            )
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                raise QueueEntryExists(record.action.id) from None
            raise

    async def update_queue_entry(self, record: QueueRecord) -> None:
        """A later state of the child's queue entry (dispatched, terminal); a terminal one
        takes the child out of the open index after it is written."""
        await self._publish(
            self.subjects.runtime_queue(record.action.id),
            encode_queue_record(record, signer=self._signer_now(), sender=GATEWAY_SENDER),
            msg_id=f"{record.action.id}:queue:{record.state.value}",
        )
        if record.state.terminal:
            await self.open_children.remove(record.action.id)

    async def write_lifecycle(self, record: LifecycleRecord) -> None:
        """The child's lifecycle state and, when terminal, its durable result."""
        await self._publish(
            self.subjects.runtime_lifecycle(record.action_id),
            encode_lifecycle_record(record, signer=self._signer_now(), sender=GATEWAY_SENDER),
            msg_id=f"{record.action_id}:lifecycle:{record.state.value}",
        )

    async def _publish(
        self, subject: str, payload: bytes, *, msg_id: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = {"Nats-Msg-Id": msg_id, **(extra or {})}
        tracing.inject(headers)
        await self.js.publish(subject, payload, headers=headers)


class RuntimeStoreReader:
    """The last, signature-verified record of each store for one child."""

    def __init__(self, js: JetStreamContext, subjects: Subjects, trusted: TrustedGatewayKeys):
        self.js = js
        self.subjects = subjects
        self.trusted = trusted

    async def read(self, action_id: str) -> StoreRecords:
        s = self.subjects
        queue = await self._last("queue", s.runtime_queue(action_id), QueueRecord)
        lifecycle = await self._last("lifecycle", s.runtime_lifecycle(action_id), LifecycleRecord)
        return StoreRecords(queue, lifecycle)

    async def queue(self, action_id: str) -> QueueRecord | None:
        return await self._last("queue", self.subjects.runtime_queue(action_id), QueueRecord)

    def decode_queue(self, data: bytes) -> QueueRecord:
        return decode_record(data, QueueRecord, self.trusted, what="queue")

    async def _last(self, kind: str, subject: str, typ: type[T]) -> T | None:
        try:
            msg = await self.js.get_last_msg(self.subjects.runtime_stream_name(kind), subject)
        except NotFoundError:
            return None
        return decode_record(msg.data or b"", typ, self.trusted, what=kind)
