"""The gateway's index of open children: which children may still need recovering.

Why an index: the recovery sweep used to read the whole queue stream, oldest first, 10,000
entries a pass, to find the few entries that are not terminal. With a day's history a new
orphan stayed `queued` for good and an idle gateway spent 21-38 % of a core re-reading
settled history (issue 27). The index makes a sweep's cost the number of open children,
whatever the history.

How: stream `AIP_RUNTIME_OPEN` keeps one message per shard (`aip.runtime.open.{0..f}`,
the first hex digit of the child's id; `max_msgs_per_subject: 1`): the shard's open child
ids with when each was added, as an AIP `aip.lifecycle.v1.action_list` Envelope (one
ActionStatus per child, `worker.wire.open_index`), signed with the gateway key like every
runtime record. A child is added before its queue entry is created and removed after its
terminal queue entry is written (`RuntimeStoreWriter`, the one place both happen), so:

- a gateway that dies between the two leaves the id in the index, and the sweep finds it;
- one that dies after the terminal entry but before the removal leaves a terminal child in
  the index, and the sweep removes it;
- an id added whose queue entry was never created is removed by the sweep once it is older
  than `gateway_redispatch_after_ms`.

Each change is a compare-and-set (`Nats-Expected-Last-Subject-Sequence`) of the shard's
message, retried on a lost race with another gateway; in one process the changes waiting
for a shard are written together, so N concurrent calls cost about one write per shard
and round trip, not N conflicting ones. The sweep reads only the shards written since its
last read (message gets from the last sequence it saw): an idle sweep is one stream info
and one message get. No consumer is created (the gateway role may create none,
worker/bus/stream_reads.py), and no purge or delete is needed (the role may do neither).

Limits: a shard's message holds every open id of its shard (about 100 bytes each as an
ActionStatus), so one shard holds ~10,000 open children per MiB of message (NATS'
`max_payload`, 1 MiB by default), 16 shards ~160,000; above 1,000 ids in one shard the list
is longer than the page AIP's runtime answers a list query with (the schema sets no bound,
and no AIP reader pages this subject); a child opened
before this index existed (an upgrade with children in flight) is not in it: drain or
finish them before upgrading (docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from schemas.errors import EnvelopeRejected, ErrorCode
from subjects.grammar import Subjects
from worker import tracing
from worker.aip.signing import AipSigner
from worker.bus.stream_reads import drain
from worker.errors import ConnectorError
from worker.trust.signing import TrustedGatewayKeys, decode_user_public_key
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.open_index import decode_open_shard, encode_open_shard

log = logging.getLogger(__name__)

#: The shards (the first hex digit after `act_`).
SHARDS = tuple("0123456789abcdef")
#: JetStream's "wrong last sequence" error: another gateway changed the shard first.
WRONG_LAST_SEQUENCE = 10071
#: Compare-and-set attempts for one batch before it fails (each a read and a publish).
MAX_ATTEMPTS = 50


def shard_of(action_id: str) -> str:
    digit = action_id[4:5].lower()
    return digit if digit in SHARDS else "0"


def own_key(seed: bytes) -> TrustedGatewayKeys:
    """The public key of `seed` as the only trusted one."""
    import nacl.signing
    import nkeys

    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    return TrustedGatewayKeys({public: nacl.signing.VerifyKey(decode_user_public_key(public))})


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class OpenChildren:
    """Adds and removes open children, and reads the index for the recovery sweep."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        seed: bytes,
    ) -> None:
        self.js = js
        self.subjects = subjects
        self.seed = seed
        self.signer = AipSigner.from_nkey_seed(seed)
        #: Whose shard messages are believed: gateways sharing this gateway's key.
        self.trusted = own_key(seed)
        self.stream = subjects.runtime_stream_name("open")
        self._pending: dict[str, list[tuple[str, int | None, asyncio.Future[None]]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: The sweep's view: per shard subject, its message's sequence and open ids.
        self._seen: dict[str, tuple[int, dict[str, int]]] = {}
        self._read_from = 1

    # --- writes -------------------------------------------------------------------------

    async def add(self, action_id: str) -> None:
        """`action_id` is open (before its queue entry is created)."""
        await self._change(action_id, now_ms())

    async def remove(self, action_id: str) -> None:
        """`action_id` is settled (after its terminal queue entry is written)."""
        await self._change(action_id, None)

    async def _change(self, action_id: str, added_at: int | None) -> None:
        shard = shard_of(action_id)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(shard, []).append((action_id, added_at, done))
        lock = self._locks.setdefault(shard, asyncio.Lock())
        async with lock:
            if not done.done():
                # Everything waiting for this shard so far goes in one write.
                batch = self._pending.pop(shard, [])
                try:
                    await self._write(shard, [(a, t) for a, t, _ in batch])
                except BaseException as exc:
                    failure = (
                        exc
                        if isinstance(exc, Exception)
                        else ConnectionError("the write of the open index was interrupted")
                    )
                    for _, _, waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(failure)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for _, _, waiter in batch:
                        if not waiter.done():
                            waiter.set_result(None)
        await done

    async def _write(self, shard: str, changes: list[tuple[str, int | None]]) -> None:
        subject = self.subjects.runtime_open(shard)
        for attempt in range(MAX_ATTEMPTS):
            seq, current = await self._read_shard(subject)
            updated = dict(current)
            for action_id, added_at in changes:
                if added_at is None:
                    updated.pop(action_id, None)
                else:
                    updated.setdefault(action_id, added_at)
            if updated == current and seq:
                return  # nothing to change (a removal already made, an add already there)
            payload = encode_open_shard(updated, signer=self.signer, sender=GATEWAY_SENDER)
            headers = {"Nats-Expected-Last-Subject-Sequence": str(seq)}
            tracing.inject(headers)
            try:
                await self.js.publish(subject, payload, headers=headers)
                return
            except APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE:
                    raise
            # Another gateway wrote the shard first: read it again, after a short pause.
            await asyncio.sleep(random.uniform(0, 0.005 * (attempt + 1)))
        raise ConnectorError(
            ErrorCode.HOST_CAPACITY,
            f"the open-children shard {subject} changed under {MAX_ATTEMPTS} attempts",
        )

    async def _read_shard(self, subject: str) -> tuple[int, dict[str, int]]:
        """The shard's sequence (0: never written) and its open ids, as last written."""
        try:
            msg = await self.js.get_last_msg(self.stream, subject)
        except NotFoundError:
            return 0, {}
        return msg.seq or 0, self._decode(msg.data or b"", subject)

    def _decode(self, data: bytes, subject: str) -> dict[str, int]:
        """The open ids of a shard message; a message that is not a shard's ActionList, or
        that no gateway key signed, counts as an empty shard (logged): it is never
        believed, and the next write replaces it."""
        try:
            found, opened = decode_open_shard(data)
        except EnvelopeRejected as exc:
            log.warning("the open-children shard %s is refused: %s", subject, exc.reason)
            return {}
        verified = opened.verified
        if verified is None or self.trusted.signer_of(verified.public_key) is None:
            log.warning("the open-children shard %s is not signed by a gateway key", subject)
            return {}
        return found

    # --- reads (the recovery sweep) -----------------------------------------------------

    async def snapshot(self) -> dict[str, int]:
        """Every open child id and when it was added: the shards written since the last
        call are read again, the others come from memory."""
        state = (await self.js.stream_info(self.stream)).state
        if state.last_seq < self._read_from - 1:  # the stream was made again
            self._seen.clear()
            self._read_from = 1
        for msg in await drain(
            self.js, self.stream, self.subjects.all_runtime_open(), start_seq=self._read_from
        ):
            seq = msg.seq or 0
            self._read_from = seq + 1
            subject = msg.subject or ""
            self._seen[subject] = (seq, self._decode(msg.data or b"", subject))
        found: dict[str, int] = {}
        for _, ids in self._seen.values():
            found.update(ids)
        return found
