"""One process-wide bound on the chunk bytes the gateway's chunk followers hold.

Each follow (worker/gateway/chunk_follower.py) holds chunks it may not release yet: read
ahead of a missing seq, on the branches of a fork, or, under the native binding's
`Release.VOUCHED`, every chunk until the signed result vouches for the chain. Each follow is
bounded on its own (`MAX_HELD_BYTES`), but a gateway runs many follows at once (up to
`AIPD_AIP_MAX_IN_FLIGHT` per binding), so without a shared bound a publisher on chunk
subjects could make one gateway hold the per-follow bound in every one of them.

The budget is charged by the follow as what it holds grows and given back as it shrinks
and when the follow ends; a follow that cannot take more ends its release with
`over_bound` (its binding's answer still goes, and the chunks stay readable by
`action_events_request`), while the other follows go on.
"""

from __future__ import annotations


class HeldChunkBudget:
    """The bytes of held chunks this process may have at once, over all its follows."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        #: Bytes charged by the follows now running.
        self.held_bytes = 0

    def take(self, count: int) -> bool:
        """Charge `count` more bytes if they fit (give them back after); False if not."""
        if self.held_bytes + count > self.max_bytes:
            return False
        self.held_bytes += count
        return True

    def give(self, count: int) -> None:
        """Give back `count` bytes charged with `take`."""
        self.held_bytes = max(0, self.held_bytes - count)
