"""Read the AIP runtime's Action queue and lifecycle records from JetStream.

Each record is an `aip.lifecycle.v1.action_status` Envelope (`worker.wire.runtime_records`).
The records are evidence, so each one must carry a valid AIP signature of a trusted
gateway/runtime key (the same key file as envelopes, whatever AIPD_ALLOW_UNSIGNED_ENVELOPES
says) and decode strictly. A missing stream
means this deployment has no authoritative resolver at all
(`delegated_result_resolver_missing`); a missing record only means "not there yet".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, TypeVar

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.lifecycle import LifecycleRecord, QueueRecord
from subjects.grammar import Subjects
from worker.errors import ConnectorError, RuntimeRecordsUnreadable
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.runtime_records import decode_lifecycle_record, decode_queue_record

log = logging.getLogger(__name__)

#: JetStream's "stream not found" API error code (as opposed to 10037, no message found).
STREAM_NOT_FOUND = 10059
MAX_RECORD_BYTES = 4 * 1024 * 1024

T = TypeVar("T", QueueRecord, LifecycleRecord)


@dataclass(frozen=True, slots=True)
class StoreRecords:
    queue: QueueRecord | None
    lifecycle: LifecycleRecord | None


class LifecycleStores(Protocol):
    async def read(self, action_id: str) -> StoreRecords:
        """Both records of one child; raises ConnectorError or RuntimeRecordsUnreadable."""
        ...

    async def check_available(self) -> None:
        """Raise `delegated_result_resolver_missing` unless both stores exist (checked before
        a delegation starts anything: a child whose result cannot be read must not run)."""
        ...


class JetStreamLifecycleStores:
    def __init__(
        self, js: JetStreamContext, subjects: Subjects, trusted: TrustedGatewayKeys | None
    ) -> None:
        self.js = js
        self.subjects = subjects
        #: The keys whose records are evidence (None: none is).
        self.trusted = trusted

    async def read(self, action_id: str) -> StoreRecords:
        s = self.subjects
        queue = await self._last(
            s.runtime_stream_name("queue"), s.runtime_queue(action_id), QueueRecord
        )
        lifecycle = await self._last(
            s.runtime_stream_name("lifecycle"), s.runtime_lifecycle(action_id), LifecycleRecord
        )
        return StoreRecords(queue, lifecycle)

    async def check_available(self) -> None:
        for kind in ("queue", "lifecycle"):
            stream = self.subjects.runtime_stream_name(kind)
            try:
                await self.js.stream_info(stream)
            except NotFoundError:
                raise _missing(stream) from None
            except Exception as exc:
                # Unknown is not missing: the resolver's own reads will retry.
                log.info("runtime store %s not checked: %s", stream, exc)

    async def _last(self, stream: str, subject: str, typ: type[T]) -> T | None:
        try:
            msg = await self.js.get_last_msg(stream, subject)
        except NotFoundError as exc:
            if exc.err_code == STREAM_NOT_FOUND:
                raise _missing(stream) from None
            return None
        except Exception as exc:
            log.info("runtime store %s unreadable: %s", stream, exc)
            raise RuntimeRecordsUnreadable(str(exc)) from None
        return decode_record(msg.data or b"", typ, self.trusted, what=stream)


def _missing(stream: str) -> ConnectorError:
    return ConnectorError(
        ErrorCode.DELEGATED_RESULT_RESOLVER_MISSING,
        f"the AIP runtime store {stream} does not exist on this NATS; no authoritative child "
        "result can be read",
    )


def decode_record(data: bytes, typ: type[T], trusted: TrustedGatewayKeys | None, *, what: str) -> T:
    """A signed, strictly decoded store record; anything else is a result-integrity failure."""
    integrity = ErrorCode.DELEGATED_RESULT_INTEGRITY
    if len(data) > MAX_RECORD_BYTES:
        raise ConnectorError(integrity, f"a {what} record is over {MAX_RECORD_BYTES} bytes")
    decode = decode_queue_record if typ is QueueRecord else decode_lifecycle_record
    try:
        record, opened = decode(data, max_bytes=MAX_RECORD_BYTES)
    except EnvelopeRejected as exc:
        if exc.code is ErrorCode.HOST_AUTHENTICATION:
            raise ConnectorError(
                integrity, f"a {what} record is not signed by a trusted runtime key"
            ) from None
        raise ConnectorError(integrity, f"a {what} record does not parse: {exc.reason}") from None
    verified = opened.verified
    if verified is None or trusted is None or trusted.signer_of(verified.public_key) is None:
        raise ConnectorError(integrity, f"a {what} record is not signed by a trusted runtime key")
    assert isinstance(record, typ)
    return record
