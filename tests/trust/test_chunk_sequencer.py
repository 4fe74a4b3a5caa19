"""The reader's chunk sequencer at a fork (worker/trust/responses.py `ChunkSequencer`).

After a takeover a superseded owner's late chunks can sit beside its successor's at the same
seqs (docs/reliability.md bug 2), and anyone with publish rights on a chunk subject can add a
forgery. The reader releases a chunk only once its link is verified: it names the chunk
released before it and nothing else claims its seq, or the signed result's
`last_chunk_sha256` vouches for the branch it is on; a chunk released while alone at its seq
and then disowned by the result is retracted (`ChunkRetraction`). Chunk Envelopes are built
here by hand from the AIP rules (an unsigned `stream_chunk` Envelope, our extension's
`prev_sha256` the sha256 of the exact bytes before), not with the project's encoder.

`test_every_arrival_order_ends_with_exactly_the_vouched_chain` permutes the arrival of two
branches and the signed result: every order for small forks, a seeded sample for larger ones.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from typing import Any

import pytest

from schemas.chunk import StreamChunk
from worker.errors import UnverifiedResponse
from worker.trust.responses import (
    ChunkRetraction,
    ChunkSequencer,
    Sequenced,
    read_chunk,
)

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


def _datas(items: list[Sequenced]) -> list[bytes]:
    """The chunks' bytes; a retraction is spelled `b"retract <from>..<to>"`."""
    return [
        f"retract {item.from_seq}..{item.to_seq}".encode()
        if isinstance(item, ChunkRetraction)
        else item.data
        for item in items
    ]


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
    names w2's chain the reader retracts seq 3 and releases w2's chain from there.
    `hold_until_vouched` reads the same stream without releasing w1's chunk at all."""
    trunk = _branch(None, 0, 3, "w1", end=False)
    w2 = _branch(trunk[-1], 3, 3, "w2", end=True)
    w1_late = _chunk(3, trunk[-1], by="w1-late")
    stored = [*trunk, w1_late, *w2]

    live = ChunkSequencer(verify_terminal=True)
    assert _feed(live, stored) == [*trunk, w1_late]
    assert live.needs_result
    vouched = live.vouch(_sha(w2[-1]), ACTION)
    assert _datas(vouched) == [b"retract 3..3", *w2]
    assert vouched[0] == ChunkRetraction(
        action_id=ACTION, from_seq=3, to_seq=3, sha256=(_sha(w1_late),)
    )
    assert (live.done, live.retracted, live.dropped) == (True, 1, 0)

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


def test_chunks_released_before_their_competitor_arrived_are_retracted() -> None:
    """The forgery (two chunks) was alone at its seqs when read, so it was released; the
    real chunk 2 then arrives and the result vouches for the real branch. What was released
    cannot be taken back, so the reader retracts seqs 2..3 and releases the real chain from
    seq 2: a consumer that applies the retraction holds exactly the real chain."""
    real = _branch(None, 0, 4, "w1", end=True)
    forged = _branch(real[1], 2, 2, "forger", end=False)
    order = ChunkSequencer(verify_terminal=True)
    assert _feed(order, [real[0], real[1], *forged]) == [real[0], real[1], *forged]
    assert _feed(order, real[2:]) == []
    assert order.needs_result
    assert _datas(order.vouch(_sha(real[-1]), ACTION)) == [b"retract 2..3", *real[2:]]
    assert (order.retracted, order.dropped) == (2, 0)


def test_a_retraction_waits_for_the_vouched_chain_behind_the_reader() -> None:
    """The result is read before the real chunks 2 and 3 (the reader vouched at a forged
    terminal it held): the walk back waits for them, though they are behind the seqs
    already released, then retracts the forgery and releases the real chain."""
    real = _branch(None, 0, 4, "w1", end=True)
    forged = _branch(real[1], 2, 2, "forger", end=True)
    order = ChunkSequencer(verify_terminal=True)
    assert _feed(order, [real[0], real[1], forged[0], forged[1]]) == [*real[:2], forged[0]]
    assert order.needs_result  # the forged terminal at seq 3 must be vouched for
    assert order.vouch(_sha(real[-1]), ACTION) == []
    assert _feed(order, [real[3], real[2]]) == [b"retract 2..2", *real[2:]]
    assert (order.done, order.retracted, order.dropped) == (True, 1, 1)


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


def test_a_vouched_chain_that_does_not_start_at_chunk_0_is_refused() -> None:
    """A result that vouches for a chain whose chunk 0 names a predecessor: no arrival
    order of a worker's chunks makes one, so it is refused, not retracted around."""
    real = _branch(None, 0, 3, "w1", end=True)
    odd = _branch(b"nothing before chunk 0", 0, 2, "odd", end=True)
    order = ChunkSequencer(verify_terminal=True)
    _feed(order, [*real[:2], *odd])
    assert order.needs_result
    with pytest.raises(UnverifiedResponse, match="chunk 0 names a predecessor"):
        order.vouch(_sha(odd[-1]), ACTION)


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


@dataclass(frozen=True)
class Fork:
    """Two branches of one Action's chain: the winner (`winner` chunks from seq 0, its last
    terminal: the signed result names it) and the loser (`loser` chunks from seq `at`,
    linked to the winner's chunk `at - 1`: a superseded owner's late chunks, or a forgery,
    terminal when `loser_ends`). A reader reads from `from_seq`."""

    at: int
    winner: int
    loser: int
    loser_ends: bool = False
    from_seq: int = 0

    def branches(self) -> tuple[list[bytes], list[bytes]]:
        return _branches(self)


@functools.cache
def _branches(fork: Fork) -> tuple[list[bytes], list[bytes]]:
    won = _branch(None, 0, fork.winner, "winner", end=True)
    start = won[fork.at - 1] if fork.at else None
    return won, _branch(start, fork.at, fork.loser, "loser", end=fork.loser_ends)


@functools.cache
def _decoded(data: bytes) -> StreamChunk:
    """Each chunk decoded once: thousands of orders feed the same few chunks."""
    return read_chunk(data)


#: Every arrival order is tried for these (at most 6 events: 720 orders).
EXHAUSTIVE = (
    Fork(at=0, winner=3, loser=2),
    Fork(at=1, winner=3, loser=2),
    Fork(at=2, winner=3, loser=2),  # the loser runs past the winner's terminal seq
    Fork(at=1, winner=3, loser=1, loser_ends=True),  # a forged terminal chunk
    Fork(at=1, winner=3, loser=2, from_seq=1),
)
#: A seeded sample of orders for these (7 to 12 events).
SAMPLED = (
    Fork(at=2, winner=4, loser=2),
    Fork(at=2, winner=6, loser=3),
    Fork(at=3, winner=5, loser=4, loser_ends=True),
    Fork(at=1, winner=7, loser=4, from_seq=2),
)
SAMPLES, SEEDS = 300, (29, 2029)
RESULT = b"the signed result"


def _orders(fork: Fork, events: list[bytes]) -> list[tuple[bytes, ...]]:
    if fork in EXHAUSTIVE:
        return list(itertools.permutations(events))
    orders: list[tuple[bytes, ...]] = []
    for seed in SEEDS:
        rng = random.Random(f"{seed}:{fork}")
        orders += [tuple(rng.sample(events, len(events))) for _ in range(SAMPLES)]
    return orders


def _read(fork: Fork, order: tuple[bytes, ...], *, strict: bool, at_need: bool) -> None:
    """Feed one arrival order as `ActionHandle.chunks` would (`at_need`: the result is
    fetched as soon as the reader needs it; otherwise it is applied where it arrives),
    applying retractions as a consumer must, and check what the consumer ends with."""
    won, lost = fork.branches()
    reader = ChunkSequencer(fork.from_seq, hold_until_vouched=strict, verify_terminal=True)
    shown: list[bytes] = []  # what the consumer holds, from from_seq
    vouched = False

    def take(items: list[Sequenced]) -> None:
        for item in items:
            if isinstance(item, ChunkRetraction):
                assert not strict, "a verified-only reader retracted"
                cut = item.from_seq - fork.from_seq
                assert item.to_seq == fork.from_seq + len(shown) - 1
                assert item.sha256 == tuple(_sha(d) for d in shown[cut:])
                assert any(d in lost for d in shown[cut:])  # only a loser's chunk is retracted
                del shown[cut:]
                continue
            assert vouched or not strict, "a verified-only reader released before the result"
            assert item.chunk.seq == fork.from_seq + len(shown)
            if shown:
                assert item.chunk.prev_sha256 == _sha(shown[-1])
            shown.append(item.data)

    for event in order:
        if event == RESULT:
            if at_need:
                continue
            vouched = True
            take(reader.vouch(_sha(won[-1]), ACTION))
            continue
        take(reader.add(event, _decoded(event)))
        if at_need and reader.needs_result:
            vouched = True
            take(reader.vouch(_sha(won[-1]), ACTION))
    if not vouched:  # the reader never needed the result; it ended on its own
        assert at_need
    assert reader.done
    assert shown == won[fork.from_seq :]


@pytest.mark.parametrize("strict", [False, True], ids=["streaming", "verified_only"])
@pytest.mark.parametrize("fork", EXHAUSTIVE + SAMPLED, ids=str)
def test_every_arrival_order_ends_with_exactly_the_vouched_chain(fork: Fork, strict: bool) -> None:
    """Whatever order the winner's chunks, the loser's and the signed result arrive in, the
    reader never raises, what it passes on is always one linked chain, a retraction names
    exactly the loser's chunks it passed on (never in verified-only mode, which passes on
    nothing before the result), and the consumer ends with exactly the winner's chain."""
    won, lost = fork.branches()
    names = {RESULT: "result"} | {d: f"W{n}" for n, d in enumerate(won)}
    names |= {d: f"L{fork.at + n}" for n, d in enumerate(lost)}
    for order in _orders(fork, [*won, *lost, RESULT]):
        for at_need in (True, False):
            try:
                _read(fork, order, strict=strict, at_need=at_need)
            except (AssertionError, UnverifiedResponse) as exc:
                arrival = " ".join(names[e] for e in order)
                raise AssertionError(
                    f"{fork} strict={strict} at_need={at_need}, arrival {arrival}: {exc}"
                ) from exc


def test_tail_prints_a_retraction_as_one_json_line_of_kind_retracted() -> None:
    """What `tail` prints (json format) for a retraction, read back as plain JSON, and its
    text format."""
    import msgspec

    from worker.commands.bus_commands import retraction_text

    retraction = ChunkRetraction(action_id=ACTION, from_seq=3, to_seq=4, sha256=("ab", "cd"))
    assert json.loads(msgspec.json.encode(retraction)) == {
        "kind": "retracted",
        "action_id": ACTION,
        "from_seq": 3,
        "to_seq": 4,
        "sha256": ["ab", "cd"],
    }
    assert retraction_text(retraction).startswith("retracted #3..#4: not on the chain")
