"""The gateway's open-children index on the wire: one shard's open child ids, as a signed
AIP 1.0 `aip.lifecycle.v1.action_list` Envelope, and back (shared/reference/aip-1.0-wire.md
§1.7; worker/gateway/open_children.py keeps the index).

Why an ActionList: the shard message lists Actions with a time each, which is what AIP's
list of ActionStatus views is; an AIP reader of `aip.runtime.open.{shard}` needs nothing of
ours to read it. The mapping:

* each open child is one ActionStatus: `action_id`, `state` `accepted` (the gateway
  accepted the child; the index does not follow its later states, its queue entry on
  `aip.runtime.queue.{action_id}` does) and `updated_at`, the RFC 3339 time (milliseconds)
  it was added to the index, which the sweep reads back exactly;
* `total_size` is the number of open ids in the shard (the whole shard is one page: no
  `cursor`); the list is ordered by id, so one map is always the same body.

No extension is needed. The Envelope is signed by the gateway key like the other runtime
records (`worker.wire.runtime_records`); which keys a reader trusts is its decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from schemas.aip.lifecycle import ActionList, ActionState
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner
from worker.wire.actions import timestamp_of_ms
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    invalid,
    open_envelope,
    open_payload,
    seal,
    unix_ms_of,
)

MESSAGE_TYPE: Final = "aip.lifecycle.v1.action_list"
_TYPES: Final = frozenset({MESSAGE_TYPE})


def encode_open_shard(
    open_ids: Mapping[str, int], *, signer: AipSigner | None, sender: Mapping[str, Any]
) -> bytes:
    """The wire bytes of one shard: `open_ids` maps each open child id to the Unix ms it
    was added. EnvelopeRejected for a time that cannot be written (past year 9999)."""
    actions = [
        {
            "action_id": action_id,
            "state": ActionState.ACCEPTED.value,
            "updated_at": timestamp_of_ms(added_at),
        }
        for action_id, added_at in sorted(open_ids.items())
    ]
    try:
        return seal(
            MESSAGE_TYPE,
            {"actions": actions, "total_size": len(actions)},
            sender=sender,
            signer=signer,
        )
    except AipWireError as exc:
        raise invalid(f"the open-children shard cannot be sealed: {exc}") from None


def decode_open_shard(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[dict[str, int], Opened]:
    """The open child ids (to the Unix ms each was added) of a shard message, and the
    opened Envelope (its `verified` says who signed it). EnvelopeRejected for anything the
    AIP rules or ours refuse: another message type, a `total_size` that is not the number
    of Actions listed, an id listed twice, a time that is not exact RFC 3339."""
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)
    listed = open_payload(opened, MESSAGE_TYPE)
    assert isinstance(listed, ActionList)
    if listed.total_size != len(listed.actions) or listed.cursor is not None:
        raise invalid("an open-children shard is one whole page: total_size is its length")
    found: dict[str, int] = {}
    for status in listed.actions:
        added_at = unix_ms_of(status.updated_at)
        if added_at is None:
            raise invalid(f"updated_at {status.updated_at[:40]!r} is not an exact time")
        if status.action_id in found:
            raise invalid(f"{status.action_id[:40]} is listed twice")
        found[status.action_id] = added_at
    return found, opened


__all__ = ["MESSAGE_TYPE", "decode_open_shard", "encode_open_shard"]
