"""The checker on hand-made evidence: each rule passes a clean history and names the
planted violation (so a campaign with zero violations means the rules held, not that the
checker looked at nothing)."""

from __future__ import annotations

import json

import msgspec

from schemas.audit import Receipt, ReceiptEvent
from schemas.codec import encode
from schemas.errors import ErrorCategory, ErrorCode, ProtocolError
from schemas.result import ActionResult, ResultStatus
from tests.chaos.checker import (
    APPROVAL,
    CHAT,
    START,
    Evidence,
    PlannedAction,
    Request,
    check,
    sha256,
)
from tests.chaos.history import History

A = "act_" + "a" * 32
B = "act_" + "b" * 32


def chunk(action_id: str, seq: int, kind: str = "data", prev: bytes | None = None) -> bytes:
    document = {
        "action_id": action_id,
        "seq": seq,
        "kind": kind,
        "prev_sha256": None if prev is None else sha256(prev),
    }
    return json.dumps(document).encode()


def chain(action_id: str, kinds: list[str]) -> list[bytes]:
    out: list[bytes] = []
    for seq, kind in enumerate(kinds):
        out.append(chunk(action_id, seq, kind, out[-1] if out else None))
    return out


def result(
    action_id: str,
    terminal: bytes,
    *,
    worker: str = "w1",
    fence: int = 1,
    status: ResultStatus = ResultStatus.COMPLETED,
    error: ProtocolError | None = None,
) -> bytes:
    return encode(
        ActionResult(
            action_id=action_id,
            capability="cap:hermes_agent:h1:operator",
            endpoint_id="h1",
            status=status,
            error=error,
            settled_by=worker,
            fence=fence,
            settled_at_unix_ms=1,
            last_chunk_sha256=sha256(terminal),
        )
    )


def acquired(action_id: str, worker: str, fence: int) -> Receipt:
    return Receipt(
        receipt_id=f"{action_id}:{worker}:{fence}",
        event=ReceiptEvent.LEASE_ACQUIRED,
        action_id=action_id,
        endpoint_id="h1",
        worker_id=worker,
        fence=fence,
        ts_unix_ms=1,
    )


def start(action_id: str) -> Request:
    body = {"input": json.dumps({"operator_action_id": action_id}), "session_id": "s"}
    return Request(START, None, body, 0.0)


def clean() -> Evidence:
    """Objective A settled once by w2 after a takeover from w1; nothing wrong."""
    chunks = chain(A, ["data", "data", "done"])
    history = History()
    ev = Evidence(
        actions={A: PlannedAction(A, "objective")},
        acked={A},
        results={A: [result(A, chunks[-1], worker="w2", fence=2)]},
        chunks={A: chunks},
        receipts={A: [acquired(A, "w1", 1), acquired(A, "w2", 2)]},
        leases={A: {"fence": "2", "owner": ""}},
        requests=[start(A)],
        history=history,
    )
    decoded = msgspec.json.decode(ev.results[A][0], type=ActionResult)
    history.add(
        "observe", "result", A, settled_by="w2", fence=2, last_chunk=decoded.last_chunk_sha256
    )
    return ev


def rules(ev: Evidence) -> list[str]:
    return sorted({v.rule for v in check(ev)})


def test_a_clean_history_has_no_violation() -> None:
    assert check(clean()) == []


def test_a_second_start_for_one_objective() -> None:
    ev = clean()
    ev.requests.append(start(A))
    assert rules(ev) == ["start_once"]


def test_a_second_unsafe_chat_request() -> None:
    ev = clean()
    ev.actions[B] = PlannedAction(B, "chat")
    ev.requests += [Request(CHAT, None, {"messages": [{"content": f"chaos chat {B}"}]}, 0.0)] * 2
    assert rules(ev) == ["unsafe_once"]


def test_two_approvals_sent_to_one_run() -> None:
    ev = clean()
    ev.requests += [Request(APPROVAL, "run_1", {"choice": "once"}, 0.0)] * 2
    assert rules(ev) == ["approval_once"]


def test_an_acknowledged_action_without_a_result_is_lost() -> None:
    ev = clean()
    ev.actions[B] = PlannedAction(B, "read")
    ev.acked.add(B)
    violations = check(ev)
    assert [(v.rule, v.action_id) for v in violations] == [("one_result", B)]
    assert "lost" in violations[0].message


def test_two_different_results_and_one_result_twice() -> None:
    ev = clean()
    terminal = ev.chunks[A][-1]
    ev.results[A].append(result(A, terminal, worker="w2", fence=2, status=ResultStatus.FAILED))
    assert "two different results" in " ".join(str(v) for v in check(ev))
    ev = clean()
    ev.results[A].append(ev.results[A][0])
    assert [v.message for v in check(ev)] == ["one result published 2x"]


def test_a_result_from_a_superseded_fence() -> None:
    ev = clean()
    terminal = ev.chunks[A][-1]
    ev.results[A] = [result(A, terminal, worker="w1", fence=1)]
    ev.history.events.clear()
    assert rules(ev) == ["fence"]


def test_a_fence_granted_twice() -> None:
    ev = clean()
    ev.receipts[A].append(acquired(A, "w3", 2))
    assert "fences_unique" in rules(ev)


def test_chunk_gaps_and_terminal_chunks() -> None:
    ev = clean()
    del ev.chunks[A][1]
    assert rules(ev) == ["chunks"]
    ev = clean()
    ev.chunks[A] = chain(A, ["data", "error", "data", "done"])
    assert rules(ev) == ["chunks"]


def test_a_broken_chain_after_a_takeover_is_the_known_stale_chunk_bug() -> None:
    ev = clean()
    stale = chunk(A, 1, "data", prev=b"another publisher's chunk 0")
    ev.chunks[A][1] = stale
    ev.chunks[A][2] = chunk(A, 2, "done", prev=stale)
    ev.results[A] = [result(A, ev.chunks[A][2], worker="w2", fence=2)]
    ev.history.events.clear()
    violations = check(ev)
    assert [v.rule for v in violations] == ["chunks"]
    assert violations[0].known is not None
    ev.receipts[A] = [acquired(A, "w1", 1)]  # no takeover: not the known bug
    ev.results[A] = [result(A, ev.chunks[A][2], worker="w1", fence=1)]
    ev.leases[A] = {"fence": "1"}
    assert [v.known for v in check(ev)] == [None]


def test_a_certain_failure_after_a_start_reached_hermes_is_dishonest() -> None:
    ev = clean()
    terminal = ev.chunks[A][-1]
    error = ProtocolError(
        code=ErrorCode.DEADLINE_EXCEEDED,
        category=ErrorCategory.PERMANENT,
        retryable=False,
        uncertain_outcome=False,
        message="nothing was started",
    )
    ev.results[A] = [
        result(A, terminal, worker="w2", fence=2, status=ResultStatus.FAILED, error=error)
    ]
    ev.history.events.clear()
    assert rules(ev) == ["honest"]


def test_a_result_seen_then_gone_is_not_durable() -> None:
    ev = clean()
    ev.history.add("observe", "result", A, settled_by="w3", fence=3, last_chunk="x")
    assert rules(ev) == ["durable"]
