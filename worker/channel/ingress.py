"""Channel ingress: the messages of followed Hermes sessions, each published once on the bus.

Every worker runs a follower per session of `AIPD_CHANNEL_INGRESS_FILE`; only the one
holding the session's Redis lease reads. Each poll `GET /api/sessions/{id}/messages`
(Hermes has no paging and no cursor), keeps the messages past the cursor, validates each
strictly into a `ChannelMessage` and publishes it on `aip.hermes.{endpoint}.inbound.{session}`
as a signed `aip.channel.v1.message_created` Envelope (`worker.wire.channels`) under
`Nats-Msg-Id` `{endpoint}:{message_id}`, then advances the cursor in Redis (a
compare-and-set that only the lease owner can make).

Exactly once on the bus across crashes: the cursor is `max(Redis cursor, id of the last
message on the session's subject)`, so a follower that published and died before writing
the cursor is not repeated by the next one, inside or outside the duplicate window. A
follower whose lease may have lapsed (a pause) stops before publishing.

The cursor is bounded by what followers produced, never by what anyone can put on the
subject: the stream's last message counts only when it is a follower's Envelope for this
session, signed by a trusted worker key (every message a follower publishes is signed,
`BusPublisher.channel_message`), and it names an id Hermes returned in this poll. A message
forged on the subject (say Hermes id 10^12, unsigned or signed by another key) is ignored,
so it cannot freeze the session; readers verify the same signature
(`AipClient.session_messages`).

Hostile content is typed, never guessed: content over 64 KiB is cut and flagged
(`content_truncated`, `content_bytes`); a message of another shape (unknown role, a
non-string content, a missing id) is dead-lettered on `aip.hermes.{endpoint}.dlq` with its
raw JSON and `schema.envelope.invalid`, counted, and passed; a body that is not JSON fails
the poll, which is retried with nothing advanced.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from schemas.channel import (
    MAX_INGRESS_CONTENT_BYTES,
    ChannelMessage,
    ChannelRole,
)
from schemas.errors import EnvelopeRejected, ErrorCode
from subjects.grammar import Subjects
from worker import faults
from worker.bus.dead_letters import DeadLetters, Kept
from worker.bus.publisher import BusPublisher
from worker.channel.redaction import scrub, scrub_text
from worker.channel.rules import IngressTarget
from worker.errors import ChannelMessageRefused, ConnectorError, UnverifiedResponse
from worker.metrics import Metrics
from worker.store.clock import now_ms
from worker.store.ingress_store import IngressStore
from worker.store.keys import IngressKeys
from worker.trust.responses import check_worker_signed
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.channels import decode_inbound

log = logging.getLogger(__name__)


def to_channel_message(
    raw: Any, target: IngressTarget, published_at_unix_ms: int
) -> ChannelMessage:
    """The typed message, or ChannelMessageRefused naming the field; content is bounded,
    never guessed."""
    if not isinstance(raw, dict):
        raise ChannelMessageRefused("a message is not a JSON object")
    message_id = raw.get("id")
    if not isinstance(message_id, int) or isinstance(message_id, bool) or message_id < 0:
        raise ChannelMessageRefused("`id` is not a non-negative integer")
    role = raw.get("role")
    if role not in ChannelRole._value2member_map_:
        raise ChannelMessageRefused(f"message {message_id}: unknown role")
    content = raw.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ChannelMessageRefused(f"message {message_id}: `content` is not a string")
    # Credentials go no further than the session (worker/channel/redaction.py).
    content = scrub_text(content)
    encoded = content.encode()
    truncated = len(encoded) > MAX_INGRESS_CONTENT_BYTES
    if truncated:
        content = encoded[:MAX_INGRESS_CONTENT_BYTES].decode("utf-8", errors="ignore")
        content = content[:MAX_INGRESS_CONTENT_BYTES]

    def short(name: str) -> str | None:
        value = raw.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not 1 <= len(value) <= 512:
            raise ChannelMessageRefused(f"message {message_id}: `{name}` is not a short string")
        return value

    timestamp = raw.get("timestamp")
    if timestamp is not None and (
        not isinstance(timestamp, int | float) or isinstance(timestamp, bool)
    ):
        raise ChannelMessageRefused(f"message {message_id}: `timestamp` is not a number")
    try:
        return ChannelMessage(
            endpoint_id=target.endpoint_id,
            session_id=target.session_id,
            message_id=message_id,
            role=ChannelRole(str(role)),
            content=content,
            content_truncated=truncated,
            content_bytes=len(encoded),
            tool_name=short("tool_name"),
            tool_call_id=short("tool_call_id"),
            finish_reason=short("finish_reason"),
            timestamp=float(timestamp) if timestamp is not None else None,
            published_at_unix_ms=published_at_unix_ms,
        )
    except msgspec.ValidationError as exc:  # pragma: no cover - every field checked above
        raise ChannelMessageRefused(f"message {message_id}: {exc}") from None


class SessionFollower:
    """Follows one session while it holds that session's lease (one per worker and session)."""

    def __init__(
        self,
        target: IngressTarget,
        *,
        hermes: Any,
        store: IngressStore,
        js: JetStreamContext,
        subjects: Subjects,
        publisher: BusPublisher,
        metrics: Metrics,
        worker_id: str,
        lease_ttl_ms: int,
        trusted: TrustedGatewayKeys | None = None,
        dead_letters: DeadLetters,
    ) -> None:
        self.target = target
        #: The worker's DLQ writer: truncated entries, rate-limited per session subject.
        self.dead_letters = dead_letters
        self.hermes = hermes
        self.store = store
        self.js = js
        self.subjects = subjects
        self.publisher = publisher
        self.metrics = metrics
        self.worker_id = worker_id
        self.owner = f"{worker_id}#{secrets.token_hex(6)}"
        self.lease_ttl_ms = lease_ttl_ms
        self.keys = IngressKeys.of(target.endpoint_id, target.session_id)
        self.subject = subjects.inbound(target.endpoint_id, target.session_id)
        #: Monotonic time of the last successful lease write (the local validity check).
        self._held_at: float | None = None
        #: The worker keys whose messages on the subject move the cursor (None: this
        #: worker publishes unsigned, development only; the Hermes bound still applies).
        self.trusted = trusted
        #: The stream sequence of the last message on the subject found not to be ours
        #: (logged once, not at every poll).
        self._ignored_seq: int | None = None

    async def run(self) -> None:
        """Never raises: a failing poll is logged, and the next one tries again."""
        interval_s = self.target.poll_interval_ms / 1000
        while True:
            try:
                if await self._hold():
                    await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.channel_ingress_error(self.target.endpoint_id, type(exc).__name__)
                log.warning(
                    "ingress of %s/%s failed: %s",
                    self.target.endpoint_id,
                    self.target.session_id,
                    exc.message if isinstance(exc, ConnectorError) else type(exc).__name__,
                )
            await asyncio.sleep(min(interval_s, self.lease_ttl_ms / 3000))

    async def release(self) -> None:
        try:
            await self.store.release(self.keys, self.owner)
        except Exception:
            log.debug("ingress lease release failed", exc_info=True)

    async def _hold(self) -> bool:
        held = await self.store.hold(self.keys, self.owner, self.lease_ttl_ms)
        self._held_at = time.monotonic() if held else None
        return held

    def _still_valid(self) -> bool:
        """Renewed within 80 % of the TTL: a follower resumed after a pause stops here."""
        return (
            self._held_at is not None
            and (time.monotonic() - self._held_at) * 1000 < self.lease_ttl_ms * 0.8
        )

    async def cursor(self, read_up_to: int = -1) -> int:
        """The last message id on the bus: the larger of Redis' cursor and the id of the
        stream's last message when a follower produced it (signed by a trusted worker key,
        for this session, and at most `read_up_to`, the largest id Hermes returned)."""
        cursor = await self.store.cursor(self.keys)
        try:
            last = await self.js.get_last_msg(self.subjects.stream_name("inbound"), self.subject)
        except NotFoundError:
            return cursor
        on_stream = self._published_id(last.data or b"", read_up_to)
        if on_stream is None:
            if self._ignored_seq != last.seq:
                self._ignored_seq = last.seq
                log.warning(
                    "ingress of %s/%s: the last message on %s (stream seq %s) was not "
                    "published by a follower; the cursor ignores it",
                    self.target.endpoint_id,
                    self.target.session_id,
                    self.subject,
                    last.seq,
                )
            return cursor
        return max(cursor, on_stream)

    def _published_id(self, data: bytes, read_up_to: int) -> int | None:
        """The Hermes id of `data` when a follower published it, else None."""
        try:
            message, opened = decode_inbound(data)
            if self.trusted is not None:
                check_worker_signed(opened, self.trusted, what="channel message")
        except (EnvelopeRejected, UnverifiedResponse):
            return None
        if (message.endpoint_id, message.session_id) != (
            self.target.endpoint_id,
            self.target.session_id,
        ) or message.message_id > read_up_to:
            return None
        return message.message_id

    async def poll(self) -> None:
        target = self.target
        response = await self.hermes.request_json(
            "GET", "/api/sessions/{session_id}/messages", {"session_id": target.session_id}
        )
        body = response.body
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ConnectorError(
                ErrorCode.TRANSPORT, "GET /api/sessions/{session_id}/messages: no `data` list"
            )
        cursor = await self.cursor(max((_order(m) for m in data), default=-1))
        fresh = sorted(
            (m for m in data if (found := _id_of(m)) is None or found > cursor), key=_order
        )
        if not fresh:
            self.metrics.channel_ingress_lag(target.endpoint_id, target.session_id, 0.0)
            return
        oldest = next((m.get("timestamp") for m in fresh if isinstance(m, dict)), None)
        if isinstance(oldest, int | float):
            self.metrics.channel_ingress_lag(
                target.endpoint_id, target.session_id, max(0.0, time.time() - float(oldest))
            )
        for raw in fresh:
            message_id = _id_of(raw)
            if message_id is None:
                # Without an id there is no cursor to move past it: refuse it once per poll.
                await self._refuse(raw, "a message without a usable `id`", None)
                continue
            if not self._still_valid():
                return
            try:
                message = to_channel_message(raw, target, now_ms())
            except ChannelMessageRefused as exc:
                await self._refuse(raw, str(exc), message_id)
            else:
                await self.publisher.channel_message(self.subject, message)
                self.metrics.channel_ingress_published(target.endpoint_id)
            faults.hit("after_ingress_publish", f"{target.session_id}:{message_id}")
            if not await self.store.advance(self.keys, self.owner, message_id):
                self._held_at = None
                return  # another follower owns the session now
        self.metrics.channel_ingress_lag(target.endpoint_id, target.session_id, 0.0)

    async def _refuse(self, raw: Any, reason: str, message_id: int | None) -> None:
        """Keep a refused message in the DLQ, count it, and go on: through the worker's DLQ
        writer (worker/bus/dead_letters.py), so it is cut to `AIPD_DLQ_KEEP_BYTES` and the
        entries per session pass the same token bucket as refused envelopes, and with its
        credentials redacted like what is published (a hostile provider's id-less 192 KB
        messages, once per poll, wrote 190 MB of DLQ in 40 s before, issue 27)."""
        target = self.target
        payload = msgspec.json.encode(_redacted(raw))
        seed = f"ingress:{target.endpoint_id}:{target.session_id}:{message_id}:"
        dlq_id = "dlq_" + hashlib.sha256(seed.encode() + payload).hexdigest()[:32]
        if message_id is not None and not self._still_valid():
            return
        self.metrics.channel_ingress_refused(target.endpoint_id)
        kept = await self.dead_letters.write(
            target.endpoint_id,
            dlq_id=dlq_id,
            subject=self.subject,
            stream_seq=message_id if message_id is not None else -1,
            payload=payload,
            code=ErrorCode.SCHEMA_ENVELOPE_INVALID,
            reason=reason,
        )
        if kept is Kept.WRITTEN:  # the DLQ writer logs what it does not keep, bounded
            log.warning(
                "ingress of %s/%s refused a message: %s",
                target.endpoint_id,
                target.session_id,
                reason,
            )


def _redacted(raw: Any) -> Any:
    """A refused message as the DLQ keeps it: credential-named keys and the credentials
    in its text content redacted (worker/channel/redaction.py)."""
    kept = scrub(raw)
    if isinstance(kept, dict) and isinstance(kept.get("content"), str):
        kept["content"] = scrub_text(kept["content"])
    return kept


def _order(raw: Any) -> int:
    found = _id_of(raw)
    return -1 if found is None else found


def _id_of(raw: Any) -> int | None:
    if not isinstance(raw, dict):
        return None
    value = raw.get("id")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


async def start_followers(
    targets: tuple[IngressTarget, ...], endpoints: dict[str, Any], **shared: Any
) -> list[SessionFollower]:
    """One follower per target; a session that does not exist refuses the start (exit 2)."""
    from worker.errors import ChannelConfigError

    followers = []
    for target in targets:
        hermes = endpoints[target.endpoint_id].hermes
        try:
            await hermes.request_json(
                "GET", "/api/sessions/{session_id}", {"session_id": target.session_id}
            )
        except ConnectorError as exc:
            if exc.remote_status == 404:
                raise ChannelConfigError(
                    f"AIPD_CHANNEL_INGRESS_FILE: session {target.session_id!r} does not exist "
                    f"on endpoint {target.endpoint_id!r}"
                ) from None
            raise OSError(
                f"cannot check session {target.session_id!r} on endpoint "
                f"{target.endpoint_id!r}: {exc.code.value}"
            ) from None
        followers.append(SessionFollower(target, hermes=hermes, **shared))
    return followers
