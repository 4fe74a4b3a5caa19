"""Signed responses: a worker signs its results and DLQ entries, and chains its chunks.

NATS does not tell a subscriber who published, so a consumer that trusted the results
subject trusted everyone with publish rights on it. Each worker therefore holds its own user
nkey (`AIPD_WORKER_SIGNING_KEY_FILE`) and signs, the same way a gateway signs an envelope
(`Aip-Signer` / `Aip-Signature` headers, Ed25519 over the exact bytes):

* every ActionResult, as an AIP `action_result` Envelope with an AIP signature
  (`security.signature`, the same key as a `did:key`: `worker.wire.results`), whose
  `last_chunk_sha256` is the hash of the Action's last chunk;
* every DLQ entry, as an AIP `action_status` Envelope (`dead_lettered`) with an AIP
  signature (`worker.wire.dead_letters`), covering the reason, the refused bytes kept and
  their size and sha256;
* every Escalation, as an AIP `escalation` Envelope with an AIP signature
  (`worker.wire.escalations`), so a reader (`escalations list | show | resolve`, the
  `escalations_open` gauge) ignores one that anyone with publish rights on the escalations
  subject forged;
* audit Receipts, as AIP Receipts in `receipt_chain` Envelopes (`worker.wire.receipts`), in
  segments (`worker.bus.audit`: each names the AIP hash of the one before, the segment's
  last Envelope is AIP-signed), so `audit` excludes a receipt another role appended.
* every ChannelDelivery and every ingress ChannelMessage (docs/channels.md), so the egress
  intake and the ingress cursor believe only what a trusted worker produced
  (`worker_trust`, `verify_worker_signed`).

Chunks are not signed one by one (a signature per chunk would cost the hot path an Ed25519
signature per provider event): each chunk Envelope carries `prev_sha256`, the hash of the
exact bytes of the chunk before it, so the signed result anchors the whole chain. A
consumer verifies each link as chunks arrive and the chain's end against the signed result
(`ChunkChain`).

A worker that takes an Action over continues the chain from the head its predecessor
recorded (fenced) and the chunks after it that carry a predecessor's chain MAC, never from
whatever is last on the subject (`worker.execution.chunk_chain`).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nkeys

from schemas.audit import Receipt
from schemas.chunk import StreamChunk
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.escalation import Escalation, EscalationResolution
from schemas.result import ActionResult
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner, VerifiedEnvelope
from worker.errors import (
    ConnectorError,
    ResponseSigningConfigError,
    SecretFileError,
    UnverifiedResponse,
)
from worker.secret_files import check_owner_only
from worker.trust.signing import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    TrustedGatewayKeys,
    _user_pair,
    decode_user_public_key,
    verify_envelope,
)
from worker.wire.chunks import decode_chunk
from worker.wire.dead_letters import DeadLetter, decode_dead_letter
from worker.wire.envelopes import DEFAULT_MAX_ENVELOPE_BYTES, Opened
from worker.wire.escalations import decode_escalation, decode_resolution
from worker.wire.receipts import decode_receipt
from worker.wire.results import decode_result

log = logging.getLogger(__name__)

_UNSIGNED_WARNING = (
    "AIPD_ALLOW_UNSIGNED_RESPONSES is on and no AIPD_WORKER_SIGNING_KEY_FILE is set: results "
    "and DLQ entries are published unsigned, and a consumer cannot tell them from ones "
    "forged by anyone with publish rights. Development only."
)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class ResponseSigner:
    """This worker's signing key: `headers` signs one payload the nkey way (channel
    messages), `aip` signs AIP Envelopes (results, escalations, DLQ entries, receipts)."""

    _pair: nkeys.KeyPair = field(repr=False)
    public_key: str
    #: The same Ed25519 key as an AIP signer (`did:key` of `public_key`).
    aip: AipSigner = field(repr=False)

    @classmethod
    def load(cls, path: Path) -> ResponseSigner:
        """From an owner-only seed file; any problem is a ResponseSigningConfigError."""
        what = "AIPD_WORKER_SIGNING_KEY_FILE"
        try:
            check_owner_only(path, what=what)
            seed = path.read_bytes()
            pair = _user_pair(seed)
            aip = AipSigner.from_nkey_seed(seed.strip())
        except (SecretFileError, OSError, ValueError, AipWireError) as exc:
            raise ResponseSigningConfigError(
                f"{ErrorCode.HOST_RESPONSE_SIGNING.value}: the worker cannot sign: {exc}"
            ) from None
        return cls(pair, pair.public_key.decode(), aip)

    @classmethod
    def from_seed(cls, seed: bytes) -> ResponseSigner:
        """From a user nkey seed already read (tests, tools); ValueError if it is not one."""
        pair = _user_pair(seed)
        return cls(pair, pair.public_key.decode(), AipSigner.from_nkey_seed(seed.strip()))

    def headers(self, payload: bytes) -> dict[str, str]:
        """`Aip-Signer` and `Aip-Signature` for `payload` (the gateway's envelope format)."""
        signature = self._pair.sign(payload)
        return {
            SIGNER_HEADER: self.public_key,
            SIGNATURE_HEADER: base64.urlsafe_b64encode(signature).rstrip(b"=").decode(),
        }


def signer_from_settings(path: Path | None, *, allow_unsigned: bool) -> ResponseSigner | None:
    """The worker's signer; None when unsigned responses are allowed (warned) or no key is
    set (logged as an error: every Action is then refused with `response_signing`)."""
    if path is not None:
        return ResponseSigner.load(path)
    if allow_unsigned:
        log.warning(_UNSIGNED_WARNING)
    else:
        log.error(
            "AIPD_WORKER_SIGNING_KEY_FILE is not set: every Action is refused with "
            "connector_host.response_signing until the worker has a signing key"
        )
    return None


def cannot_sign() -> ConnectorError:
    """The refusal of a worker that has no signing key (and may not answer unsigned)."""
    return ConnectorError(
        ErrorCode.HOST_RESPONSE_SIGNING,
        "this worker has no response signing key (AIPD_WORKER_SIGNING_KEY_FILE); "
        "nothing was sent to Hermes",
    )


# --- the consumer's side -------------------------------------------------------------------


def _verify(payload: bytes, headers: Mapping[str, str], trusted: TrustedGatewayKeys) -> str:
    try:
        return verify_envelope(payload, headers, trusted)
    except ConnectorError as exc:
        reason = exc.message.removeprefix("envelope signature: ")
        raise UnverifiedResponse(f"response signature: {reason}") from None


def verify_worker_signed(
    payload: bytes, headers: Mapping[str, str] | None, trusted: TrustedGatewayKeys
) -> str:
    """The trusted worker key that signed exactly `payload` (a channel delivery or an
    ingress message); UnverifiedResponse otherwise."""
    return _verify(payload, headers or {}, trusted)


def worker_trust(
    signer: ResponseSigner | None, keys_file: Path | None
) -> TrustedGatewayKeys | None:
    """The worker keys a worker believes for what workers publish to workers (channel
    deliveries, ingress messages): its own key, plus `AIPD_TRUSTED_WORKER_KEYS_FILE`'s.

    None only for a worker without a signing key and without the file (unsigned responses
    allowed, development only): it then believes unsigned messages, as it publishes them.
    A file that cannot be read is a TrustConfigError (exit 2).
    """
    import nacl.signing

    keys: dict[str, nacl.signing.VerifyKey] = {}
    if keys_file is not None:
        loaded = TrustedGatewayKeys.load(keys_file, what="AIPD_TRUSTED_WORKER_KEYS_FILE")
        keys.update({key: v for key in loaded if (v := loaded.get(key)) is not None})
    if signer is not None:
        keys[signer.public_key] = nacl.signing.VerifyKey(decode_user_public_key(signer.public_key))
    return TrustedGatewayKeys(keys) if keys else None


def trusted_key_of(verified: VerifiedEnvelope, trusted: TrustedGatewayKeys) -> str | None:
    """The entry of `trusted` (a `U…` nkey or a did:key: the same key either way) whose key
    made the AIP signature `verified`; None when it is none of them."""
    return trusted.signer_of(verified.public_key)


def check_worker_signed(opened: Opened, trusted: TrustedGatewayKeys, *, what: str) -> str:
    """The trusted worker key that signed the Envelope `opened` (whose signature, when it
    has one, `open_envelope` verified); UnverifiedResponse when it is unsigned or another
    key signed it."""
    verified = opened.verified
    if verified is None:
        raise UnverifiedResponse(f"{what} signature: the Envelope is unsigned")
    name = trusted_key_of(verified, trusted)
    if name is None:
        raise UnverifiedResponse(
            f"{what} signature: signer {verified.did} is not a trusted worker key"
        )
    return name


def open_result(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[ActionResult, Opened]:
    """`worker.wire.results.decode_result`, with every refusal (not an `action_result`
    Envelope of ours, a signature that does not verify) an UnverifiedResponse: what is on
    a results subject and is not a result is something no trusted worker published."""
    try:
        return decode_result(data, max_bytes=max_bytes)
    except EnvelopeRejected as exc:
        raise UnverifiedResponse(f"result: {exc.reason}") from None


def verify_result(
    data: bytes,
    trusted: TrustedGatewayKeys | None,
    *,
    max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
) -> ActionResult:
    """The result in the Envelope `data` when a trusted worker key signed it (`trusted`
    None: any well-formed result, signed or not, is believed); UnverifiedResponse else."""
    result, opened = open_result(data, max_bytes=max_bytes)
    if trusted is not None:
        check_worker_signed(opened, trusted, what="result")
    return result


def verify_dead_letter(
    data: bytes,
    trusted: TrustedGatewayKeys | None,
    *,
    max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
) -> tuple[DeadLetter, str | None]:
    """The DLQ entry in the Envelope `data` and the trusted worker key that signed it
    (`trusted` None: any well-formed entry, signed or not, with no signer named).
    UnverifiedResponse for anything else: not one of our DLQ entries, a signature that does
    not verify, an unsigned entry, or one another key signed."""
    try:
        entry, opened = decode_dead_letter(data, max_bytes=max_bytes)
    except EnvelopeRejected as exc:
        raise UnverifiedResponse(f"DLQ entry: {exc.reason}") from None
    if trusted is None:
        return entry, None
    return entry, check_worker_signed(opened, trusted, what="DLQ entry")


def verify_escalation(
    data: bytes,
    trusted: TrustedGatewayKeys | None,
    *,
    max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
) -> Escalation:
    """The escalation in the Envelope `data` when a trusted worker key signed it (`trusted`
    None: any well-formed one, signed or not, development only). UnverifiedResponse for
    anything else: an Envelope that is not one of our escalations, one whose signature does
    not verify, an unsigned one, or one another key signed."""
    try:
        escalation, opened = decode_escalation(data, max_bytes=max_bytes)
    except EnvelopeRejected as exc:
        raise UnverifiedResponse(f"escalation: {exc.reason}") from None
    if trusted is not None:
        check_worker_signed(opened, trusted, what="escalation")
    return escalation


def read_resolution_copy(
    data: bytes, *, signed: bool, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> EscalationResolution:
    """The resolution in the Envelope `data` (a copy on `…escalations.resolved`; the
    write-once record in Redis decides). Its signature, when present, must verify, and
    with `signed` it must be present: UnverifiedResponse otherwise. Who may resolve is
    not decided here: the copy is only ever shown, never acted on."""
    try:
        resolution, opened = decode_resolution(data, max_bytes=max_bytes)
    except EnvelopeRejected as exc:
        raise UnverifiedResponse(f"resolution: {exc.reason}") from None
    if signed and opened.verified is None:
        raise UnverifiedResponse("resolution signature: the Envelope is unsigned")
    return resolution


def read_receipt(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
) -> tuple[Receipt, str, Opened]:
    """`worker.wire.receipts.decode_receipt` (the receipt, its AIP hash, its Envelope, whose
    signature, when it has one, verified), every refusal an UnverifiedResponse: what is on
    an audit subject and is not one of our receipts is something no trusted process filed."""
    try:
        return decode_receipt(data, max_bytes=max_bytes)
    except EnvelopeRejected as exc:
        raise UnverifiedResponse(f"receipt: {exc.reason}") from None


def verify_receipt(data: bytes, trusted: TrustedGatewayKeys) -> tuple[Receipt, str]:
    """The receipt in the Envelope `data` and the trusted key that signed it;
    UnverifiedResponse when it is not a receipt, unsigned, or signed by another key."""
    receipt, _, opened = read_receipt(data)
    return receipt, check_worker_signed(opened, trusted, what="receipt")


def read_chunk(data: bytes, *, max_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES) -> StreamChunk:
    """The chunk in the `stream_chunk` Envelope `data`; UnverifiedResponse when it is not
    one (anyone with publish rights on a chunk subject may put anything there)."""
    try:
        return decode_chunk(data, max_bytes=max_bytes)[0]
    except EnvelopeRejected as exc:
        raise UnverifiedResponse(f"chunk: {exc.reason}") from None


class ChunkChain:
    """Follows one Action's chunks as published and checks every link.

    `add` checks that a chunk names the hash of the one before it (from the first chunk
    seen, which may be a later seq when reading from `from_seq`); `close` checks that the
    signed result names the hash of the last chunk. Until `close` succeeds the chunks are
    unverified: a forged chunk is detected at the next link or at the end.
    """

    def __init__(self) -> None:
        self.last_sha256: str | None = None
        self.last_seq: int | None = None

    def add(self, data: bytes, chunk: StreamChunk | None = None) -> StreamChunk:
        """Check the chunk Envelope `data` (`chunk`: its decoding, when the caller has it)."""
        chunk = chunk if chunk is not None else read_chunk(data)
        if self.last_seq is not None:
            if chunk.seq != self.last_seq + 1 or chunk.prev_sha256 != self.last_sha256:
                raise UnverifiedResponse(
                    f"chunk {chunk.seq} of {chunk.action_id} does not follow chunk "
                    f"{self.last_seq}: the chunk chain is broken"
                )
        elif chunk.seq == 0 and chunk.prev_sha256 is not None:
            raise UnverifiedResponse(f"chunk 0 of {chunk.action_id} names a predecessor")
        self.last_seq = chunk.seq
        self.last_sha256 = sha256_hex(data)
        return chunk

    def close(self, result: ActionResult) -> None:
        """Raise unless `result` (already signature-verified) ends this chain."""
        if result.last_chunk_sha256 is None or result.last_chunk_sha256 != self.last_sha256:
            raise UnverifiedResponse(
                f"the signed result of {result.action_id} does not end the chunk chain read"
            )


#: Chunks a reader holds ahead of a missing one before it calls the stream broken.
MAX_HELD_CHUNKS = 1024


class ChunkSequencer:
    """Puts one Action's chunks, as read from the subject, in seq order, each once.

    A chunk is released only when the one before it was: a chunk read ahead of a missing
    seq (a publication whose confirmation was lost is sent again later, so it is stored
    after its successors) is held until the missing one arrives, instead of being passed on
    with a gap. A second copy of a released seq with the same bytes is a republish and is
    dropped; with other bytes it is a fork: two chunks claim the same place in the chain,
    and at most one was published by the Action's owner (worker.execution.chunk_chain), so
    the reader is told (`UnverifiedResponse`) rather than left to guess.
    """

    def __init__(self, from_seq: int = 0) -> None:
        self.expected = from_seq
        self._held: dict[int, bytes] = {}
        #: sha256 of the last released chunk: what a second copy of its seq is compared to.
        self._last_sha256: str | None = None

    def add(self, data: bytes, seq: int) -> list[bytes]:
        """The chunks `data` (at `seq`) releases, oldest first (often just itself)."""
        if seq < self.expected:
            if seq == self.expected - 1 and sha256_hex(data) != self._last_sha256:
                raise UnverifiedResponse(
                    f"two different chunks claim seq {seq}: the chunk chain forks (one was forged)"
                )
            return []
        if seq > self.expected:
            if seq not in self._held and len(self._held) >= MAX_HELD_CHUNKS:
                raise UnverifiedResponse(
                    f"chunk {self.expected} is missing while {len(self._held)} later "
                    "chunks wait for it"
                )
            self._held.setdefault(seq, data)
            return []
        released = [data]
        self.expected = seq + 1
        while self.expected in self._held:
            released.append(self._held.pop(self.expected))
            self.expected += 1
        self._last_sha256 = sha256_hex(released[-1])
        return released
