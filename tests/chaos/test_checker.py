"""The checker on hand-made evidence: each rule passes a clean history and names the
planted violation (so a campaign with zero violations means the rules held, not that the
checker looked at nothing)."""

from __future__ import annotations

import json

import pytest

from schemas.audit import Receipt, ReceiptEvent
from schemas.errors import ErrorCategory, ErrorCode, ProtocolError
from schemas.result import ActionResult, ResultStatus
from tests.aip_wire import result_view
from tests.chaos import checker
from tests.chaos.campaign import Report
from tests.chaos.checker import (
    APPROVAL,
    CHAT,
    START,
    STOP,
    Evidence,
    PlannedAction,
    Request,
    check,
    late_chunks,
    read_through,
    sha256,
)
from tests.chaos.history import History
from worker.errors import UnverifiedResponse
from worker.execution.chunk_chain import chain_mac
from worker.trust.responses import ChunkRetraction, ChunkSequencer, Sequenced
from worker.wire.results import encode_result

A = "act_" + "a" * 32
B = "act_" + "b" * 32


def chunk(action_id: str, seq: int, kind: str = "data", prev: bytes | None = None) -> bytes:
    """A `stream_chunk` Envelope in the published layout (docs/publishing.md)."""
    ours: dict[str, object] = {"endpoint_id": "h1", "ts_unix_ms": 1}
    if prev is not None:
        ours["prev_sha256"] = sha256(prev)
    document = {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.stream_chunk",
        "message_id": f"msg_{seq:032x}",
        "sent_at": "2026-01-01T00:00:00Z",
        "body": {
            "stream_chunk": {
                "action_id": action_id,
                "sequence": seq,
                "kind": kind,
                "data": {"hermes_worker": None},
            }
        },
        "extensions": {"org.aip-hermes-worker": ours},
    }
    return json.dumps(document).encode()


def chain(action_id: str, kinds: list[str]) -> list[bytes]:
    out: list[bytes] = []
    for seq, kind in enumerate(kinds):
        out.append(chunk(action_id, seq, kind, out[-1] if out else None))
    return out


def result(
    action_id: str,
    terminal: bytes | None,
    *,
    worker: str = "w1",
    fence: int = 1,
    status: ResultStatus = ResultStatus.COMPLETED,
    error: ProtocolError | None = None,
    operation: str = "operator",
) -> bytes:
    """A result naming `terminal` as its last chunk (None: it names none, as the result of
    a non-streaming capability does)."""
    return encode_result(
        ActionResult(
            action_id=action_id,
            capability=f"cap:hermes_agent:h1:{operation}",
            endpoint_id="h1",
            status=status,
            error=error,
            settled_by=worker,
            fence=fence,
            settled_at_unix_ms=1,
            last_chunk_sha256=sha256(terminal) if terminal is not None else None,
        ),
        action=None,
        signer=None,
        endpoint_id="h1",
    )


def acquired(action_id: str, worker: str, fence: int, previous: str | None = None) -> Receipt:
    return Receipt(
        receipt_id=f"{action_id}:{worker}:{fence}",
        event=ReceiptEvent.LEASE_ACQUIRED,
        action_id=action_id,
        endpoint_id="h1",
        worker_id=worker,
        fence=fence,
        ts_unix_ms=1,
        details={"takeover": previous is not None, "previous_owner": previous},
    )


def start(action_id: str) -> Request:
    body = {"input": json.dumps({"operator_action_id": action_id}), "session_id": "s"}
    return Request(START, None, body, 0.0)


def clean() -> Evidence:
    """Objective A settled once by w2 after a takeover from w1; nothing wrong."""
    chunks = chain(A, ["data", "data", "done"])
    history = History()
    ev = Evidence(
        actions={A: PlannedAction(A, "objective", operation="operator")},
        acked={A},
        results={A: [result(A, chunks[-1], worker="w2", fence=2)]},
        chunks={A: chunks},
        receipts={A: [acquired(A, "w1", 1), acquired(A, "w2", 2, previous="w1#01")]},
        leases={A: {"fence": "2", "owner": ""}},
        requests=[start(A)],
        history=history,
    )
    decoded = result_view(ev.results[A][0])
    history.add(
        "observe", "result", A, settled_by="w2", fence=2, last_chunk=decoded["last_chunk_sha256"]
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
    ev.actions[B] = PlannedAction(B, "chat", operation="chat_stream")
    ev.requests += [Request(CHAT, None, {"messages": [{"content": f"chaos chat {B}"}]}, 0.0)] * 2
    assert rules(ev) == ["unsafe_once"]


def test_two_approvals_sent_to_one_run() -> None:
    ev = clean()
    ev.requests += [Request(APPROVAL, "run_1", {"choice": "once"}, 0.0)] * 2
    assert rules(ev) == ["approval_once"]


def test_an_acknowledged_action_without_a_result_is_lost() -> None:
    ev = clean()
    ev.actions[B] = PlannedAction(B, "read", operation="models")
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


def _late(ev: Evidence, key: str) -> list[bytes]:
    """w1 (fence 1) published seq 1 and 2 before it was cut off; they land after w2
    (fence 2) continued from the recorded head (seq 0). Each carries fence 1's chain MAC."""
    ev.leases[A]["chain_key.1"] = key
    return [
        chunk(A, 1, "data", prev=ev.chunks[A][0]).replace(
            b'"hermes_worker": null', b'"hermes_worker": "w1"'
        ),
        chunk(A, 2, "data", prev=b"w1's seq 1"),
    ]


def test_a_superseded_owners_late_chunks_are_kept_from_the_consumer_and_counted() -> None:
    """The late chunks beside the named chain: the project's reader gives the consumer the
    named chain (verified-only, and streaming), so no violation; they are counted."""
    ev = clean()
    key = "ab" * 32
    late = _late(ev, key)
    ev.chunks[A] += late
    ev.chunk_macs[A] = [None, None, None] + [chain_mac(key, 1, sha256(c)) for c in late]
    assert check(ev) == []
    assert late_chunks(ev) == (2, 0)  # stored after the chain ended: never streamed
    # A MAC that does not verify under fence 1's key: forged, a violation.
    ev.chunk_macs[A][-1] = chain_mac("cd" * 32, 1, sha256(late[1]))
    assert "seqs [2]" in " ".join(map(str, check(ev)))
    # A MAC of the settling fence itself: the owner forked its own chain.
    ev.leases[A]["chain_key.2"] = key
    ev.chunk_macs[A][-1] = chain_mac(key, 2, sha256(late[1]))
    assert [v.rule for v in check(ev)] == ["chunks"]
    # A superseded owner's terminal chunk: it never settled, so it never had one to send.
    stray = chunk(A, 3, "done", prev=late[1])
    ev.chunks[A][-1] = stray
    ev.chunk_macs[A][-1] = chain_mac(key, 1, sha256(stray))
    assert [v.rule for v in check(ev)] == ["chunks"]


def test_a_late_chunk_streamed_before_its_competitor_is_retracted_for_the_consumer() -> None:
    """w1's late seq 1 is stored before w2's seq 1: a streaming reader passes it on, then
    retracts it once the result names w2's chain. The consumer ends with the named chain."""
    ev = clean()
    key = "ab" * 32
    late = _late(ev, key)[0]
    ev.chunks[A].insert(1, late)
    ev.chunk_macs[A] = [None, chain_mac(key, 1, sha256(late)), None, None]
    assert check(ev) == []
    assert late_chunks(ev) == (1, 1)
    streamed = read_through(ev.chunks[A], A, sha256(ev.chunks[A][-1]), False)
    assert (streamed.kept, streamed.retracted) == ([ev.chunks[A][0], *ev.chunks[A][2:]], 1)


def test_a_reader_that_raises_at_a_retraction_is_a_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planted bug: the reader before this branch, which raised when the result
    disowned a chunk it had streamed. The checker reads through the project's reader, so
    it fails the campaign (only the streaming read: the verified-only one never retracts)."""

    class Raising(ChunkSequencer):
        def vouch(self, last_chunk_sha256: str | None, action_id: str) -> list[Sequenced]:
            released = super().vouch(last_chunk_sha256, action_id)
            if any(isinstance(item, ChunkRetraction) for item in released):
                raise UnverifiedResponse("a chunk read was not the Action's")
            return released

    monkeypatch.setattr(checker, "ChunkSequencer", Raising)
    ev = clean()
    key = "ab" * 32
    late = _late(ev, key)[0]
    ev.chunks[A].insert(1, late)
    ev.chunk_macs[A] = [None, chain_mac(key, 1, sha256(late)), None, None]
    violations = check(ev)
    assert [v.rule for v in violations] == ["chunks"]
    assert "reader (streaming)" in violations[0].message
    assert "refused the stream" in violations[0].message


def test_the_named_chain_must_be_whole() -> None:
    ev = clean()
    ev.chunks[A] = ev.chunks[A][1:]  # seq 0 lost
    assert "breaks before seq 1" in check(ev)[0].message
    ev = clean()
    ev.chunks[A].pop()  # the terminal chunk the result names is not on the stream
    assert "does not hold" in check(ev)[0].message
    ev = clean()
    ev.chunks[A] = chain(A, ["data", "done", "done"])
    ev.results[A] = [result(A, ev.chunks[A][-1], worker="w2", fence=2)]
    ev.history.events.clear()
    assert "second terminal chunk" in check(ev)[0].message


def _read(ev: Evidence, kind: str = "read") -> None:
    """B: a `models` read (a non-streaming capability) settled with no chunk stream."""
    ev.actions[B] = PlannedAction(B, kind, operation="models")
    ev.acked.add(B)
    ev.results[B] = [result(B, None, operation="models")]


def test_a_non_streaming_action_has_no_chunk_and_its_result_names_none() -> None:
    """As upstream AIP: a non-streaming capability's result is its whole answer. No chunk
    on its subject and a result naming none is clean; a chunk there, or a result naming a
    last chunk, is a violation (the planted ones are caught)."""
    for kind in ("read", "delegation"):
        ev = clean()
        _read(ev, kind)
        if kind == "delegation":
            ev.history.add("ok", "delegate", B, child=B)
        assert check(ev) == []
        assert late_chunks(ev) == (0, 0)
        # A chunk stream published for it anyway, closed by a terminal chunk its result
        # names: both are violations.
        ev.chunks[B] = chain(B, ["data", "done"])
        ev.results[B] = [result(B, ev.chunks[B][-1], operation="models")]
        messages = [v.message for v in check(ev)]
        assert [v.rule for v in check(ev)] == ["chunks", "chunks"]
        assert "chunks at seqs [0, 1] on the subject of a non-streaming Action" in messages[0]
        assert "names a last chunk" in messages[1]
        # Only a stray chunk (the result names none): still a violation.
        ev.results[B] = [result(B, None, operation="models")]
        assert [v.message[:15] for v in check(ev)] == ["chunks at seqs "]
        # Only a result naming a chunk that is not there.
        ev.chunks[B] = []
        ev.results[B] = [result(B, b"no such chunk", operation="models")]
        assert [v.rule for v in check(ev)] == ["chunks"]


def test_a_streaming_action_whose_result_names_no_chunk_is_a_violation() -> None:
    """The strict check stays for streaming Actions: an objective (or a chat turn) whose
    result names no terminal chunk, with or without chunks on its subject, breaks it."""
    ev = clean()
    ev.results[A] = [result(A, None, worker="w2", fence=2)]
    ev.history.events.clear()
    violations = check(ev)
    assert [v.rule for v in violations] == ["chunks"]
    assert "does not hold (3 held)" in violations[0].message
    ev.chunks[A] = []
    assert "does not hold (0 held)" in check(ev)[0].message
    ev = clean()
    ev.actions[B] = PlannedAction(B, "chat", operation="chat_stream")
    ev.acked.add(B)
    ev.requests.append(Request(CHAT, None, {"messages": [{"content": f"chaos chat {B}"}]}, 0.0))
    ev.results[B] = [result(B, None, operation="chat_stream")]
    assert [(v.rule, v.action_id) for v in check(ev)] == [("chunks", B)]


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


def failed(code: ErrorCode, *, uncertain: bool = False) -> ProtocolError:
    return ProtocolError(
        code=code,
        category=ErrorCategory.PERMANENT,
        retryable=False,
        uncertain_outcome=uncertain,
        message="x",
    )


def test_fences_that_go_down_on_the_audit_stream() -> None:
    ev = clean()
    # w1's receipt of fence 1 lands after w2's of fence 2, which names w1 as the owner it
    # took over from: a receipt held in flight, the grants were in order.
    ev.receipts[A].reverse()
    assert check(ev) == []
    # A fence acquired again after a higher one: Redis granted it twice (lost its record).
    ev = clean()
    ev.receipts[A].append(acquired(A, "w1", 1))
    assert "fence_order" in rules(ev)
    # A late first receipt of fence 1 whose successor names another owner: not excused.
    ev = clean()
    ev.receipts[A] = [acquired(A, "w2", 2, previous="w3#02"), acquired(A, "w1", 1)]
    violations = [v for v in check(ev) if v.rule == "fence_order"]
    assert [v.message for v in violations] == [
        "fence 1 acquired by w1 after fence 2 on the audit stream"
    ]


def test_a_forged_approval_that_reaches_hermes_or_completes_a_resume() -> None:
    ev = clean()
    forged = "act_" + "f" * 32
    ev.actions[forged] = PlannedAction(forged, "forged_resume", source_id=A, operation="operator")
    ev.runs[A] = "run_a"
    assert check(ev) == []
    ev.requests.append(Request(APPROVAL, "run_a", {"choice": "once"}, 0.0))
    assert rules(ev) == ["signed_only"]
    ev.requests.pop()
    ev.results[forged] = [result(forged, ev.chunks[A][-1])]
    assert rules(ev) == ["signed_only"]
    # A genuine resume of the same prompt may send the approval.
    ev = clean()
    ev.actions[forged] = PlannedAction(forged, "forged_resume", source_id=A, operation="operator")
    ev.actions[B] = PlannedAction(B, "resume", source_id=A, operation="operator")
    ev.runs[A] = "run_a"
    ev.requests.append(Request(APPROVAL, "run_a", {"choice": "once"}, 0.0))
    assert check(ev) == []


def test_a_forged_cancel_that_stops_the_run_or_cancels_the_action() -> None:
    ev = clean()
    ev.forged_cancels.add(A)
    ev.runs[A] = "run_a"
    assert check(ev) == []
    ev.requests.append(Request(STOP, "run_a", {}, 0.0))
    assert rules(ev) == ["signed_only"]
    ev = clean()
    ev.forged_cancels.add(A)
    error = failed(ErrorCode.CANCELLED, uncertain=True)
    ev.results[A] = [
        result(A, ev.chunks[A][-1], worker="w2", fence=2, status=ResultStatus.FAILED, error=error)
    ]
    ev.history.events.clear()
    assert rules(ev) == ["signed_only"]


def test_a_certain_failure_after_a_chat_turn_reached_hermes_is_dishonest() -> None:
    ev = clean()
    chunks = chain(B, ["data", "error"])
    ev.actions[B] = PlannedAction(B, "chat", operation="chat_stream")
    ev.acked.add(B)
    ev.chunks[B] = chunks
    ev.requests.append(Request(CHAT, None, {"messages": [{"content": f"chaos chat {B}"}]}, 0.0))
    error = failed(ErrorCode.STREAM_PUBLICATION)
    ev.results[B] = [result(B, chunks[-1], status=ResultStatus.FAILED, error=error)]
    assert rules(ev) == ["honest"]
    # Uncertain, or refused by Hermes itself: honest.
    ev.results[B] = [
        result(B, chunks[-1], status=ResultStatus.FAILED, error=failed(ErrorCode.REMOTE_REJECTED))
    ]
    assert check(ev) == []
    uncertain = failed(ErrorCode.STREAM_PUBLICATION, uncertain=True)
    ev.results[B] = [result(B, chunks[-1], status=ResultStatus.FAILED, error=uncertain)]
    assert check(ev) == []
    # Completed, yet the turn never reached Hermes.
    ev.requests.pop()
    ev.results[B] = [result(B, chunks[-1])]
    assert rules(ev) == ["honest"]


def test_an_approval_sent_while_every_resume_of_its_prompt_failed_certain() -> None:
    ev = clean()
    resumes = ["act_" + "1" * 32, "act_" + "2" * 32]
    for resume in resumes:
        ev.actions[resume] = PlannedAction(resume, "resume", source_id=A, operation="operator")
        ev.chunks[resume] = chain(resume, ["error"])
    ev.runs[A] = "run_a"
    ev.requests.append(Request(APPROVAL, "run_a", {"choice": "once"}, 0.0))
    certain = failed(ErrorCode.DEADLINE_EXCEEDED)
    ev.results.update(
        {
            r: [result(r, ev.chunks[r][-1], status=ResultStatus.FAILED, error=certain)]
            for r in resumes
        }
    )
    assert rules(ev) == ["honest"]
    # The one that sent it says it may have taken effect: honest.
    uncertain = failed(ErrorCode.APPROVAL_OUTCOME_UNKNOWN, uncertain=True)
    ev.results[resumes[1]] = [
        result(resumes[1], ev.chunks[resumes[1]][-1], status=ResultStatus.FAILED, error=uncertain)
    ]
    assert check(ev) == []


def test_the_reproduce_line_names_the_schedule_length_and_the_kinds() -> None:
    report = Report(
        seed=7,
        duration_s=40.0,
        mutation="stale_settle",
        faults=[],
        history=History(),
        violations=[],
        injected={},
        operations=0,
        actions=0,
        acked=0,
        kinds=("partition", "pause"),
    )
    line = report.reproduce()
    assert "--seed 7 " in line
    assert "--schedule-s 40 " in line
    assert "--kinds partition,pause" in line
    assert line.endswith("--mutation stale_settle")
    assert line in report.explain()


def test_a_delegation_with_two_children_or_an_unverified_child_result() -> None:
    ev = clean()
    ev.actions[B] = PlannedAction(B, "delegation", operation="models")
    ev.history.add("ok", "delegate", B, child=B)
    assert check(ev) == []
    ev.history.add("ok", "delegate", B, child=A)  # a retried call got another child
    assert rules(ev) == ["delegation"]
    ev = clean()
    ev.actions[B] = PlannedAction(B, "delegation", operation="models")
    ev.unverified[B] = "not signed by a trusted worker"
    assert rules(ev) == ["delegation"]
    # Acknowledged by the gateway's answer, and no child result: lost.
    ev = clean()
    ev.actions[B] = PlannedAction(B, "delegation", operation="models")
    ev.acked.add(B)
    assert rules(ev) == ["one_result"]
