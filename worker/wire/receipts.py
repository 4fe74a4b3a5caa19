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
  (`python -m tests.bench.aip_receipt_sealing`). The audit log frames its receipts with
  `ReceiptFramer`: `encode_receipt`'s bytes, spliced into text printed once.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from schemas.aip.audit import ReceiptChain
from schemas.audit import Receipt, ReceiptEvent
from worker.aip.canonical import PLAIN_ENCODER, canonical_bytes, plain_bytes, plain_scalar
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


class ReceiptFramer:
    """`encode_receipt` for the receipts one process emits, with what they share printed once.

    An operator Action leaves ~8 receipts, each framed by `encode_receipt` as dicts printed
    by the sorted encoder three times over (the receipt for its hash, with its hash, the
    Envelope around it): ~10 us a receipt, most of the audit log's CPU per Action. Canonical
    JSON prints an object's members in sorted order whatever their values, so the bytes of
    a receipt and its Envelope are fixed text around a few values: here the fixed text is
    written once, the values the receipts repeat (the worker's actor, the Action's and
    endpoint's ids, the did of the signer, the millisecond's time) are kept printed from the
    receipt before, and the receipt's own values (its details, ids, fence, link) are printed
    and spliced in. The receipt's bytes without `hash` are the same bytes with `hash`
    spliced in after `data`, and the Envelope embeds the latter as they are.

    A receipt whose facts are not all of the types the splice prints exactly (details that
    are not plain JSON scalars under str keys, an id that is not a `str`, an integer out of
    range, a lone surrogate) is framed by `encode_receipt` itself, so the bytes (or the
    refusal) are `encode_receipt`'s in every case (`tests/unit/test_wire_receipt_frame.py`).
    Not thread-safe: one per `AuditLog`, used from its event loop."""

    __slots__ = (
        "_action_id",
        "_action_json",
        "_actor",
        "_did_from",
        "_did_security",
        "_endpoint_id",
        "_endpoint_json",
        "_ms",
        "_ms_sent_at",
        "_signer",
        "_worker_id",
        "_worker_tail",
    )

    def __init__(self) -> None:
        self._action_id: str | None = None
        self._action_json = b""
        self._endpoint_id: str | None = None
        self._endpoint_json = b""
        self._worker_id: str | None = None
        #: `actor` (and `from` unsigned): `{"id":…,"kind":"service"}`.
        self._actor = b""
        #: The end of `data`: `,"worker_id":…}`.
        self._worker_tail = b""
        self._signer: AipSigner | None = None
        #: `from` of a signed Envelope, and the start of its `security`, for `_signer`.
        self._did_from = b""
        self._did_security = b""
        self._ms = -1
        self._ms_sent_at = b""

    def encode(self, receipt: Receipt, *, signer: AipSigner | None) -> tuple[bytes, str]:
        """What `encode_receipt(receipt, signer=signer)` returns."""
        action_id, endpoint_id = receipt.action_id, receipt.endpoint_id
        worker_id, receipt_id, trace_id = receipt.worker_id, receipt.receipt_id, receipt.trace_id
        event, fence, ms = receipt.event, receipt.fence, receipt.ts_unix_ms
        details, previous = receipt.details, receipt.prev_sha256
        if (
            type(action_id) is not str
            or type(endpoint_id) is not str
            or type(worker_id) is not str
            or type(receipt_id) is not str
            or (trace_id is not None and type(trace_id) is not str)
            or (previous is not None and type(previous) is not str)
            or type(event) is not ReceiptEvent
            or type(fence) is not int
            or not _I64_MIN <= fence <= _I64_MAX
            or type(ms) is not int
            or not 0 <= ms <= _MAX_MS
            or type(details) is not dict
        ):
            return encode_receipt(receipt, signer=signer)
        for key, item in details.items():
            if type(key) is not str or (type(item) not in _AS_IS and not plain_scalar(item)):
                return encode_receipt(receipt, signer=signer)
        if ms != self._ms:
            self._ms_sent_at = _print(timestamp_of_ms(ms))
            self._ms = ms
        try:
            if action_id != self._action_id:
                self._action_json = _print(action_id)
                self._action_id = action_id
            if endpoint_id != self._endpoint_id:
                self._endpoint_json = _print(endpoint_id)
                self._endpoint_id = endpoint_id
            if worker_id != self._worker_id:
                self._actor = _print(actor_of(receipt))
                self._worker_tail = b',"worker_id":' + _print(worker_id) + b"}"
                self._worker_id = worker_id
                self._signer = None  # `from` with a did names the worker too
            value = event._value_
            head = b"".join((
                b'{"actor":', self._actor,
                b',"data":{"action_id":', self._action_json,
                b',"details":', _print(details),
                b',"endpoint_id":', self._endpoint_json,
                b',"event":"', value.encode(),
                b'","fence":', b"%d" % fence,
                b',"receipt_id":', _print(receipt_id),
                b',"trace_id":' + _print(trace_id) if trace_id is not None else b"",
                b',"ts_unix_ms":', b"%d" % ms, self._worker_tail,
                b",",
            ))  # fmt: skip
            rid = hashlib.sha256(receipt_id.encode()).hexdigest()[:32]
            tail = b"".join((
                b'"id":"rcpt_', rid.encode(),
                b'","occurred_at":', self._ms_sent_at,
                b',"previous_hash":' + _print(previous) if previous is not None else b"",
                _TYPE_TAILS[value],
            ))  # fmt: skip
        except UnicodeEncodeError:  # a lone surrogate: `encode_receipt` refuses it as it does
            return encode_receipt(receipt, signer=signer)
        digest = hashlib.sha256(head + tail).hexdigest()
        hashed = digest.encode()
        body = b"".join((
            _ENVELOPE_HEAD, self._action_json,
            b',"receipts":[', head, b'"hash":"', hashed, b'",', tail,
            b'],"root_hash":"', hashlib.sha256(hashed).hexdigest().encode(),
            b'"}},"from":',
        ))  # fmt: skip
        message_id = b'"message_id":"msg_' + rid.encode() + _MESSAGE_TYPE
        if signer is None:
            unsigned = (body, self._actor, b",", message_id, _SENT_AT, self._ms_sent_at, b"}")
            return b"".join(unsigned), digest
        if signer is not self._signer:
            did = _print(signer.did)
            self._did_from = b'{"did":' + did + b"," + self._actor[1:]
            self._did_security = b',"security":{"did":' + did
            self._signer = signer
        # AIP's recipe as `encode_receipt` follows it: the signature covers the Envelope
        # with `security` but its `signature`.
        framed = (body, self._did_from, b",", message_id, self._did_security)
        signature = signer.sign(b"".join((*framed, b"}", _SENT_AT, self._ms_sent_at, b"}")))
        return b"".join((
            *framed, b',"signature":', _print(signature), b"}", _SENT_AT, self._ms_sent_at, b"}"
        )), digest  # fmt: skip


#: Detail values the sorted encoder prints exactly whatever they hold (`plain_scalar`
#: without the call; numbers are checked by it).
_AS_IS: Final = frozenset({str, bool, type(None)})
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
#: The last millisecond of year 9999: `timestamp_of_ms` refuses any later one, and a
#: receipt that late is left to `encode_receipt` to refuse in its own order.
_MAX_MS: Final = 253_402_300_799_999
#: The sorted encoder `plain_bytes` prints with, without its wrapper (`ReceiptFramer`
#: turns a lone surrogate's UnicodeEncodeError into a fallback once per receipt).
_print: Final = PLAIN_ENCODER.encode
#: Each event's `receipt_type` member, the receipt's last, and the receipt's end.
_TYPE_TAILS: Final[dict[str, bytes]] = {
    event.value: b',"receipt_type":' + plain_bytes(RECEIPT_TYPES.get(event, OTHER_TYPE)) + b"}"
    for event in ReceiptEvent
}
_ENVELOPE_HEAD: Final = (
    b'{"aip_version":' + plain_bytes(AIP_VERSION) + b',"body":{"receipt_chain":{"chain_id":'
)
_MESSAGE_TYPE: Final = b'","message_type":' + plain_bytes(CHAIN_TYPE)
_SENT_AT: Final = b',"sent_at":'


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
    "ReceiptFramer",
    "aip_receipt",
    "decode_receipt",
    "encode_receipt",
    "hash_of",
]
