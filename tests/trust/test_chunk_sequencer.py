"""The reader's chunk sequencer at a fork (worker/trust/responses.py `ChunkSequencer`).

After a takeover a superseded owner's late chunks can sit beside its successor's at the same
seqs (docs/reliability.md bug 2), and anyone with publish rights on a chunk subject can add a
forgery. The reader releases a chunk only once its link is verified: it names the chunk
released before it and nothing else claims its seq, or the signed result's
`last_chunk_sha256` vouches for the branch it is on. Chunk Envelopes are built here by hand
from the AIP rules (an unsigned `stream_chunk` Envelope, our extension's `prev_sha256` the
sha256 of the exact bytes before), not with the project's encoder.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from worker.errors import UnverifiedResponse
from worker.trust.responses import ChunkSequencer, SequencedChunk

ACTION = "act_" + "2" * 32


def _chunk(seq: int, prev: bytes | None, *, kind: str = "data", by: str = "w1") -> bytes:
    """An unsigned `stream_chunk` Envelope at `seq` naming the hash of `prev`."""
    ours: dict[str, Any] = {"endpoint_id": "h1", "ts_unix_ms": 1}
    if prev is not None:
        ours["prev_sha256"] = hashlib.sha256(prev).hexdigest()
    envelope = {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.stream_chunk",
        "message_id": "msg_" + hashlib.sha256(f"{seq}{by}{kind}".encode()).hexdigest()[:32],
        "sent_at": "2026-01-01T00:00:00Z",
        "from": {"id": "agent:hermes:h1", "kind": "agent"},
        "body": {
            "stream_chunk": {
                "action_id": ACTION,
                "sequence": seq,
                "kind": kind,
                "data": {"hermes_worker": {"by": by, "seq": seq}},
            }
        },
        "extensions": {"org.aip-hermes-worker": ours},
    }
    return json.dumps(envelope, separators=(",", ":"), sort_keys=True).encode()


def _branch(start: bytes | None, first_seq: int, count: int, by: str, *, end: bool) -> list[bytes]:
    """`count` chunks from `first_seq` linked after `start`; the last terminal when `end`."""
    out: list[bytes] = []
    prev = start
    for n in range(count):
        kind = "done" if end and n == count - 1 else "data"
        prev = _chunk(first_seq + n, prev, kind=kind, by=by)
        out.append(prev)
    return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _datas(items: list[SequencedChunk]) -> list[bytes]:
    return [item.data for item in items]


def _feed(order: ChunkSequencer, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for data in chunks:
        out += _datas(order.add(data))
    return out


def test_chunks_are_released_in_seq_order_once_each() -> None:
    chain = _branch(None, 0, 4, "w1", end=True)
    order = ChunkSequencer()
    # 1's first publication was lost and re-sent after its successors; 2 is republished.
    assert _feed(order, [chain[0], chain[2], chain[3], chain[1], chain[2]]) == chain
    assert order.done
    assert not order.forked


def test_a_late_genuine_chunk_of_a_superseded_owner_is_dropped_without_an_error() -> None:
    """w1 published 0..2, was cut off, and w2 took over at 3. w1's chunks 3 and 4 land
    after w2's chunk 3 (stored after the reader released it): both branches are held from
    there, and the signed result names w2's terminal chunk."""
    trunk = _branch(None, 0, 3, "w1", end=False)
    w2 = _branch(trunk[-1], 3, 3, "w2", end=True)
    w1_late = _branch(trunk[-1], 3, 2, "w1-late", end=False)
    order = ChunkSequencer(verify_terminal=True)
    assert _feed(order, [*trunk, w2[0]]) == [*trunk, w2[0]]
    assert _feed(order, [*w1_late, w2[1], w2[2]]) == []  # the fork: nothing more released
    assert order.forked
    assert order.needs_result
    assert order.held == 4
    assert _datas(order.vouch(_sha(w2[-1]), ACTION)) == w2[1:]
    assert order.done
    assert (order.dropped, order.held) == (2, 0)


def test_a_late_genuine_chunk_stored_before_its_successor_s_chunk() -> None:
    """w1's late chunk 3 reached the stream before w2 published its chunk 3. Read live, it
    was the only chunk at seq 3 and linked on, so it was released; once the signed result
    names w2's chain the reader is told it read off the chain. `hold_until_vouched` reads
    the same stream without an error: w1's chunk is dropped and only w2's chain released."""
    trunk = _branch(None, 0, 3, "w1", end=False)
    w2 = _branch(trunk[-1], 3, 3, "w2", end=True)
    w1_late = _chunk(3, trunk[-1], by="w1-late")
    stored = [*trunk, w1_late, *w2]

    live = ChunkSequencer(verify_terminal=True)
    assert _feed(live, stored) == [*trunk, w1_late]
    assert live.needs_result
    with pytest.raises(UnverifiedResponse, match="does not pass through the chunks read"):
        live.vouch(_sha(w2[-1]), ACTION)

    strict = ChunkSequencer(hold_until_vouched=True, verify_terminal=True)
    assert _feed(strict, stored) == []
    assert _datas(strict.vouch(_sha(w2[-1]), ACTION)) == [*trunk, *w2]
    assert strict.dropped == 1


def test_a_forged_chunk_at_a_fork_is_never_released() -> None:
    """A forgery linked to the real chunk 1, stored after the real chunk 2 was held behind a
    missing seq: both 2s are held, the real branch is released once the result vouches."""
    real = _branch(None, 0, 5, "w1", end=True)
    forged = _branch(real[1], 2, 2, "forger", end=True)  # a forged terminal too
    order = ChunkSequencer(verify_terminal=True)
    out = _feed(order, [real[0], real[2], forged[0], real[1], forged[1], real[3], real[4]])
    assert out == real[:2]
    assert order.needs_result
    out += _datas(order.vouch(_sha(real[-1]), ACTION))
    assert out == real
    assert not set(forged) & set(out)


def test_a_forged_terminal_chunk_is_held_until_the_result_names_the_real_one() -> None:
    """No fork seen yet: the forged terminal chunk links to the real chunk 1 and is alone at
    its seq, but a terminal chunk is released only when the signed result names it. The
    result names the real chain's end, which arrives later: the forgery is dropped."""
    real = _branch(None, 0, 4, "w1", end=True)
    forged_end = _chunk(2, real[1], kind="done", by="forger")
    order = ChunkSequencer(verify_terminal=True)
    assert _feed(order, [real[0], real[1], forged_end]) == real[:2]
    assert order.needs_result
    assert order.vouch(_sha(real[-1]), ACTION) == []  # the real end is not read yet
    assert _feed(order, real[2:]) == real[2:]
    assert order.done


def test_a_chunk_released_before_its_competitor_arrived_raises_when_the_result_disowns_it() -> None:
    """The forgery was the only chunk at its seq when read, so it was released; the real
    chunk 2 then arrives and the result vouches for the real branch. What was released
    cannot be taken back: the reader is told."""
    real = _branch(None, 0, 4, "w1", end=True)
    forged = _chunk(2, real[1], by="forger")
    order = ChunkSequencer(verify_terminal=True)
    assert _feed(order, [real[0], real[1], forged]) == [real[0], real[1], forged]
    assert _feed(order, real[2:]) == []
    assert order.needs_result
    with pytest.raises(UnverifiedResponse, match="does not pass through the chunks read"):
        order.vouch(_sha(real[-1]), ACTION)


def test_hold_until_vouched_never_releases_a_chunk_off_the_signed_chain() -> None:
    """The same order of arrival with `hold_until_vouched`: nothing is released before the
    result, and then only the vouched chain."""
    real = _branch(None, 0, 4, "w1", end=True)
    forged = _chunk(2, real[1], by="forger")
    order = ChunkSequencer(hold_until_vouched=True, verify_terminal=True)
    assert _feed(order, [real[0], real[1], forged, *real[2:]]) == []
    assert _datas(order.vouch(_sha(real[-1]), ACTION)) == real
    assert order.dropped == 1


def test_a_fork_with_both_branches_held_is_bounded() -> None:
    trunk = _branch(None, 0, 1, "w1", end=False)
    a = _branch(trunk[0], 1, 20, "a", end=False)
    b = _branch(trunk[0], 1, 20, "b", end=False)
    order = ChunkSequencer(max_held=30)
    _feed(order, trunk)
    with pytest.raises(UnverifiedResponse, match=r"30 chunks .* are held"):
        _feed(order, [x for pair in zip(a, b, strict=True) for x in pair])


def test_held_bytes_are_bounded() -> None:
    trunk = _branch(None, 0, 1, "w1", end=False)
    ahead = _branch(trunk[0], 1, 10, "w1", end=False)
    order = ChunkSequencer(max_held_bytes=3 * len(ahead[-1]))
    _feed(order, trunk)
    with pytest.raises(UnverifiedResponse, match="are held"):
        _feed(order, ahead[1:])  # chunk 1 is missing: the rest waits for it


def test_a_result_naming_a_chunk_that_is_not_terminal_is_refused() -> None:
    trunk = _branch(None, 0, 3, "w1", end=False)
    other = _branch(trunk[0], 1, 2, "other", end=True)
    order = ChunkSequencer(verify_terminal=True)
    _feed(order, [trunk[0], trunk[1], other[0], other[1], trunk[2]])
    assert order.needs_result
    with pytest.raises(UnverifiedResponse, match="not a terminal chunk"):
        order.vouch(_sha(trunk[2]), ACTION)


def test_a_republished_chunk_behind_the_reader_is_not_a_fork() -> None:
    chain = _branch(None, 0, 3, "w1", end=True)
    order = ChunkSequencer()
    _feed(order, chain[:2])
    assert _feed(order, [chain[0], chain[1], chain[2]]) == [chain[2]]
    assert not order.forked


def test_a_reader_from_a_later_seq_resolves_a_fork_the_same_way() -> None:
    trunk = _branch(None, 0, 3, "w1", end=False)
    w2 = _branch(trunk[-1], 3, 2, "w2", end=True)
    late = _chunk(3, trunk[-1], by="w1-late")
    order = ChunkSequencer(2, verify_terminal=True)
    assert _feed(order, [*trunk, w2[0], late, w2[1]]) == [trunk[2], w2[0]]
    assert _datas(order.vouch(_sha(w2[-1]), ACTION)) == [w2[1]]
    assert order.dropped == 1
