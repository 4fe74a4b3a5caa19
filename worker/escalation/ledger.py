"""Reading escalations from their stream, and the write-once record of each resolution.

The stream is the list (one `aip.core.v1.escalation` Envelope per escalation, `Nats-Msg-Id`
= its id; `worker.wire.escalations`), but only what a trusted worker signed is on it as far
as a reader is concerned: anyone with publish rights on the subject can append a message, so
`read_escalations` verifies each Envelope's signature against the trusted worker keys and
sets aside (by the id it claims, with the reason) every one that does not verify; those are
never listed, shown or resolved. Redis holds the authority on whether one was resolved:
`SET NX` on `aip:escalations:{esc_…}:resolution`, so two people resolving the same
escalation cannot both win. The resolution is then copied to the stream
(`…escalations.resolved`, an `escalation_resolution` Envelope signed by the person who
resolved it) so `escalations list` needs only NATS; a copy that is unsigned (with trusted
keys set) or whose signature does not verify is counted as unreadable and never shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.js import JetStreamContext

from schemas.errors import EnvelopeRejected
from schemas.escalation import Escalation, EscalationResolution, ResumeClaim
from subjects.grammar import Subjects
from worker.aip.canonical import loads
from worker.aip.errors import MalformedJson
from worker.bus.stream_reads import drain
from worker.errors import UnverifiedResponse
from worker.store.keys import escalation_resolution_key, escalation_resume_key
from worker.trust.responses import read_resolution_copy, verify_escalation
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.envelopes import DEFAULT_MAX_ENVELOPE_BYTES
from worker.wire.escalations import escalation_id_of

#: Resolutions are kept as long as the escalations stream keeps escalations.
RESOLUTION_TTL_MS = 30 * 86_400_000
#: A bound on what one `list` reads (the stream's retention is the real limit).
MAX_READ = 100_000

_resolution_decoder = msgspec.json.Decoder(EscalationResolution)


@dataclass(slots=True)
class EscalationView:
    escalation: Escalation
    resolution: EscalationResolution | None = None

    @property
    def open(self) -> bool:
        return self.resolution is None


@dataclass(slots=True)
class Unreadable:
    """Messages on the escalation subjects that are not the published shapes (counted,
    never guessed at)."""

    count: int = 0
    #: Escalations no trusted worker signed (forged, unsigned, or signed by an untrusted
    #: key), by the id they claim, with why; ignored by every reader.
    unverified: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.count + len(self.unverified)


#: `(stream sequence, data)` of one stored message (an Envelope carries its own signature).
Stored = tuple[int, bytes]


async def read_subject(js: JetStreamContext, subject: str) -> list[Stored]:
    """Every message stored on `subject`, oldest first."""
    return await read_subject_from(js, subject)


async def read_subject_from(
    js: JetStreamContext,
    subject: str,
    *,
    stream: str | None = None,
    start_seq: int = 1,
    limit: int = MAX_READ,
) -> list[Stored]:
    """`(stream sequence, data)` of the messages on `subject` from `start_seq`, oldest
    first, at most `limit` of them. Message gets
    only (worker/bus/stream_reads.py): the roles that read escalations (the workers' gauge,
    the gateway credential's `escalations` commands) may create no consumer. `stream`
    unset: looked up by subject."""
    stream = stream or await js.find_stream_name_by_subject(subject)
    return [
        (msg.seq or 0, msg.data or b"")
        for msg in await drain(js, stream, subject, start_seq=start_seq, limit=limit)
    ]


def believe_escalation(
    data: bytes,
    trusted: TrustedGatewayKeys | None,
    unreadable: Unreadable,
) -> Escalation | None:
    """The escalation in one stored Envelope when a trusted worker signed it (or, with no
    trusted keys, when it decodes); else None, with the message counted in `unreadable`:
    by the escalation id its `message_id` claims when it names one, else as a count."""
    try:
        return verify_escalation(data, trusted)
    except UnverifiedResponse as exc:
        claimed = _claimed_id(data)
        if claimed is None:
            unreadable.count += 1
        else:
            unreadable.unverified.setdefault(claimed, str(exc))
    return None


def _claimed_id(data: bytes) -> str | None:
    """The escalation id an Envelope's `message_id` names, if it parses and names one."""
    if len(data) > DEFAULT_MAX_ENVELOPE_BYTES:
        return None
    try:
        envelope = loads(data)
    except MalformedJson:
        return None
    message_id = envelope.get("message_id") if isinstance(envelope, dict) else None
    if not isinstance(message_id, str):
        return None
    try:
        return escalation_id_of(message_id)
    except EnvelopeRejected:
        return None


async def read_escalations(
    js: JetStreamContext,
    subjects: Subjects,
    endpoint_id: str,
    unreadable: Unreadable,
    *,
    trusted: TrustedGatewayKeys | None,
) -> list[EscalationView]:
    """Every escalation of an endpoint still on the stream that a trusted worker signed
    (`trusted` None: every one that decodes, development only), with its resolution copy
    if a signed one is on the stream (`trusted` None: an unsigned one too)."""
    views: dict[str, EscalationView] = {}
    for _, data in await read_subject(js, subjects.escalations(endpoint_id)):
        escalation = believe_escalation(data, trusted, unreadable)
        if escalation is not None:
            views.setdefault(escalation.escalation_id, EscalationView(escalation))
    for escalation_id in views:
        unreadable.unverified.pop(escalation_id, None)  # a trusted copy is on the stream
    for _, data in await read_subject(js, subjects.escalation_resolutions(endpoint_id)):
        try:
            resolution = read_resolution_copy(data, signed=trusted is not None)
        except UnverifiedResponse:
            unreadable.count += 1
            continue
        view = views.get(resolution.escalation_id)
        if view is not None and view.resolution is None:
            view.resolution = resolution
    return list(views.values())


async def record_resolution(redis: Any, resolution: EscalationResolution) -> EscalationResolution:
    """Write `resolution` once; returns what is stored (the first writer's, on a race)."""
    key = escalation_resolution_key(resolution.escalation_id)
    written = await redis.set(key, msgspec.json.encode(resolution), nx=True, px=RESOLUTION_TTL_MS)
    if written:
        return resolution
    stored = await read_resolution(redis, resolution.escalation_id)
    if stored is None:  # expired between the two commands: it was resolved long ago
        raise RuntimeError("the stored resolution vanished; read it again")
    return stored


async def claim_resume(redis: Any, claim: ResumeClaim) -> ResumeClaim:
    """Open `claim` once for its escalation; returns what is stored (the first writer's,
    on a race), so every approver of a quorum decides on the same resume."""
    key = escalation_resume_key(claim.escalation_id)
    written = await redis.set(key, msgspec.json.encode(claim), nx=True, px=RESOLUTION_TTL_MS)
    if written:
        return claim
    raw = await redis.get(key)
    if raw is None:  # expired between the two commands: it was opened long ago
        raise RuntimeError("the stored resume claim vanished; run again")
    data = raw if isinstance(raw, bytes) else str(raw).encode()
    return msgspec.json.decode(data, type=ResumeClaim)


async def read_resolution(redis: Any, escalation_id: str) -> EscalationResolution | None:
    raw = await redis.get(escalation_resolution_key(escalation_id))
    if raw is None:
        return None
    return _resolution_decoder.decode(raw if isinstance(raw, bytes) else str(raw).encode())


async def read_resolutions(
    redis: Any, escalation_ids: Sequence[str]
) -> list[EscalationResolution | None]:
    """Each escalation's write-once resolution (None: open), in one pipelined round trip:
    Redis decides, never the copy on `…escalations.resolved`."""
    if not escalation_ids:
        return []
    pipe = redis.pipeline(transaction=False)
    for escalation_id in escalation_ids:
        pipe.get(escalation_resolution_key(escalation_id))
    stored = await pipe.execute()
    return [
        None
        if raw is None
        else _resolution_decoder.decode(raw if isinstance(raw, bytes) else str(raw).encode())
        for raw in stored
    ]
