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
* `honest`: an operator result that says it is certain nothing was started, while Hermes
  received a start for it, lies; a completed one whose start never reached Hermes invents.
* `fence`: a result's fence is the Action's last fence (the lease record's), and the
  worker that settled it acquired the lease at that fence: no result from a superseded
  owner.
* `fences_unique`: no fence was granted twice (two acquisitions receipts at one fence by
  different owners), and none above the lease record's.
* `chunks`: the chunk stream of a settled Action is gap-free from seq 0, has exactly one
  terminal chunk, last, and it is the one the result's `last_chunk_sha256` names.
* `durable`: every result the client saw during the campaign is still on the stream after
  the faults healed (nothing acknowledged by JetStream was lost).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from schemas.audit import Receipt, ReceiptEvent
from schemas.result import ActionResult, ResultStatus
from tests.chaos.history import History

START = "POST /v1/runs"
APPROVAL = "POST /v1/runs/{run_id}/approval"
CHAT = "POST /v1/chat/completions"
TERMINAL_KINDS = ("done", "error")
#: Operator failure codes that say, with `uncertain_outcome: false`, that Hermes refused or
#: was never sent the start; they may follow a start only when Hermes itself rejected it.
REJECTED_AFTER_START = {"connector.hermes_agent.operator_start_rejected"}


#: A product bug the campaign found and that is not fixed yet (docs/reliability.md, "Bugs
#: found"): its violations are reported, counted and kept apart, so the suite's campaign
#: still fails on anything else.
KNOWN_STALE_CHUNKS = (
    "known bug: chunks a superseded owner sent before its partition land after the "
    "takeover and take the new owner's seqs (docs/reliability.md, bug 2)"
)


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    action_id: str | None
    message: str
    #: Set when the violation is a known, reported product bug (see KNOWN_STALE_CHUNKS).
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
    """What the workload published: its kind, and for a resume the objective it answers."""

    action_id: str
    kind: str  # read | objective | approval_objective | resume | chat
    source_id: str | None = None


@dataclass
class Evidence:
    actions: dict[str, PlannedAction]
    #: Action ids whose publish JetStream acknowledged (a PubAck came back).
    acked: set[str]
    results: dict[str, list[bytes]] = field(default_factory=dict)
    chunks: dict[str, list[bytes]] = field(default_factory=dict)
    receipts: dict[str, list[Receipt]] = field(default_factory=dict)
    leases: dict[str, dict[str, str]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    history: History = field(default_factory=History)


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


def _decoded(raw: bytes) -> ActionResult | None:
    try:
        return msgspec.json.decode(raw, type=ActionResult)
    except msgspec.ValidationError:
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
                for r in filter(None, map(_decoded, distinct))
            ]
            out.append(Violation("one_result", action_id, f"two different results: {summary}"))
        elif len(copies) > 1:
            out.append(Violation("one_result", action_id, f"one result published {len(copies)}x"))
    return out


def honest(ev: Evidence) -> list[Violation]:
    starts = Counter(_operator_action_id(r) for r in ev.requests if r.route == START)
    out: list[Violation] = []
    for action_id, planned in ev.actions.items():
        if planned.kind not in ("objective", "approval_objective"):
            continue
        for raw in set(ev.results.get(action_id, [])):
            result = _decoded(raw)
            if result is None:
                continue
            sent = starts.get(action_id, 0)
            error = result.error
            if (
                result.status is ResultStatus.FAILED
                and error is not None
                and not error.uncertain_outcome
                and sent
                and error.code.value not in REJECTED_AFTER_START
            ):
                out.append(
                    Violation(
                        "honest",
                        action_id,
                        f"certain failure {error.code.value} although {sent} start(s) "
                        f"reached Hermes: {error.message}",
                    )
                )
            if result.status is ResultStatus.COMPLETED and not sent:
                out.append(Violation("honest", action_id, "completed, but no start reached Hermes"))
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
            result = _decoded(raw)
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


def chunks(ev: Evidence) -> list[Violation]:
    out: list[Violation] = []
    for action_id, copies in ev.results.items():
        if action_id not in ev.acked:
            continue
        raws = ev.chunks.get(action_id, [])
        decoded = [json.loads(raw) for raw in raws]
        seqs = [c["seq"] for c in decoded]
        if seqs != list(range(len(seqs))):
            out.append(Violation("chunks", action_id, f"chunk seqs not gap-free: {seqs}"))
        breaks = [
            c["seq"]
            for previous, raw, c in zip(raws, raws[1:], decoded[1:], strict=False)
            if c.get("prev_sha256") != sha256(previous)
        ]
        if breaks:
            out.append(
                Violation(
                    "chunks",
                    action_id,
                    f"hash chain broken at seq {breaks}: chunks of two publishers",
                )
            )
        terminal = [i for i, c in enumerate(decoded) if c["kind"] in TERMINAL_KINDS]
        if len(terminal) != 1:
            out.append(Violation("chunks", action_id, f"{len(terminal)} terminal chunks"))
        elif terminal[0] != len(decoded) - 1:
            out.append(Violation("chunks", action_id, "the terminal chunk is not the last"))
        else:
            names = {r.last_chunk_sha256 for r in filter(None, map(_decoded, set(copies)))}
            if names != {sha256(raws[terminal[0]])}:
                out.append(
                    Violation("chunks", action_id, "the result names another terminal chunk")
                )
    return out


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
                for r in filter(None, map(_decoded, ev.results.get(event.action_id, [])))
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
    chunks,
    durable,
)


def check(ev: Evidence) -> list[Violation]:
    found = [violation for rule in RULES for violation in rule(ev)]
    stale = {
        v.action_id
        for v in found
        if v.rule == "chunks" and "hash chain broken" in v.message and _taken_over(ev, v)
    }
    return [
        replace(v, known=KNOWN_STALE_CHUNKS) if v.rule == "chunks" and v.action_id in stale else v
        for v in found
    ]


def _taken_over(ev: Evidence, violation: Violation) -> bool:
    """The Action's lease was acquired at two fences (a takeover happened)."""
    fences = {r.fence for r in _acquisitions(ev.receipts.get(violation.action_id or "", []))}
    return len(fences) > 1
