"""Which chunks on a child's chunk subject are the child's: what `aip_action_events` passes.

Anyone who may publish on a chunk subject can put anything there, so a message is a chunk
of the child only when it is an AIP `stream_chunk` Envelope (`worker.wire.chunks`) naming
the child, and only along the hash chain its executor wrote (each chunk names, in its
extension's `prev_sha256`, the sha256 of the exact bytes of the one before it):

- once the child's signed result is on the bus, the chain is walked back from the chunk
  hash the result names (`last_chunk_sha256`) to chunk 0: exactly the executor's chunks,
  whatever else was published beside them (`verified: true`);
- before that, the chain is followed forward from chunk 0, first come first served: a
  chunk that does not name its predecessor's hash, skips a seq, or repeats one is left out
  (`verified: false`: a forger who links to the real last chunk is indistinguishable until
  the result arrives, docs/security.md).

A message that does not decode (not JSON, not a chunk Envelope) is skipped, never fatal:
before, one non-JSON message on the subject broke every later `aip_action_events` of that
child. The events handed on are the chunks in the project's own form (`schemas/chunk.py`:
`seq`, `kind`, `payload`, `provider_event`…), not the Envelopes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.chunk import DoneChunk, ErrorChunk
from schemas.errors import EnvelopeRejected
from worker.trust.responses import sha256_hex
from worker.wire.chunks import decode_chunk

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Link:
    """One decodable chunk of the child as stored: its hash, its fields, its JSON (the
    chunk's own form, as an event of `aip_action_events`) and its AIP StreamChunk body as
    published (what an events page passes on, worker/gateway/facade.py)."""

    sha256: str
    seq: int
    prev_sha256: str | None
    terminal: bool
    document: dict[str, Any]
    body: dict[str, Any]


@dataclass
class ChunkReader:
    """Collects what a chunk subject holds for one child (`add`), then picks its chain."""

    action_id: str
    links: list[Link] = field(default_factory=list)
    #: Messages skipped because they did not decode as a chunk of this child.
    skipped: int = 0

    def add(self, data: bytes) -> Link | None:
        """Keep `data` if it is a chunk of this child (None, counted, if not)."""
        try:
            chunk, opened = decode_chunk(data)
        except EnvelopeRejected:
            self.skipped += 1
            return None
        document = msgspec.to_builtins(chunk)
        if chunk.action_id != self.action_id or not isinstance(document, dict):
            self.skipped += 1
            return None
        link = Link(
            sha256=sha256_hex(data),
            seq=chunk.seq,
            prev_sha256=chunk.prev_sha256,
            terminal=isinstance(chunk, DoneChunk | ErrorChunk),
            document=document,
            body=opened.payload,
        )
        self.links.append(link)
        return link

    def forward(self) -> list[Link]:
        """The chain from chunk 0 as far as each chunk names the one before it."""
        chain: list[Link] = []
        for link in self.links:
            if not chain:
                if link.seq == 0 and link.prev_sha256 is None:
                    chain.append(link)
                continue
            last = chain[-1]
            if last.terminal:
                break
            if link.seq == last.seq + 1 and link.prev_sha256 == last.sha256:
                chain.append(link)
        return chain

    def backward(self, last_sha256: str) -> list[Link] | None:
        """The chain ending in the chunk whose hash is `last_sha256`, back to chunk 0;
        None when that chunk or a link to chunk 0 is missing (not all stored yet, or aged
        out)."""
        by_hash = {link.sha256: link for link in self.links}
        chain: list[Link] = []
        current = by_hash.get(last_sha256)
        while current is not None:
            chain.append(current)
            if current.seq == 0:
                return None if current.prev_sha256 is not None else chain[::-1]
            prev = current.prev_sha256
            found = by_hash.get(prev) if prev is not None else None
            if found is None or found.seq != current.seq - 1:
                return None
            current = found
        return None
