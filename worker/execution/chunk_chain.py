"""Where a takeover continues an Action's chunk chain: from what a fenced owner recorded and
published, never from whatever is last on the subject.

Anyone who may publish on an Action's chunk subject could append a chunk that names the
real last chunk's hash. A takeover that continued after "the last message on the subject"
would link its own chunks to the forgery, and the signed result (which names the chain's
last hash) would then vouch for it. Two facts close that (docs/security.md, "chunk chain"):

- **The recorded head.** At each confirmation collection the owner records the last chunk
  JetStream confirmed — its seq, sha256 and stream sequence — in the Action's lease hash,
  fenced (`lua/chunk_record.lua`: only the owner at its fence writes, and the seq only
  grows). What is at or before the head is the chain; the takeover starts there.
- **The chain key.** Every delivery draws a random key, kept in the lease hash under its
  fence at acquisition (`lua/lease_acquire.lua`), and every chunk it publishes carries
  `AIP-Chunk-Mac: {fence}:{HMAC-SHA256(key, sha256 of the chunk)}`. Chunks published after
  the head but before the owner could record them (at most about two confirmation batches)
  are adopted only when they link to the head and carry a valid MAC of an earlier fence:
  only a worker holding the Action's lease hash could have made one. A forged chunk
  (anyone with NATS rights only: no MAC) is never adopted, so it is never inside the chain
  the signed result vouches for, and a reader that met it is told at the fork
  (`worker.client.ActionHandle.chunks`).

An HMAC costs ~2 µs per chunk against ~25 µs for an Ed25519 signature: readers verify the
chain against the signed result, and only a takeover needs to tell its predecessors'
unrecorded chunks from forgeries.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.errors import EnvelopeRejected
from worker.bus.publisher import CHAIN_MAC_HEADER, BusPublisher
from worker.bus.stream_reads import drain
from worker.store.lease_store import ChunkChainRecord, ChunkHead
from worker.wire.chunks import decode_chunk

#: Hex digits of the HMAC kept in the header (128 bits).
MAC_HEX = 32
#: Messages a takeover reads on the subject after the recorded head: the unrecorded tail is
#: at most `chunk_stream.MAX_UNCONFIRMED` chunks per earlier owner; the bound keeps a
#: subject flooded with forgeries from costing a takeover more than this many reads.
SCAN_LIMIT = 4096


def new_chain_key() -> str:
    """A delivery's chain key (hex): random, never derived from anything another can see."""
    return secrets.token_hex(32)


def chain_mac(chain_key: str, fence: int, sha256_hex: str) -> str:
    """The `AIP-Chunk-Mac` value of the chunk whose bytes hash to `sha256_hex`.

    The HMAC is keyed once per key (`_keyed`, the streams publishing now) and copied per
    chunk: keying it, with OpenSSL looking sha256 up by name, was most of a per-chunk
    `hmac.new`/`hmac.digest` in a relay. Held per key in a small cache, not per stream, so
    10,000 held runs do not each keep an HMAC context. The keyed state is HMAC's own two
    sha256 states (RFC 2104: the key padded and xored with ipad, with opad), copied and
    finished here: `hmac.HMAC.copy` and its wrappers were a Python call each per chunk."""
    inner, outer = _keyed(chain_key)
    digest = inner.copy()
    digest.update(sha256_hex.encode())
    mac = outer.copy()
    mac.update(digest.digest())
    return f"{fence}:{mac.hexdigest()[:MAC_HEX]}"


@functools.lru_cache(maxsize=64)
def _keyed(chain_key: str) -> tuple[Any, Any]:
    """HMAC-SHA256's inner and outer states for `chain_key` (RFC 2104, block of 64 bytes)."""
    key = bytes.fromhex(chain_key)
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return (
        hashlib.sha256(bytes(b ^ 0x36 for b in key)),
        hashlib.sha256(bytes(b ^ 0x5C for b in key)),
    )


_BLOCK = 64


def mac_is_valid(
    header: str | None, sha256_hex: str, chain_keys: Mapping[int, str], below_fence: int
) -> bool:
    """True when `header` is a MAC of `sha256_hex` under the chain key of a fence below
    `below_fence` (an earlier owner's: the takeover's own fence published nothing yet)."""
    if not header:
        return False
    fence_text, _, _ = header.partition(":")
    try:
        fence = int(fence_text)
    except ValueError:
        return False
    key = chain_keys.get(fence)
    if key is None or fence >= below_fence:
        return False
    return hmac.compare_digest(header, chain_mac(key, fence, sha256_hex))


@dataclass(frozen=True, slots=True)
class ChainStart:
    """Where a chunk stream continues: the next seq and the hash it names."""

    next_seq: int
    prev_sha256: str | None
    #: Stream sequence of the last chunk of the chain (0: none), for the next record.
    stream_seq: int
    #: Chunks after the recorded head adopted on their MAC (for the receipt and tests).
    adopted: int


async def continue_chain(
    publisher: BusPublisher,
    record: ChunkChainRecord,
    *,
    endpoint_id: str,
    action_id: str,
    fence: int,
) -> ChainStart:
    """Where the delivery at `fence` continues the Action's chunk chain (module docstring):
    after the recorded head, extended by the chunks after it that link on and carry an
    earlier fence's valid MAC; everything else on the subject is ignored.

    The candidates are walked in seq order, not stream order: a chunk whose first
    publication was lost is sent again later and stored after its successors
    (`ChunkStream._confirm_oldest`), and a walk in stream order would stop there and fork
    the chain from genuine chunks. Where two candidates claim one seq and both link on (a
    superseded owner's late chunks beside its successor's), the one stored first is taken,
    as a reader's `ChunkSequencer` does."""
    head = record.head
    next_seq, prev, stream_seq = (
        (head.seq + 1, head.sha256, head.stream_seq) if head is not None else (0, None, 0)
    )
    subjects = publisher.subjects
    tail = await drain(
        publisher.js,
        subjects.stream_name("chunks"),
        subjects.chunks(endpoint_id, action_id),
        start_seq=stream_seq + 1,
        limit=SCAN_LIMIT,
    )
    # seq -> (prev_sha256, sha256, stream seq) of each MAC-proven chunk, in stream order.
    candidates: dict[int, list[tuple[str | None, str, int]]] = {}
    for msg in tail:
        data = msg.data or b""
        try:
            link, _ = decode_chunk(data)
        except EnvelopeRejected:
            continue
        if link.seq < next_seq:
            continue
        sha = hashlib.sha256(data).hexdigest()
        mac = (msg.headers or {}).get(CHAIN_MAC_HEADER)
        if not mac_is_valid(mac, sha, record.chain_keys, fence):
            continue
        candidates.setdefault(link.seq, []).append((link.prev_sha256, sha, msg.seq or 0))
    adopted = 0
    while (found := candidates.get(next_seq)) is not None:
        linked = next((c for c in found if c[0] == prev), None)
        if linked is None:
            break
        _, prev, stored_at = linked
        next_seq, stream_seq = next_seq + 1, stored_at or stream_seq
        adopted += 1
    return ChainStart(next_seq, prev, stream_seq, adopted)


__all__ = [
    "CHAIN_MAC_HEADER",
    "ChainStart",
    "ChunkHead",
    "chain_mac",
    "continue_chain",
    "mac_is_valid",
    "new_chain_key",
]
