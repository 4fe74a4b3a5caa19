"""The checker: what must hold over a campaign's history, Hermes' request log and the bus.

It reads only evidence the system cannot edit after the fact: the fake Hermes' log of every
request that reached it, the result, chunk and receipt streams as JetStream holds them
after every fault has healed, each Action's lease record in Redis, and the client's own
history. Each rule is one function returning `Violation`s; `check` runs them all.

The rules (docs/reliability.md lists them with the guarantee each one tests):

* `start_once`: at most one `POST /v1/runs` per operator objective (guarantees.md, 1).
* `unsafe_once`: at most one `POST /v1/chat/completions` per chat Action.
* `approval_once`: at most one approval sent per run and prompt generation (every prompt
  of this workload is its run's first and only one, so: per run).
* `one_result`: every Action JetStream acknowledged has exactly one result on the results
  stream: not none (lost), not two (different results), not the same one twice.
* `honest`: a result that says it is certain nothing happened, while its request reached
  Hermes, lies (an objective's start, a chat's completion, a resume's approval: a resume
  judged per source, since Hermes' log cannot tell two resumes of one prompt apart, and the
  one that sent the approval must not end certain); a completed one whose request never
  reached Hermes invents. Hermes' own refusals are certain and excepted.
* `fence`: a result's fence is the Action's last fence (the lease record's), and the
  worker that settled it acquired the lease at that fence: no result from a superseded
  owner.
* `fences_unique`: no fence was granted twice (two acquisitions receipts at one fence by
  different owners), and none above the lease record's.
* `fence_order`: fences only increase. An Action's `lease_acquired` receipts, in stream
  order, carry strictly increasing fences. Receipts are sent after the grant and may be held
  in flight (a paused or cut-off worker), so one that lands late is excused only when the
  Redis grant order is on record: it is the first receipt of its fence, and the grant of the
  next fence names its worker as the previous owner (or found the lease released).
* `signed_only`: no approval or cancel takes effect that its authority did not sign. The
  workload forges some (an approval signed by a key the authority does not name, or with no
  signature; a cancel signed by an untrusted key, or unsigned), each on a target no genuine
  one touches: Hermes must see no approval for the forged resumes' run and no stop for the
  forged cancels' run, no forged resume may complete, and no forged-cancelled Action may end
  `cancelled`.
* `delegation`: each delegation through the gateway (`aip_call`, once or retried) has
  exactly one child Action: every answer names the child's namespaced id, and that child
  has exactly one result (`one_result`, the gateway's answer counting as the
  acknowledgement), which the trusted worker keys verify.
* `chunks`: an Action of a non-streaming capability (`models`, the delegated read) has no
  chunk at all: its result names none and its chunk subject holds none. For a streaming
  one (an objective, a resume, a chat turn), the chain the result vouches for (walked back
  from the terminal chunk its `last_chunk_sha256` names, through `prev_sha256`) is on the
  stream, gap-free from seq 0, with exactly one terminal chunk, its last; and a consumer
  reading the stream through the project's reader (`ActionHandle.chunks`'
  `ChunkSequencer`, in stream order, as a live reader meets it) gets exactly that chain,
  without an error: with `verified_only`, and streaming once it applies the reader's
  retractions. Any other chunk on the subject is a violation, except a non-terminal chunk
  whose `AIP-Chunk-Mac` verifies under the chain key of a fence the settle superseded: a
  superseded owner's late chunk (docs/reliability.md bug 2), which the reader keeps from
  the consumer; those are counted (`late_chunks`), not violations.
* `durable`: every result the client saw during the campaign is still on the stream after
  the faults healed (nothing acknowledged by JetStream was lost).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.audit import Receipt, ReceiptEvent
from schemas.errors import EnvelopeRejected
from schemas.result import ActionResult, ResultStatus
from tests.aip_wire import chunk_view
from tests.chaos.history import History
from worker.errors import UnverifiedResponse
from worker.execution.chunk_chain import mac_is_valid
from worker.operations.catalog import STREAMING
from worker.trust.responses import ChunkRetraction, ChunkSequencer
from worker.wire.results import decode_result

START = "POST /v1/runs"
APPROVAL = "POST /v1/runs/{run_id}/approval"
STOP = "POST /v1/runs/{run_id}/stop"
CHAT = "POST /v1/chat/completions"
TERMINAL_KINDS = ("done", "error")
_HERMES = "connector.hermes_agent."
#: Certain failures that Hermes itself answered (a refusal: nothing happened there), so they
#: may follow a request that reached it; by the kind of Action (`honest`).
REFUSED_BY_HERMES: dict[str, frozenset[str]] = {
    "objective": frozenset({_HERMES + "operator_start_rejected"}),
    "chat": frozenset(
        _HERMES + code for code in ("remote_rejected", "remote_temporary", "authentication")
    ),
    "resume": frozenset(
        _HERMES + code
        for code in (
            "remote_rejected",
            "remote_temporary",
            "authentication",
            "operator_run_not_active",
            "approval_choice_not_offered",
        )
    ),
}
REFUSED_BY_HERMES["approval_objective"] = REFUSED_BY_HERMES["objective"]


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    action_id: str | None
    message: str
    #: Set when the violation is a known, reported product bug that is not fixed yet
    #: (docs/reliability.md, "Bugs found"): reported and counted apart, so the campaign
    #: still fails on anything else. No rule marks one today.
    known: str | None = None

    def __str__(self) -> str:
        tag = f" ({self.known})" if self.known else ""
        return f"[{self.rule}] {self.action_id or '-'}: {self.message}{tag}"


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the fake Hermes logged it (route template, parsed body)."""

    route: str
    run_id: str | None
    body: Any
    at: float


@dataclass
class PlannedAction:
    """What the workload published: its kind and operation, and for a resume the objective
    it answers."""

    action_id: str
    #: read | objective | approval_objective | resume | forged_resume | chat | delegation
    #: (a delegation's id is its child's bus id)
    kind: str
    source_id: str | None = None
    #: The capability's operation (`models`, `operator`, `chat_stream`, …): whether the
    #: Action has a chunk stream at all (`streaming`).
    operation: str = field(kw_only=True)

    @property
    def streaming(self) -> bool:
        """Only a streaming capability's Action publishes chunks (as upstream AIP): any
        other one's signed result is its whole answer and names no chunk."""
        return self.operation in STREAMING


@dataclass
class Evidence:
    actions: dict[str, PlannedAction]
    #: Action ids whose publish JetStream acknowledged (a PubAck came back).
    acked: set[str]
    results: dict[str, list[bytes]] = field(default_factory=dict)
    chunks: dict[str, list[bytes]] = field(default_factory=dict)
    #: Each chunk's `AIP-Chunk-Mac` header (None: none), in the same order as `chunks`.
    chunk_macs: dict[str, list[str | None]] = field(default_factory=dict)
    #: Each Action's receipts in audit-stream order (oldest first).
    receipts: dict[str, list[Receipt]] = field(default_factory=dict)
    leases: dict[str, dict[str, str]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    history: History = field(default_factory=History)
    #: Each operator Action's Hermes run id, from its binding in Redis (when it has one).
    runs: dict[str, str] = field(default_factory=dict)
    #: Actions the workload sent only forged or unsigned cancels (never a genuine one).
    forged_cancels: set[str] = field(default_factory=set)
    #: Delegated children with a result on the stream that the trusted worker keys do not
    #: verify, and why (`AipClient.believe_result`).
    unverified: dict[str, str] = field(default_factory=dict)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _operator_action_id(request: Request) -> str | None:
    if not isinstance(request.body, dict):
        return None
    raw = request.body.get("input")
    try:
        document = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    found = document.get("operator_action_id") if isinstance(document, dict) else None
    return found if isinstance(found, str) else None


def _chat_action_ids(request: Request, known: Iterable[str]) -> list[str]:
    text = json.dumps(request.body)
    return [action_id for action_id in known if action_id in text]


def decoded_result(raw: bytes) -> ActionResult | None:
    """The result an Envelope on a results subject carries (None: not one)."""
    try:
        return decode_result(raw)[0]
    except EnvelopeRejected:
        return None


def start_once(ev: Evidence) -> list[Violation]:
    starts = Counter(_operator_action_id(r) for r in ev.requests if r.route == START)
    return [
        Violation("start_once", action_id, f"{count} POST /v1/runs for one operator Action")
        for action_id, count in starts.items()
        if action_id is not None and count > 1
    ]


def unsafe_once(ev: Evidence) -> list[Violation]:
    chats = [a.action_id for a in ev.actions.values() if a.kind == "chat"]
    sent: Counter[str] = Counter()
    for request in ev.requests:
        if request.route == CHAT:
            sent.update(_chat_action_ids(request, chats))
    return [
        Violation("unsafe_once", action_id, f"{count} POST /v1/chat/completions for one Action")
        for action_id, count in sent.items()
        if count > 1
    ]


def approval_once(ev: Evidence) -> list[Violation]:
    sent = Counter(r.run_id for r in ev.requests if r.route == APPROVAL)
    return [
        Violation("approval_once", None, f"{count} approvals sent to run {run_id} (one prompt)")
        for run_id, count in sent.items()
        if count > 1
    ]


def one_result(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for action_id in sorted(ev.acked):
        copies = ev.results.get(action_id, [])
        distinct = set(copies)
        if not copies:
            out.append(Violation("one_result", action_id, "acknowledged, but no result: lost"))
        elif len(distinct) > 1:
            summary = [
                (r.settled_by, r.fence, r.status.value)
                for r in filter(None, map(decoded_result, distinct))
            ]
            out.append(Violation("one_result", action_id, f"two different results: {summary}"))
        elif len(copies) > 1:
            out.append(Violation("one_result", action_id, f"one result published {len(copies)}x"))
    return out


def _certain_failure(result: ActionResult, kind: str) -> bool:
    """Failed with `uncertain_outcome: false`, other than by a refusal Hermes answered."""
    error = result.error
    return (
        result.status is ResultStatus.FAILED
        and error is not None
        and not error.uncertain_outcome
        and error.code.value not in REFUSED_BY_HERMES[kind]
    )


def _sent_per_action(ev: Evidence) -> Counter[str]:
    """Requests that reached Hermes for each objective (its start) and chat (its turn)."""
    sent: Counter[str] = Counter(
        a for a in (_operator_action_id(r) for r in ev.requests if r.route == START) if a
    )
    chats = [a.action_id for a in ev.actions.values() if a.kind == "chat"]
    for request in ev.requests:
        if request.route == CHAT:
            sent.update(_chat_action_ids(request, chats))
    return sent


def honest(ev: Evidence) -> list[Violation]:
    sent = _sent_per_action(ev)
    out: list[Violation] = []
    for action_id, planned in ev.actions.items():
        if planned.kind not in ("objective", "approval_objective", "chat"):
            continue
        what = "chat turn(s)" if planned.kind == "chat" else "start(s)"
        for result in filter(None, map(decoded_result, set(ev.results.get(action_id, [])))):
            error = result.error
            if sent[action_id] and _certain_failure(result, planned.kind) and error is not None:
                out.append(
                    Violation(
                        "honest",
                        action_id,
                        f"certain failure {error.code.value} although {sent[action_id]} "
                        f"{what} reached Hermes: {error.message}",
                    )
                )
            if result.status is ResultStatus.COMPLETED and not sent[action_id]:
                out.append(
                    Violation("honest", action_id, f"completed, but no {what} reached Hermes")
                )
    return out + _honest_resumes(ev)


def _honest_resumes(ev: Evidence) -> list[Violation]:
    """An approval reached the source's run, yet every resume of it ended certain: the one
    that sent it claims nothing happened."""
    approvals = Counter(r.run_id for r in ev.requests if r.route == APPROVAL)
    resumes: dict[str, list[str]] = defaultdict(list)
    for planned in ev.actions.values():
        if planned.kind == "resume" and planned.source_id is not None:
            resumes[planned.source_id].append(planned.action_id)
    out: list[Violation] = []
    for source_id, ids in resumes.items():
        run_id = ev.runs.get(source_id)
        if run_id is None or not approvals[run_id]:
            continue
        settled = [
            result
            for action_id in ids
            for result in filter(None, map(decoded_result, set(ev.results.get(action_id, []))))
        ]
        if len(settled) >= len(ids) and all(_certain_failure(r, "resume") for r in settled):
            codes = sorted(r.error.code.value for r in settled if r.error is not None)
            out.append(
                Violation(
                    "honest",
                    ids[0],
                    f"{approvals[run_id]} approval(s) reached run {run_id} of {source_id}, "
                    f"but every resume of it failed certain: {codes}",
                )
            )
    return out


def _acquisitions(receipts: list[Receipt]) -> list[Receipt]:
    return [r for r in receipts if r.event is ReceiptEvent.LEASE_ACQUIRED]


def fence(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for action_id, copies in ev.results.items():
        lease = ev.leases.get(action_id) or {}
        last = int(lease["fence"]) if lease.get("fence") else None
        acquired = _acquisitions(ev.receipts.get(action_id, []))
        highest = max([r.fence for r in acquired] + ([last] if last is not None else []), default=0)
        for raw in set(copies):
            result = decoded_result(raw)
            if result is None or result.fence == 0:
                continue  # refused before any lease: no fence to supersede
            if result.fence < highest:
                out.append(
                    Violation(
                        "fence",
                        action_id,
                        f"result settled by {result.settled_by} at fence {result.fence}, "
                        f"superseded by fence {highest}",
                    )
                )
            holders = {r.worker_id for r in acquired if r.fence == result.fence}
            if acquired and holders and result.settled_by not in holders:
                out.append(
                    Violation(
                        "fence",
                        action_id,
                        f"result settled by {result.settled_by} at fence {result.fence}, "
                        f"which {sorted(holders)} acquired",
                    )
                )
    return out


def fences_unique(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for action_id, receipts in ev.receipts.items():
        by_fence: dict[int, set[str]] = defaultdict(set)
        for r in _acquisitions(receipts):
            by_fence[r.fence].add(r.worker_id)
        for granted, workers in by_fence.items():
            if len(workers) > 1:
                out.append(
                    Violation(
                        "fences_unique", action_id, f"fence {granted} granted to {sorted(workers)}"
                    )
                )
        lease = ev.leases.get(action_id) or {}
        if lease.get("fence") and by_fence and max(by_fence) > int(lease["fence"]):
            out.append(
                Violation(
                    "fences_unique",
                    action_id,
                    f"fence {max(by_fence)} granted, lease record says {lease['fence']}",
                )
            )
    return out


def delegation(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for planned in ev.actions.values():
        if planned.kind != "delegation":
            continue
        child = planned.action_id
        named = {
            e.detail.get("child")
            for e in ev.history.about(child)
            if e.type == "ok" and e.op == "delegate"
        }
        if named - {child}:
            out.append(
                Violation(
                    "delegation",
                    child,
                    f"the gateway answered one delegation with children {sorted(map(str, named))}",
                )
            )
        if child in ev.unverified:
            out.append(
                Violation(
                    "delegation",
                    child,
                    f"the child's result does not verify: {ev.unverified[child]}",
                )
            )
    return out


def fence_order(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for action_id, receipts in ev.receipts.items():
        acquired = _acquisitions(receipts)
        seen: set[int] = set()
        highest = 0
        for receipt in acquired:
            if receipt.fence <= highest and not (
                receipt.fence not in seen and _granted_before_next(acquired, receipt)
            ):
                out.append(
                    Violation(
                        "fence_order",
                        action_id,
                        f"fence {receipt.fence} acquired by {receipt.worker_id} after fence "
                        f"{highest} on the audit stream",
                    )
                )
            seen.add(receipt.fence)
            highest = max(highest, receipt.fence)
    return out


def _granted_before_next(acquired: list[Receipt], late: Receipt) -> bool:
    """Redis granted `late`'s fence before the next one: the next grant's receipt names
    `late`'s worker as the owner it took over from, or found no owner (a release)."""
    for receipt in acquired:
        if receipt.fence == late.fence + 1:
            previous = receipt.details.get("previous_owner")
            if not previous or str(previous).startswith(f"{late.worker_id}#"):
                return True
    return False


def signed_only(ev: Evidence) -> list[Violation]:
    sent: dict[str, Counter[str]] = {
        route: Counter(r.run_id for r in ev.requests if r.route == route and r.run_id)
        for route in (APPROVAL, STOP)
    }
    genuine = {a.source_id for a in ev.actions.values() if a.kind == "resume"}
    out: list[Violation] = []
    for planned in ev.actions.values():
        if planned.kind != "forged_resume" or planned.source_id is None:
            continue
        for result in filter(None, map(decoded_result, set(ev.results.get(planned.action_id, [])))):
            if result.status is not ResultStatus.FAILED:
                out.append(
                    Violation(
                        "signed_only",
                        planned.action_id,
                        f"a resume with a forged approval ended {result.status.value}",
                    )
                )
        run_id = ev.runs.get(planned.source_id)
        if planned.source_id not in genuine and run_id and sent[APPROVAL][run_id]:
            out.append(
                Violation(
                    "signed_only",
                    planned.action_id,
                    f"{sent[APPROVAL][run_id]} approval(s) reached run {run_id}, which only "
                    "forged approvals answered",
                )
            )
    for action_id in sorted(ev.forged_cancels):
        run_id = ev.runs.get(action_id)
        if run_id and sent[STOP][run_id]:
            out.append(
                Violation(
                    "signed_only",
                    action_id,
                    f"{sent[STOP][run_id]} stop(s) reached run {run_id}, which only forged "
                    "cancels named",
                )
            )
        for result in filter(None, map(decoded_result, set(ev.results.get(action_id, [])))):
            if result.error is not None and result.error.code.value == _HERMES + "cancelled":
                out.append(
                    Violation(
                        "signed_only", action_id, "cancelled, but only forged cancels named it"
                    )
                )
    return out


def chunks(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for action_id, copies in ev.results.items():
        if action_id not in ev.acked:
            continue
        raws = ev.chunks.get(action_id, [])
        planned = ev.actions.get(action_id)
        if planned is not None and not planned.streaming:
            out += unstreamed(action_id, raws, copies)
            continue
        for result in filter(None, map(decoded_result, set(copies))):
            chain, broken = named_chain(raws, result.last_chunk_sha256)
            if broken is not None:
                out.append(Violation("chunks", action_id, broken))
                continue
            named = [raws[i] for i in chain]
            for verified_only in (True, False):
                seen = read_through(raws, action_id, result.last_chunk_sha256, verified_only)
                if seen.refused is not None or seen.kept != named:
                    got = seen.refused or f"seqs {[chunk_view(d)['seq'] for d in seen.kept]}"
                    out.append(
                        Violation(
                            "chunks",
                            action_id,
                            f"the project's reader ({seen.mode}) does not give the consumer "
                            f"the chain the result names ({len(named)} chunks): {got}",
                        )
                    )
            others = [i for i in _extras(raws, chain) if i not in _late(ev, action_id, result)]
            if others:
                seqs = [chunk_view(raws[i])["seq"] for i in others]
                out.append(
                    Violation(
                        "chunks",
                        action_id,
                        f"chunks at seqs {seqs} outside the chain the result names, without "
                        "a valid chain MAC of a superseded fence (forged, or its own fork)",
                    )
                )
    return out


def unstreamed(action_id: str, raws: list[bytes], copies: list[bytes]) -> list[Violation]:
    """A non-streaming capability's Action (`PlannedAction.streaming` false): no chunk on
    its subject, whoever made it (no owner at any fence has a stream to publish), and no
    result that names a last chunk (a consumer would wait for a chunk that never comes)."""
    out: list[Violation] = []
    if raws:
        seqs = [chunk_view(raw)["seq"] for raw in raws]
        out.append(
            Violation(
                "chunks",
                action_id,
                f"chunks at seqs {seqs} on the subject of a non-streaming Action "
                "(it has no chunk stream)",
            )
        )
    for result in filter(None, map(decoded_result, set(copies))):
        if result.last_chunk_sha256 is not None:
            out.append(
                Violation(
                    "chunks",
                    action_id,
                    "the result of a non-streaming Action names a last chunk "
                    f"({result.last_chunk_sha256[:12]}…): it has no chunk stream",
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class ReaderView:
    """What a consumer of `ActionHandle.chunks` ends with (retractions applied), in which
    mode, how many chunks it was shown and then told to forget, and why the reader
    refused, if it did."""

    mode: str
    kept: list[bytes]
    retracted: int
    refused: str | None


def read_through(
    raws: list[bytes], action_id: str, last_sha256: str | None, verified_only: bool
) -> ReaderView:
    """Read `raws` (stream order) the way `ActionHandle.chunks` does with trusted worker
    keys: each chunk through one `ChunkSequencer`, the signed result's
    `last_chunk_sha256` given to it when it needs it; a retraction drops what it names."""
    mode = "verified_only" if verified_only else "streaming"
    reader = ChunkSequencer(hold_until_vouched=verified_only, verify_terminal=True)
    kept: list[bytes] = []
    try:
        for raw in raws:
            items = reader.add(raw)
            if reader.needs_result:
                items += reader.vouch(last_sha256, action_id)
            for item in items:
                if isinstance(item, ChunkRetraction):
                    del kept[item.from_seq :]
                else:
                    kept.append(item.data)
            if reader.done:
                return ReaderView(mode, kept, reader.retracted, None)
    except UnverifiedResponse as exc:
        return ReaderView(mode, kept, reader.retracted, f"it refused the stream: {exc}")
    return ReaderView(mode, kept, reader.retracted, "it never reached a terminal chunk")


def late_chunks(ev: Evidence) -> tuple[int, int]:
    """Superseded owners' late chunks on the chunk streams (bug 2's worker side: they land
    beside the chain the result names), and how many of them a streaming reader passed on
    and then retracted, over every settled Action."""
    late = retracted = 0
    for action_id, copies in ev.results.items():
        planned = ev.actions.get(action_id)
        if planned is not None and not planned.streaming:
            continue  # no chunk stream: any chunk there is a violation (`unstreamed`)
        raws = ev.chunks.get(action_id, [])
        for result in filter(None, map(decoded_result, set(copies))):
            _, broken = named_chain(raws, result.last_chunk_sha256)
            if broken is None and action_id in ev.acked:
                late += len(_late(ev, action_id, result))
                seen = read_through(raws, action_id, result.last_chunk_sha256, False)
                retracted += seen.retracted
    return late, retracted


def _extras(raws: list[bytes], chain: list[int]) -> list[int]:
    in_chain = {sha256(raws[i]) for i in chain}
    return [i for i, raw in enumerate(raws) if sha256(raw) not in in_chain]


def _late(ev: Evidence, action_id: str, result: ActionResult) -> set[int]:
    """Indexes of the chunks outside the named chain that a superseded owner made."""
    raws = ev.chunks.get(action_id, [])
    chain, _ = named_chain(raws, result.last_chunk_sha256)
    macs = ev.chunk_macs.get(action_id, [])
    lease = ev.leases.get(action_id) or {}
    return {i for i in _extras(raws, chain) if _stale(raws[i], _at(macs, i), lease, result.fence)}


def named_chain(raws: list[bytes], last_sha256: str | None) -> tuple[list[int], str | None]:
    """The chain the result vouches for, as indexes into `raws`, walked back from the
    terminal chunk it names to seq 0 through each chunk's `prev_sha256`; or why there is
    no such gap-free chain with exactly one terminal chunk, its last."""
    by_sha = {sha256(raw): i for i, raw in enumerate(raws)}
    at = by_sha.get(last_sha256 or "")
    if at is None:
        return [], f"the result names a terminal chunk the stream does not hold ({len(raws)} held)"
    chain = [at]
    chunk = chunk_view(raws[at])
    if chunk["kind"] not in TERMINAL_KINDS:
        return [], f"the chunk the result names (seq {chunk['seq']}) is not terminal"
    for _ in range(len(raws)):
        if chunk["seq"] == 0:
            if chunk.get("prev_sha256") is not None:
                return [], "the chain's seq 0 names a chunk before it"
            return chain[::-1], None
        before = by_sha.get(chunk.get("prev_sha256") or "")
        if before is None:
            return [], f"the chain the result names breaks before seq {chunk['seq']} (a gap)"
        previous = chunk_view(raws[before])
        if previous["seq"] != chunk["seq"] - 1:
            return [], f"seq {previous['seq']} precedes seq {chunk['seq']} in the chain"
        if previous["kind"] in TERMINAL_KINDS:
            return [], f"a second terminal chunk at seq {previous['seq']} in the chain"
        chain.append(before)
        chunk = previous
    return [], "the chain the result names loops"


def _at(values: list[str | None], index: int) -> str | None:
    return values[index] if index < len(values) else None


#: A lease record's field holding one fence's chunk-chain key (`chain_key.{fence}`).
CHAIN_KEY = "chain_key."


def _stale(raw: bytes, mac: str | None, lease: dict[str, str], settled_fence: int) -> bool:
    """A non-terminal chunk made by the delivery at a fence the settle superseded: its
    `AIP-Chunk-Mac` verifies under that fence's chain key (from the lease record)."""
    if mac is None or chunk_view(raw)["kind"] in TERMINAL_KINDS:
        return False
    keys = {
        int(name.removeprefix(CHAIN_KEY)): key
        for name, key in lease.items()
        if name.startswith(CHAIN_KEY) and name.removeprefix(CHAIN_KEY).isdigit()
    }
    return mac_is_valid(mac, sha256(raw), keys, settled_fence)


def durable(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for event in ev.history.events:
        if event.type == "observe" and event.op == "result" and event.action_id:
            seen = (
                event.detail.get("settled_by"),
                event.detail.get("fence"),
                event.detail.get("last_chunk"),
            )
            present = {
                (r.settled_by, r.fence, r.last_chunk_sha256)
                for r in filter(None, map(decoded_result, ev.results.get(event.action_id, [])))
            }
            if seen not in present:
                out.append(
                    Violation(
                        "durable",
                        event.action_id,
                        f"the result seen at t={event.t:.1f}s ({seen[0]}, fence "
                        f"{seen[1]}) is not on the stream after the heal",
                    )
                )
    return out


RULES: tuple[Callable[[Evidence], list[Violation]], ...] = (
    start_once,
    unsafe_once,
    approval_once,
    one_result,
    honest,
    fence,
    fences_unique,
    fence_order,
    signed_only,
    delegation,
    chunks,
    durable,
)


def check(ev: Evidence) -> list[Violation]:
    return [violation for rule in RULES for violation in rule(ev)]
