"""The audit subject's wire: each internal `Receipt` as an AIP Receipt, hash-chained as AIP
chains receipts, in an `aip.audit.v1.receipt_chain` Envelope, and back (docs/publishing.md
"Audit receipts"; shared/reference/aip-1.0-wire.md §1.15, §2.7, §7.13).

- One Envelope per receipt, sent at once (a worker killed mid-run leaves every receipt it
  emitted): `chain_id` is the Action id, `receipts` the one receipt, `root_hash` the sha256
  of its `hash` (AIP's rule over a chain of one).
- The AIP Receipt: `id` = `rcpt_` + 32 hex of the sha256 of our `receipt_id`;
  `receipt_type` the nearest AIP type (`RECEIPT_TYPES`; `policy_decision` for our events
  AIP has no type for); `actor` the process that decided (`kind` service); `occurred_at`;
  `data` our receipt's fields (its `event` names it exactly); `previous_hash` the `hash` of
  the receipt this process sent before it about the same Action in the same segment;
  `hash` = sha256 (hex) of the canonical JSON of the receipt without `hash`.
- Signed in segments (`worker.bus.audit`): the Envelope of a segment's last receipt is
  AIP-signed, and its receipt's hash covers `previous_hash`, so one signature vouches for
  every receipt it links back to. The Envelope is framed and signed here without `seal`'s
  checks: it is built from a Receipt that is already well-formed, and `seal` cost ~80 µs a
  receipt on the shared machine, 8 of them ~45 % of an Action's CPU
  (`python -m tests.bench.aip_receipt_sealing`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from schemas.aip.audit import ReceiptChain
from schemas.audit import Receipt, ReceiptEvent
from worker.aip.canonical import canonical_bytes, plain_bytes, plain_scalar
from worker.aip.envelope import AIP_VERSION
from worker.aip.errors import NotCanonicalizable
from worker.aip.signing import AipSigner
from worker.wire.actions import timestamp_of_ms
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    invalid,
    open_envelope,
    open_payload,
)

CHAIN_TYPE: Final = "aip.audit.v1.receipt_chain"
_TYPES: Final = frozenset({CHAIN_TYPE})

#: Our events that have an AIP receipt type of their own; every other is `policy_decision`.
RECEIPT_TYPES: Final[dict[ReceiptEvent, str]] = {
    ReceiptEvent.RECEIVED: "request_received",
    ReceiptEvent.ADMITTED: "action_accepted",
    ReceiptEvent.PROVIDER_REQUEST: "tool_executed",
    ReceiptEvent.TOOL_CALL: "tool_executed",
    ReceiptEvent.SETTLED: "result_returned",
}
OTHER_TYPE: Final = "policy_decision"


def actor_of(receipt: Receipt) -> dict[str, str]:
    """The Principal that decided: the worker (or tool) that filed the receipt."""
    return {"id": receipt.worker_id, "kind": "service"}


def aip_receipt(receipt: Receipt) -> dict[str, Any]:
    """`receipt` as an AIP Receipt in upstream's serialized form, `hash` included."""
    out = _members(receipt, _data_of(receipt))
    out["hash"] = hash_of(out)
    return out


def _data_of(receipt: Receipt) -> dict[str, Any]:
    """The AIP Receipt's `data`: our receipt's fields, without the link and an absent trace."""
    data: dict[str, Any] = msgspec.to_builtins(receipt)
    data.pop("prev_sha256", None)
    if data.get("trace_id") is None:
        data.pop("trace_id", None)
    return data


def _members(receipt: Receipt, data: Any) -> dict[str, Any]:
    """The AIP Receipt's members but `hash`, with `data` as given (a dict, or its bytes)."""
    out: dict[str, Any] = {
        "id": "rcpt_" + hashlib.sha256(receipt.receipt_id.encode()).hexdigest()[:32],
        "receipt_type": RECEIPT_TYPES.get(receipt.event, OTHER_TYPE),
        "actor": actor_of(receipt),
        "occurred_at": timestamp_of_ms(receipt.ts_unix_ms),
        "data": data,
    }
    if receipt.prev_sha256 is not None:
        out["previous_hash"] = receipt.prev_sha256
    return out


def hash_of(receipt: dict[str, Any]) -> str:
    """AIP's receipt hash: sha256 (hex) of the canonical JSON without `hash`."""
    without = {k: v for k, v in receipt.items() if k != "hash"}
    return hashlib.sha256(_canonical(without, receipt.get("data"))).hexdigest()


def _canonical(value: dict[str, Any], data: Any) -> bytes:
    """`canonical_bytes(value)` for a receipt or its Envelope, which this module builds
    from strings and bounded integers except for the receipt's `details`: when those are
    plain scalars, the value is plain JSON and the generic walk over the whole value (most
    of a receipt's framing cost) is skipped (`plain_bytes`)."""
    details = data.get("details") if isinstance(data, dict) else None
    if isinstance(details, dict) and all(plain_scalar(v) for v in details.values()):
        try:
            return plain_bytes(value)
        except NotCanonicalizable:
            pass  # a lone surrogate: the exact printer says so
    return canonical_bytes(value)


def encode_receipt(receipt: Receipt, *, signer: AipSigner | None) -> tuple[bytes, str]:
    """The wire bytes of one receipt's Envelope, signed by `signer` when given, and the
    receipt's AIP `hash` (what the next receipt of its segment names as `previous_hash`).

    The receipt's `data` (the only member that is not a short string) is canonicalised
    once and spliced, as `msgspec.Raw`, into the receipt for its hash, into the receipt
    with its hash, and into the Envelope (twice when signed: the bytes signed, then the
    bytes sent). Canonical JSON of an object is its sorted members' canonical JSON joined,
    so the bytes are the ones `canonical_bytes` of the whole would print; each re-encoding
    of `data` this saves was about a fifth of a receipt's CPU."""
    data = _data_of(receipt)
    members = _members(receipt, msgspec.Raw(_canonical(data, data)))
    digest = hashlib.sha256(plain_bytes(members)).hexdigest()
    members["hash"] = digest
    payload = {
        "chain_id": receipt.action_id,
        "receipts": [msgspec.Raw(plain_bytes(members))],
        "root_hash": hashlib.sha256(digest.encode()).hexdigest(),
    }
    envelope: dict[str, Any] = {
        "aip_version": AIP_VERSION,
        "message_type": CHAIN_TYPE,
        "message_id": "msg_" + members["id"].removeprefix("rcpt_"),
        "sent_at": members["occurred_at"],
        "from": actor_of(receipt),
        "body": {"receipt_chain": payload},
    }
    if signer is not None:
        # AIP's signing recipe (aip-1.0-wire.md §2.2) on a frame built here in upstream's
        # serialized form: `from` and `security` name the key, the signature covers the
        # canonical JSON of the rest.
        envelope["from"]["did"] = signer.did
        envelope["security"] = {"did": signer.did}
        envelope["security"]["signature"] = signer.sign(plain_bytes(envelope))
    return plain_bytes(envelope), digest


def decode_receipt(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[Receipt, str, Opened]:
    """The internal receipt in `data`, its AIP `hash` (recomputed: a receipt whose declared
    hash is not its own is refused), and the Envelope (signature, if any, verified: whom to
    trust is the caller's decision). The receipt's `prev_sha256` is its `previous_hash`.

    EnvelopeRejected for anything else: not a `receipt_chain` Envelope of exactly one
    receipt, a `root_hash` or `id` not derived as AIP and this module say, a chain id other
    than the receipt's Action, data that is not one of our receipts."""
    opened = open_envelope(data, message_types=_TYPES, max_bytes=max_bytes)
    chain = open_payload(opened, CHAIN_TYPE)
    assert isinstance(chain, ReceiptChain)
    if len(chain.receipts) != 1:
        raise invalid("receipt_chain: one receipt per Envelope on the audit subject")
    (linked,) = opened.payload["receipts"]
    declared = linked.get("hash")
    if not isinstance(declared, str) or hash_of(linked) != declared:
        raise invalid("receipt: its hash is not the sha256 of its canonical JSON")
    if chain.root_hash != hashlib.sha256(declared.encode()).hexdigest():
        raise invalid("receipt_chain: root_hash is not the sha256 of the receipt's hash")
    fields = linked.get("data")
    if not isinstance(fields, dict):
        raise invalid("receipt: data is not one of our receipts")
    try:
        receipt = msgspec.convert(
            {**fields, "prev_sha256": linked.get("previous_hash")}, Receipt, strict=True
        )
    except msgspec.ValidationError as exc:
        raise invalid(f"receipt: {exc}") from None
    if aip_receipt(receipt) != linked:
        raise invalid("receipt: id, type, actor or time not derived from its data")
    if chain.chain_id != receipt.action_id:
        raise invalid("receipt_chain: chain_id is not the receipt's Action")
    return receipt, declared, opened


__all__ = [
    "CHAIN_TYPE",
    "OTHER_TYPE",
    "RECEIPT_TYPES",
    "aip_receipt",
    "decode_receipt",
    "encode_receipt",
    "hash_of",
]
