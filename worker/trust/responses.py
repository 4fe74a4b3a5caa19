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
* every ChannelDelivery (as its `session_chat` AIP Action) and every ingress message (as an
  AIP `message_created` Envelope), with an AIP signature (`worker.wire.channels`), so the
  egress intake, the ingress cursor and `session_messages` believe only what a trusted
  worker produced (`worker_trust`, `check_worker_signed`).

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

import msgspec
import nkeys

from schemas.aip.stream import StreamChunk as AipStreamChunk
from schemas.audit import Receipt
from schemas.chunk import DoneChunk, ErrorChunk, StreamChunk
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
from worker.wire.chunks import aip_chunk_of, decode_chunk
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
    """This worker's signing key: `headers` signs one payload the nkey way, `aip` signs AIP
    Envelopes (results, escalations, manifests, channel messages and deliveries, DLQ
    entries, receipts)."""

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


def worker_trust(
    signer: ResponseSigner | None, keys_file: Path | None
) -> TrustedGatewayKeys | None:
    """The worker keys a worker believes for what workers publish to workers (channel
    deliveries, ingress messages): its own key, plus `AIPD_TRUSTED_WORKER_KEYS_FILE`'s
    (a `U…` nkey or a did:key, the same key either way).

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


#: Chunks a reader holds (read ahead of a missing seq, or on the branches of a fork not yet
#: resolved) before it gives up: a reader's memory stays bounded whatever is published.
MAX_HELD_CHUNKS = 1024
#: Bytes of the chunks held, the same way (a chunk Envelope may be up to the envelope cap).
MAX_HELD_BYTES = 32 * 1024 * 1024
#: Hashes of released chunks remembered, so a second copy of a released seq is recognised
#: as a republish (same bytes) or as a competitor (other bytes) of what was released.
RELEASED_WINDOW = 4096


@dataclass(frozen=True, slots=True)
class SequencedChunk:
    """One chunk as read: its exact `stream_chunk` Envelope bytes, their sha256, and its
    decoding in the project's own form (`chunk`, `schemas/chunk.py`); `aip` is the AIP
    StreamChunk those bytes carry."""

    data: bytes
    sha256: str
    chunk: StreamChunk

    @property
    def terminal(self) -> bool:
        return isinstance(self.chunk, DoneChunk | ErrorChunk)

    @property
    def aip(self) -> AipStreamChunk:
        """The AIP 1.0 StreamChunk (`body.stream_chunk`), as an AIP reader gets it."""
        return aip_chunk_of(self.data)


class ChunkRetraction(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="retracted"):
    """Chunks a streaming reader already passed on, seqs `from_seq`..`to_seq`, are not on
    the chain the signed result vouches for: a superseded owner's late chunks, or a forgery,
    each alone at its seq when read (its competitor was stored after the reader passed it).

    A reader cannot take back what it passed on, and raising would leave the consumer with
    neither the Action's chunks nor a way to correct what it showed. So it says which seqs
    to forget (`sha256`: their hashes, in seq order), and the vouched chain follows from
    `from_seq` on. It is not an AIP message: it never leaves the reader (the CLI's `tail`
    prints it as a JSON line of `kind` `retracted`, beside the chunks)."""

    action_id: str
    from_seq: int
    to_seq: int
    sha256: tuple[str, ...]


#: What a `ChunkSequencer` passes on: a chunk, or a retraction of chunks it passed on.
Sequenced = SequencedChunk | ChunkRetraction


class ChunkSequencer:
    """Puts one Action's chunks, as read from the subject, in seq order, each once, and
    releases a chunk only when its link is verified.

    A chunk's link is verified when it names the hash of the chunk released before it (the
    first one read from `from_seq` excepted; chunk 0 names none) and no other chunk claims
    its seq, or, at a fork, when the signed result vouches for it (`vouch`: the chain walked
    back from `last_chunk_sha256` joins the chunks released). A chunk read ahead of a
    missing seq (a publication whose confirmation was lost is sent again later, stored after
    its successors) waits for it. A second copy of a seq with the same bytes is a republish
    and is dropped.

    Two different chunks at one seq (or a chunk naming another predecessor than the one
    released) make a fork: after a takeover a superseded owner's late chunks sit beside
    its successor's (docs/reliability.md bug 2), and anyone with publish rights can append a
    forgery. A reader cannot tell which is the Action's until the signed result names the
    chain's last hash, so from the fork on nothing is released: every branch is held
    (bounded: `MAX_HELD_CHUNKS`, `MAX_HELD_BYTES`), `needs_result` says so, and `vouch`
    releases the branch the result names; the others are dropped without an error (a
    genuine superseded branch and a forgery look alike, and neither is the Action's).

    When chunks already released turn out not to be on the vouched chain (a late chunk was
    alone at its seq when read, and its competitor was stored after the reader passed it),
    a `ChunkRetraction` of those seqs is released first, then the vouched chain from the
    seq where it leaves what was released: whatever the arrival order, a consumer that
    applies retractions ends with exactly the vouched chain. `hold_until_vouched` releases
    nothing before the signed result (every chunk is held as if at a fork), so it never
    releases a chunk off the vouched chain and never a retraction; `verify_terminal` holds
    the terminal chunk until the result vouches for it (a reader with trusted keys).
    `UnverifiedResponse` remains for what no arrival order of genuine chunks produces: a
    vouched chain that is malformed (not ending in a terminal chunk, seqs that do not
    follow) or that leaves the released chunks further back than the reader remembers.
    """

    def __init__(
        self,
        from_seq: int = 0,
        *,
        hold_until_vouched: bool = False,
        verify_terminal: bool = False,
        max_held: int = MAX_HELD_CHUNKS,
        max_held_bytes: int = MAX_HELD_BYTES,
    ) -> None:
        self.from_seq = from_seq
        #: The next seq to release.
        self.expected = from_seq
        #: sha256 of the last released chunk (None before the first).
        self.last_sha256: str | None = None
        self._verify_terminal = verify_terminal
        self._max_held, self._max_held_bytes = max_held, max_held_bytes
        self._held: dict[str, SequencedChunk] = {}
        self._at: dict[int, set[str]] = {}
        self._held_bytes = 0
        self._released: dict[int, str] = {}
        #: A fork was seen: nothing more is released until the result vouches.
        self.forked = hold_until_vouched
        #: The head the signed result names, once known, and the hash its walk back lacks.
        self._vouched: str | None = None
        self._missing: str | None = None
        self._action_id = ""
        #: Chunks dropped as off the vouched chain (superseded or forged), for the caller.
        self.dropped = 0
        #: Chunks released and then retracted (`ChunkRetraction`), for the caller.
        self.retracted = 0
        #: The terminal chunk was released: the chain is complete.
        self.done = False

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        """Bytes of the chunks held now (what a process-wide budget charges)."""
        return self._held_bytes

    @property
    def needs_result(self) -> bool:
        """Nothing more can be released without the signed result: a fork waits for it, or
        the next chunk is terminal and must be vouched for. Asked once a terminal chunk is
        held (the result follows it at once)."""
        if self._vouched is not None or self.done:
            return False
        if not any(held.terminal for held in self._held.values()):
            return False
        if self.forked:
            return True
        return self._verify_terminal and any(
            self._held[sha].terminal for sha in self._at.get(self.expected, ())
        )

    def add(self, data: bytes, chunk: StreamChunk | None = None) -> list[Sequenced]:
        """What `data` (decoded: `chunk`) releases, oldest first (often just itself)."""
        chunk = chunk if chunk is not None else read_chunk(data)
        seq, sha = chunk.seq, sha256_hex(data)
        if seq < self.from_seq or self.done or sha in self._held:
            return []
        if seq < self.expected:
            if self._released.get(seq) == sha or seq < self.expected - RELEASED_WINDOW:
                # A republish of a released chunk, or one too far back to compare: the walk
                # back from the result never needs it (the released chunks are hash-linked,
                # so a vouched chain that joins them at a remembered seq holds the rest).
                return []
            self.forked = True  # a competitor of a released chunk
        self._hold(SequencedChunk(data, sha, chunk))
        if self._vouched is not None:
            # The chain is known: what is held waits for the walk back to reach it (it may be
            # on the path, even behind the reader when released chunks are retracted).
            return self._follow_vouched() if sha == self._missing else []
        released: list[Sequenced] = [*self._release()]
        return released

    def vouch(self, last_chunk_sha256: str | None, action_id: str) -> list[Sequenced]:
        """The signed result names `last_chunk_sha256` as the chain's last chunk: release
        the chain that ends there, as far as it is read (the rest as it arrives), after a
        retraction of the released chunks it does not pass through."""
        if last_chunk_sha256 is None:
            raise UnverifiedResponse(
                f"the signed result of {action_id} names no last chunk: its chain cannot "
                "be verified"
            )
        self._vouched, self._missing = last_chunk_sha256, last_chunk_sha256
        self._action_id = action_id
        return self._follow_vouched()

    def _hold(self, item: SequencedChunk) -> None:
        if len(self._held) >= self._max_held or (
            self._held_bytes + len(item.data) > self._max_held_bytes
        ):
            raise UnverifiedResponse(
                f"{len(self._held)} chunks of {item.chunk.action_id} are held ({self._held_bytes} "
                f"bytes) waiting for chunk {self.expected} or for the signed result to "
                "resolve a fork: the reader stops rather than grow without bound"
            )
        self._held[item.sha256] = item
        self._at.setdefault(item.chunk.seq, set()).add(item.sha256)
        self._held_bytes += len(item.data)

    def _unhold(self, sha: str) -> SequencedChunk:
        item = self._held.pop(sha)
        shas = self._at[item.chunk.seq]
        shas.discard(sha)
        if not shas:
            del self._at[item.chunk.seq]
        self._held_bytes -= len(item.data)
        return item

    def _links(self, item: SequencedChunk) -> bool:
        """Does `item` (at `expected`) continue what was released?"""
        if self.last_sha256 is not None:
            return item.chunk.prev_sha256 == self.last_sha256
        return item.chunk.seq > 0 or item.chunk.prev_sha256 is None

    def _joins(self, item: SequencedChunk) -> bool:
        """Does `item` (on the vouched path) continue the released chunks at its seq: it
        names the chunk released just before it, or it is the first seq this reader reads?"""
        seq = item.chunk.seq
        if seq == self.from_seq:
            if seq == 0 and item.chunk.prev_sha256 is not None:
                self._off_chain("its chunk 0 names a predecessor")
            return True
        if seq <= self.expected and seq - 1 < self.expected - RELEASED_WINDOW:
            self._off_chain(f"it leaves the chunks read at seq {seq}, too far back to compare")
        prev = item.chunk.prev_sha256
        return prev is not None and self._released.get(seq - 1) == prev

    def _mark_released(self, item: SequencedChunk) -> None:
        self.expected = item.chunk.seq + 1
        self.last_sha256 = item.sha256
        self._released[item.chunk.seq] = item.sha256
        self._released.pop(item.chunk.seq - RELEASED_WINDOW, None)
        self.done = item.terminal

    def _release(self) -> list[SequencedChunk]:
        released: list[SequencedChunk] = []
        while not self.forked and not self.done:
            candidates = self._at.get(self.expected)
            if not candidates:
                break
            if len(candidates) > 1:
                self.forked = True
                break
            item = self._held[next(iter(candidates))]
            if not self._links(item):
                self.forked = True  # it continues another branch than the released one
                break
            if item.terminal and self._verify_terminal:
                break
            released.append(self._unhold(item.sha256))
            self._mark_released(item)
        return released

    def _follow_vouched(self) -> list[Sequenced]:
        """Walk back from the vouched head through the held chunks until the path joins the
        released chunks; retract the released ones after the join, release the path once it
        is whole, drop every other held chunk."""
        path: list[SequencedChunk] = []
        sha: str | None = self._vouched
        while True:
            item = self._held.get(sha) if sha is not None else None
            if item is None:
                if sha is None:
                    self._off_chain(f"its chunk {path[-1].chunk.seq} names no predecessor")
                if sha in self._released.values():
                    self._off_chain("it joins the chunks read at another seq than its own")
                self._missing = sha  # not read yet: the walk goes on when it arrives
                return []
            if path and item.chunk.seq != path[-1].chunk.seq - 1:
                self._off_chain(f"chunk {item.chunk.seq} precedes {path[-1].chunk.seq}")
            path.append(item)
            if self._joins(item):
                break
            if item.chunk.seq <= self.from_seq:
                self._off_chain("it runs back past the first seq read")
            sha = item.chunk.prev_sha256
        path.reverse()
        out: list[Sequenced] = []
        join = path[0].chunk.seq
        if join < self.expected:
            shas = tuple(self._released.pop(seq) for seq in range(join, self.expected))
            out.append(
                ChunkRetraction(
                    action_id=self._action_id, from_seq=join, to_seq=self.expected - 1, sha256=shas
                )
            )
            self.retracted += len(shas)
            self.expected, self.last_sha256 = join, self._released.get(join - 1)
        for item in path:
            self._unhold(item.sha256)
            self._mark_released(item)
        if not self.done:
            raise UnverifiedResponse(
                f"the signed result of {self._action_id} names chunk {path[-1].chunk.seq}, "
                "which is not a terminal chunk"
            )
        self.dropped += len(self._held)
        self._held.clear()
        self._at.clear()
        self._held_bytes = 0
        return [*out, *path]

    def _off_chain(self, why: str) -> None:
        raise UnverifiedResponse(
            f"the chain the signed result of {self._action_id} vouches for is not one a "
            f"worker published: {why}"
        )
