"""What a publisher is told when its wait for a result ends without one.

A dead-lettered Action never gets a result, so "no result within N s" alone leaves the
publisher guessing between a slow worker, no worker, and a refusal that will never be
answered. `dead_letter_of` reads the endpoint's DLQ subject (message gets only, as every
reader outside the workers does: worker/bus/stream_reads.py) for an entry of this Action:
by the sha256 of the exact envelope published when it is known (the entry's `sha256`, which
a truncated entry keeps too), otherwise by the entry's `action_id` (an authenticated
Action's) or the `id` in the kept bytes. With trusted worker keys an entry only counts when
a trusted worker signed it: anyone with publish rights on the DLQ subject could otherwise
make a running Action look refused; a message that is not an entry is skipped, and so is
the entry of an Action whose retry policy was spent (`retry`), which has a result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from subjects.grammar import Subjects
from worker.bus.stream_reads import next_stored
from worker.errors import UnverifiedResponse
from worker.trust.responses import verify_dead_letter
from worker.trust.signing import TrustedGatewayKeys

#: At most this many DLQ entries are read for one answer (the stream is bounded by
#: `AIPD_STREAM_DLQ_MAX_MSGS`; a wait that published first starts at its own publish).
MAX_SCAN = 10_000

_ID_RE = re.compile(rb'"id"\s*:\s*"(act_[0-9a-f]{32})"')


@dataclass(frozen=True, slots=True)
class DeadLetter:
    dlq_id: str
    code: str
    reason: str
    worker: str

    def describe(self, action_id: str, endpoint_id: str) -> str:
        return (
            f"refused: {action_id} was dead-lettered by worker {self.worker} ({self.code}: "
            f"{self.reason}); it will get no result (the entry: `aip-hermes-worker audit "
            f'{self.dlq_id} --endpoint {endpoint_id}`, docs/publishing.md "The dead-letter '
            'queue" says what to do per code)'
        )


async def dlq_position(js: JetStreamContext, subjects: Subjects) -> int:
    """The DLQ stream's next sequence now: an entry for an Action published after this
    call is at or above it (1 when the stream does not exist yet)."""
    try:
        info = await js.stream_info(subjects.stream_name("dlq"))
    except NatsError:  # no such stream, or this user may not ask: the scan starts at 1
        return 1
    return int(info.state.last_seq) + 1


async def dead_letter_of(
    js: JetStreamContext,
    subjects: Subjects,
    endpoint_id: str,
    action_id: str,
    *,
    envelope_sha256: str | None = None,
    from_seq: int = 1,
    trusted: TrustedGatewayKeys | None = None,
) -> DeadLetter | None:
    """The DLQ entry of this Action on `endpoint_id`, or None when there is none (in the
    first `MAX_SCAN` entries from `from_seq`)."""
    stream = subjects.stream_name("dlq")
    subject = subjects.dlq(endpoint_id)
    seq = from_seq
    for _ in range(MAX_SCAN):
        msg = await next_stored(js, stream, subject, seq)
        if msg is None:
            return None
        seq = int(msg.seq or seq) + 1
        try:
            entry, _ = verify_dead_letter(msg.data or b"", trusted)
        except UnverifiedResponse:
            continue
        if entry.retry is not None:
            continue  # a spent retry policy: that Action has its failed result too
        facts = entry.facts
        if envelope_sha256 is not None:
            if facts.sha256 != envelope_sha256:
                continue
        elif entry.action_id != action_id:
            found = _ID_RE.search(facts.kept)
            if found is None or found.group(1).decode() != action_id:
                continue
        return DeadLetter(
            dlq_id=facts.dlq_id,
            code=facts.code.value,
            reason=facts.reason,
            worker=facts.worker_id,
        )
    return None


def unknown_line(action_id: str, endpoint_id: str, timeout_s: float, exc: Exception) -> str:
    """What to say when the wait ended and the DLQ could not be read (the compose gateway
    role may not read it: docs/security.md "Roles")."""
    return (
        f"timeout: no result for {action_id} within {timeout_s:g} s; whether it was "
        f"dead-lettered is unknown: this NATS user cannot read the DLQ stream "
        f"({type(exc).__name__}); an operator can (`aip-hermes-worker audit {action_id} "
        f"--endpoint {endpoint_id}` shows a dead_lettered receipt)"
    )


def timeout_line(action_id: str, endpoint_id: str, timeout_s: float) -> str:
    """What to say when the wait ended and the Action is not in the DLQ."""
    return (
        f"timeout: no result for {action_id} within {timeout_s:g} s, and it was not "
        f"dead-lettered: a worker may still be running it (`aip-hermes-worker tail "
        f"{action_id} --endpoint {endpoint_id}`), or no worker serves endpoint "
        f"{endpoint_id!r} (`aip-hermes-worker manifest --endpoint {endpoint_id}`)"
    )
