"""The publisher's side: build, sign and publish an Action, then follow its chunks and result.

    async with AipClient.connect("nats://127.0.0.1:4222") as client:
        handle = await client.submit(endpoint_id="hermes-1", operation="chat_stream",
                                     input={"messages": [...]},
                                     principal_id="user:alice", tenant_id="acme")
        print(handle.ack.status)  # AIP Ack: queued
        async for item in handle.chunk_envelopes():
            if isinstance(item, ChunkRetraction):  # forget seqs from_seq..to_seq shown
                continue
            print(item.aip.sequence, item.aip.kind)  # AIP StreamChunk
        believed = await handle.result_envelope(timeout_s=30)
        print(believed.aip.status, believed.aip.output)  # AIP ActionResult: it ended

What it hands out in AIP's shapes, from the verified Envelopes: `ActionHandle.ack` (Ack),
`chunk_envelopes()` (each chunk's exact bytes, `.aip` its StreamChunk) and
`result_envelope()` / `AipClient.stored_result_envelope()` (the result's exact bytes,
`.aip` its ActionResult). `chunks()`, `result()` and `stored_result()` give the same
messages in the project's own form (`schemas/chunk.py`, `schemas/result.py`: `seq`,
`settled_by`, `fence`, …), for tools that need the settle facts.

Only an Action of a streaming capability has chunks (as upstream AIP); any other one's
result is its whole answer. Its result, not a terminal chunk, says an Action ended: the
chunk iterators end after the terminal chunk of a streaming Action, and on the result of
one without a chunk stream, having yielded nothing.

`publish` refuses (`EnvelopeRejected`, before signing) an envelope the workers would
dead-letter: the same strict decoding, so an id such as `act_<32 hex>\\n` never leaves the
client. `chunks()` reads the Action's chunk subject with stream message gets (no consumer:
a publisher's role may create none, worker/bus/stream_reads.py), resuming after a disconnect at
the next stream sequence, so the iterator yields every chunk once, in `seq` order, from any
starting seq.

Results and chunks are AIP Envelopes (`aip.core.v1.action_result`, signed by the worker;
`aip.core.v1.stream_chunk`, unsigned and hash-chained: docs/publishing.md). Given the trusted
worker keys (`trusted_worker_keys`, the file consumers point `AIPD_TRUSTED_WORKER_KEYS_FILE`
at), the client believes only what a trusted worker signed: `result()` skips a result whose
AIP signature does not verify or was made by another key (someone with publish rights on
the results subject published it) and waits for the real one; `chunks()` checks each
chunk's link to the one before it and, at the terminal chunk, that the signed result ends
the chain. A failed check raises `UnverifiedResponse` (`connector_host.response_signing`):
read the Action's durable state instead. Without keys nothing is verified. Both exceptions
the client raises (`UnverifiedResponse`, `CannotSign`) and the `ChunkRetraction` that
`chunks()` may yield can be imported from this module.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from schemas.action import Action, Identity, Mode, Trace
from schemas.aip.approval import ApprovalDecision
from schemas.aip.manifest import ManifestRequest
from schemas.aip.result import ActionResult as AipActionResult
from schemas.aip.stream import Ack as AipAck
from schemas.aip.stream import AckStatus
from schemas.audit import Receipt, ReceiptEvent
from schemas.channel import ChannelMessage
from schemas.chunk import StreamChunk
from schemas.codec import DEFAULT_MAX_ENVELOPE_BYTES
from schemas.delegation import DelegationRequest
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.ids import capability_id, new_action_id
from schemas.result import ActionResult
from subjects.grammar import Subjects, envelope_msg_id
from worker import tracing
from worker.aip import canonical
from worker.aip.signing import AipSigner
from worker.bus.stream_reads import SubjectFollower, drain
from worker.errors import CannotSign as CannotSign
from worker.errors import UnverifiedResponse as UnverifiedResponse
from worker.operations.catalog import default_mode
from worker.trust.responses import ChunkRetraction as ChunkRetraction
from worker.trust.responses import (
    ChunkSequencer,
    SequencedChunk,
    check_worker_signed,
    open_result,
    read_chunk,
    read_receipt,
    sha256_hex,
)
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.actions import GATEWAY_SENDER, decode_action, encode_action
from worker.wire.cancels import (
    CancelOutcome,
    decode_cancel_reply,
    encode_cancel,
    requester_principal,
)
from worker.wire.channels import decode_inbound
from worker.wire.delegations import decode_delegation, encode_delegation
from worker.wire.envelopes import Opened
from worker.wire.manifests import decode_manifest_response, encode_manifest_request
from worker.wire.results import aip_result_of

#: While no chunk comes, the first look at the results subject (for the result of an
#: Action without a chunk stream) is after this long, the next ones twice as late, up to
#: `RESULT_LOOK_S` apart.
RESULT_LOOK_FIRST_S = 0.1
RESULT_LOOK_S = 1.0
#: How long a cancel waits for its Action to settle unless told otherwise, and how much
#: longer than that the request waits for the worker's answer.
CANCEL_WAIT_S = 20.0
CANCEL_REPLY_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True)
class BelievedResult:
    """An Action's result as believed (`ActionHandle.believe`): the exact
    `aip.core.v1.action_result` Envelope bytes as published, and their decoding in the
    project's own form (`schemas/result.py`)."""

    result: ActionResult
    data: bytes

    @property
    def envelope(self) -> dict[str, Any]:
        """The whole AIP Envelope, as published."""
        document: dict[str, Any] = canonical.loads(self.data)
        return document

    @property
    def body(self) -> dict[str, Any]:
        """The AIP ActionResult (`body.action_result`), as published."""
        body: dict[str, Any] = self.envelope["body"]["action_result"]
        return body

    @property
    def aip(self) -> AipActionResult:
        """The AIP 1.0 ActionResult (`body.action_result`) as its typed AIP struct
        (`schemas/aip/result.py`): `action_id`, `status`, `output`, `error`, as any AIP
        reader gets them; the project's settle facts stay in `result`."""
        return aip_result_of(self.data)


class ActionHandle:
    """A published Action: follow its chunks and wait for its one result."""

    def __init__(
        self,
        client: AipClient,
        endpoint_id: str,
        action_id: str,
        *,
        duplicate: bool = False,
        envelope_sha256: str | None = None,
    ) -> None:
        self.client = client
        self.endpoint_id = endpoint_id
        self.action_id = action_id
        #: sha256 of the exact envelope bytes this client published (None for a handle made
        #: from an id alone): the result must name it as `action_sha256`, so a genuine
        #: signed result of another envelope under this id is not taken for this one's.
        self.envelope_sha256 = envelope_sha256
        #: The PubAck said `duplicate`: the stream already held a message with this
        #: `Nats-Msg-Id` inside its duplicate window and did not store this one. Expected for
        #: a retry of your own publish; for an id you never published, someone else took it
        #: (publish the Action again under a new id).
        self.duplicate = duplicate

    @property
    def ack(self) -> AipAck:
        """The publish's answer as AIP's Ack (`schemas/aip/stream.py`), as the gateway's
        AIP binding answers an `async` Action: `queued` once JetStream stored the Envelope,
        `cached` when it held these exact bytes already (`duplicate`). Meaningful for a
        handle `publish` returned; the Action's outcome is its result, never the Ack."""
        status = AckStatus.CACHED if self.duplicate else AckStatus.QUEUED
        return AipAck(action_id=self.action_id, status=status)

    async def chunks(
        self,
        *,
        from_seq: int = 0,
        idle_timeout_s: float | None = None,
        verified_only: bool = False,
    ) -> AsyncIterator[StreamChunk | ChunkRetraction]:
        """The chunks `chunk_envelopes` releases, in the project's own form
        (`schemas/chunk.py`), and its retractions."""
        async for item in self.chunk_envelopes(
            from_seq=from_seq, idle_timeout_s=idle_timeout_s, verified_only=verified_only
        ):
            yield item if isinstance(item, ChunkRetraction) else item.chunk

    async def chunk_envelopes(
        self,
        *,
        from_seq: int = 0,
        idle_timeout_s: float | None = None,
        verified_only: bool = False,
    ) -> AsyncIterator[SequencedChunk | ChunkRetraction]:
        """Every chunk with seq ≥ from_seq once, in order, until the terminal chunk: each
        as its exact `stream_chunk` Envelope bytes as published (`.data`, what an AIP reader
        reads) with their decoding (`.chunk`).

        A chunk is yielded only once its link is verified (`ChunkSequencer`): it names the
        hash of the chunk yielded before it and no other chunk claims its seq. One read
        ahead of a missing seq is held until it comes. At a fork (two chunks at one seq: a
        superseded owner's late chunk beside its successor's after a takeover, or a
        forgery) nothing more is yielded until the signed result names the chain's last
        chunk; then the branch it vouches for is yielded and the others are dropped without
        an error. With trusted worker keys the terminal chunk is yielded only after the
        signed result named its hash.

        A chunk yielded while it was alone at its seq may turn out not to be on the vouched
        chain (its competitor was stored after this reader passed it): a `ChunkRetraction`
        is then yielded, naming the seqs to forget, and the vouched chain follows from the
        first of them. A consumer that drops what a retraction names ends with exactly the
        Action's chain, whatever the arrival order. `UnverifiedResponse` when the vouched
        chain is malformed, or when more is held than `MAX_HELD_CHUNKS` / `MAX_HELD_BYTES`
        allow.

        `verified_only` yields nothing before the signed result vouches for it, so no chunk
        outside the Action's chain and no retraction is ever yielded (at the cost of
        streaming: everything comes at the end, within the same bounds).

        An Action of a non-streaming capability has no chunks (as upstream): while no chunk
        comes, the results subject is looked at (`RESULT_LOOK_S` at the longest between two
        looks), and the iterator ends, having yielded nothing, once the Action's believed
        result names no last chunk. Had it yielded a chunk by then, that chunk was not the
        Action's: `UnverifiedResponse`.
        """
        subject = self.client.subjects.chunks(self.endpoint_id, self.action_id)
        stream = self.client.subjects.stream_name("chunks")
        order = ChunkSequencer(
            from_seq,
            hold_until_vouched=verified_only,
            verify_terminal=self.client.trusted_worker_keys is not None,
        )
        idle_s = idle_timeout_s or 3600.0
        loop = asyncio.get_running_loop()
        async with (
            SubjectFollower(self.client.nc, stream, subject) as follower,
            SubjectFollower(
                self.client.nc,
                self.client.subjects.stream_name("results"),
                self.client.subjects.results(self.endpoint_id, self.action_id),
            ) as results,
        ):
            look_s, quiet_until = RESULT_LOOK_FIRST_S, loop.time() + idle_s
            while True:
                msg = await follower.next(min(look_s, max(quiet_until - loop.time(), 0.0)))
                if msg is None:
                    if await self._ended_unstreamed(results, order):
                        return
                    if loop.time() >= quiet_until:
                        raise nats.errors.TimeoutError
                    look_s = min(look_s * 2, RESULT_LOOK_S)
                    continue
                quiet_until = loop.time() + idle_s
                data = msg.data or b""
                chunk = read_chunk(data)
                if chunk.action_id != self.action_id:
                    raise UnverifiedResponse(
                        f"a chunk on the subject of {self.action_id} names {chunk.action_id}"
                    )
                released = order.add(data, chunk)
                if order.needs_result:
                    result = await self.result(timeout_s=idle_timeout_s or 60.0)
                    released += order.vouch(result.last_chunk_sha256, self.action_id)
                for item in released:
                    yield item
                if order.done:
                    return

    async def _ended_unstreamed(self, results: SubjectFollower, order: ChunkSequencer) -> bool:
        """True when a result stored on the Action's subject is believed (`believe`) and
        names no last chunk: the Action ended without a chunk stream (chunks held unreleased
        are dropped: not the Action's). Results that are not believed are passed over;
        `UnverifiedResponse` when chunks were already yielded as this Action's (`order`),
        which such a result says it never had."""
        while (msg := await results.next(0)) is not None:
            try:
                result = self.believe(msg.data or b"")
            except CannotSign:
                raise
            except UnverifiedResponse:
                continue
            if result.last_chunk_sha256 is not None:
                return False
            if order.expected > order.from_seq:
                raise UnverifiedResponse(
                    f"the signed result of {self.action_id} names no chunk, but chunks were "
                    "read on its subject: they are not the Action's"
                )
            return True
        return False

    async def result(self, *, timeout_s: float = 60.0) -> ActionResult:
        """The settled result in the project's own form (`result_envelope`'s `.result`)."""
        return (await self.result_envelope(timeout_s=timeout_s)).result

    async def result_envelope(self, *, timeout_s: float = 60.0) -> BelievedResult:
        """The settled result: its exact `action_result` Envelope bytes as published, with
        their decoding (waits for it; returns at once if it already exists).

        With trusted worker keys, a result that does not verify is skipped and the wait goes
        on; when the time is up after only such results, their refusal is raised. A result
        naming another Action, or another envelope than the one this handle published, is
        skipped the same way (`believe`).
        """
        subject = self.client.subjects.results(self.endpoint_id, self.action_id)
        stream = self.client.subjects.stream_name("results")
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        refused: UnverifiedResponse | None = None
        async with SubjectFollower(self.client.nc, stream, subject) as follower:
            while True:
                msg = await follower.next(until - loop.time())
                if msg is None:
                    if refused is not None:
                        raise refused
                    raise nats.errors.TimeoutError
                data = msg.data or b""
                try:
                    return BelievedResult(self.believe(data), data)
                except CannotSign:
                    raise
                except UnverifiedResponse as exc:
                    refused = exc  # not a trusted worker's: the real result may follow

    def believe(self, data: bytes) -> ActionResult:
        """This Action's result in the Envelope `data` (`AipClient.believe_result`), which
        must name this handle's Action id and, when the handle published it, its envelope's
        hash."""
        result = self.client.believe_result(data)
        if result.action_id != self.action_id:
            raise UnverifiedResponse(
                f"the result on the subject of {self.action_id} names {result.action_id}"
            )
        if self.envelope_sha256 is not None and result.action_sha256 != self.envelope_sha256:
            raise UnverifiedResponse(
                f"the result on the subject of {self.action_id} answers another envelope "
                "than the one this client published"
            )
        return result

    async def cancel(
        self,
        *,
        reason: str = "",
        requested_by: str,
        requester_kind: str | None = None,
        wait_s: float = CANCEL_WAIT_S,
    ) -> CancelOutcome:
        """`AipClient.cancel` of this Action."""
        return await self.client.cancel(
            self.endpoint_id,
            self.action_id,
            reason=reason,
            requested_by=requested_by,
            requester_kind=requester_kind,
            wait_s=wait_s,
        )


class AipClient:
    def __init__(
        self,
        nc: NATS,
        *,
        prefix: str = "aip",
        sign_key: Path | None = None,
        max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
        trusted_worker_keys: TrustedGatewayKeys | Path | None = None,
        sender: Mapping[str, Any] | None = None,
    ) -> None:
        self.nc = nc
        self.subjects = Subjects(prefix)
        self.sign_key = sign_key
        #: The `from` Principal of the Action Envelopes this client signs (default
        #: `worker.wire.actions.GATEWAY_SENDER`); the workers trust the key, not this id.
        self.sender: Mapping[str, Any] = dict(sender or GATEWAY_SENDER)
        #: The deployment's AIPD_MAX_ENVELOPE_BYTES: an envelope over it is refused here,
        #: before it is signed, as the workers would dead-letter it.
        self.max_envelope_bytes = max_envelope_bytes
        #: Public keys of the workers whose signed results and chunk chains are believed;
        #: None believes whatever is on the subjects (no verification).
        self.trusted_worker_keys = (
            TrustedGatewayKeys.load(trusted_worker_keys, what="trusted worker keys file")
            if isinstance(trusted_worker_keys, Path)
            else trusted_worker_keys
        )
        self._owns_connection = False

    @classmethod
    async def connect(
        cls,
        servers: str | list[str],
        *,
        prefix: str = "aip",
        sign_key: Path | None = None,
        max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES,
        trusted_worker_keys: TrustedGatewayKeys | Path | None = None,
        inbox_prefix: str = "_INBOX",
        sender: Mapping[str, Any] | None = None,
        **connect_options: Any,
    ) -> AipClient:
        """Connect and own the connection. `inbox_prefix` is where replies to this client
        arrive: under least-privilege roles the one prefix its NATS user may subscribe to
        (`AIPD_NATS_INBOX_PREFIX`, docs/security.md "Roles"); `connect_options` go to
        `nats.connect` (credentials: `nkeys_seed=`, `user_credentials=`, ...)."""
        tracing.configure("aip-hermes-client")
        nc = await nats.connect(
            servers,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            inbox_prefix=inbox_prefix,
            **connect_options,
        )
        client = cls(
            nc,
            prefix=prefix,
            sign_key=sign_key,
            max_envelope_bytes=max_envelope_bytes,
            trusted_worker_keys=trusted_worker_keys,
            sender=sender,
        )
        client._owns_connection = True
        return client

    def believe_result(self, data: bytes) -> ActionResult:
        """The result in the `action_result` Envelope `data`, whose AIP signature must be a
        trusted worker key's when there are trusted keys; raises `UnverifiedResponse` (or
        `CannotSign`: an unsigned `connector_host.response_signing` refusal) otherwise."""
        result, opened = open_result(data, max_bytes=self.max_envelope_bytes)
        if self.trusted_worker_keys is None:
            return result
        if (
            opened.verified is None
            and result.error is not None
            and (result.error.code is ErrorCode.HOST_RESPONSE_SIGNING)
        ):
            raise CannotSign(
                f"{result.action_id}: the worker could not sign its response "
                f"({ErrorCode.HOST_RESPONSE_SIGNING.value}); read the durable "
                "Action state instead"
            )
        check_worker_signed(opened, self.trusted_worker_keys, what="result")
        return result

    async def __aenter__(self) -> AipClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._owns_connection:
            await self.nc.drain()

    def build_action(
        self,
        *,
        endpoint_id: str,
        operation: str,
        input: Mapping[str, Any],
        principal_id: str,
        principal_kind: str = "user",
        tenant_id: str | None = None,
        credential_revision: int | None = None,
        authentication_issuer: str | None = None,
        mode: Mode | None = None,
        idempotency_key: str | None = None,
        timeout_ms: int | None = None,
        deadline_unix_ms: int | None = None,
        trace_id: str | None = None,
        approval: ApprovalDecision | None = None,
        action_id: str | None = None,
    ) -> Action:
        """An Action for `operation`; without `mode`, the one the operation takes by default
        (`stream` for a streaming twin such as `chat_stream`, `async` otherwise)."""
        action_id = action_id or new_action_id()
        return Action(
            id=action_id,
            capability=capability_id(endpoint_id, operation),
            input=dict(input),
            identity=Identity(
                principal_id=principal_id,
                principal_kind=principal_kind,
                tenant_id=tenant_id,
                authentication_issuer=authentication_issuer,
                credential_revision=credential_revision,
            ),
            created_at_unix_ms=time.time_ns() // 1_000_000,
            mode=default_mode(operation) if mode is None else mode,
            idempotency_key=idempotency_key or action_id,
            timeout_ms=timeout_ms,
            deadline_unix_ms=deadline_unix_ms,
            trace=Trace(trace_id=trace_id) if trace_id else None,
            approval=approval,
        )

    def aip_signer(self) -> AipSigner | None:
        """The client's signing key (`sign_key`, a user nkey seed file) as an AIP signer."""
        if self.sign_key is None:
            return None
        return AipSigner.from_nkey_seed(self.sign_key.read_bytes().strip())

    def seal_action(self, action: Action) -> bytes:
        """The AIP Action Envelope of `action` as this client publishes it: signed with
        its key (unsigned without one), from `sender`. Raises EnvelopeRejected, before
        anything is published, for an Action the workers would refuse to decode (an id,
        capability or field of the wrong shape, an Envelope over the size limit)."""
        payload = encode_action(action, signer=self.aip_signer(), sender=self.sender)
        decode_action(payload, max_bytes=self.max_envelope_bytes)
        return payload

    async def publish(self, action: Action) -> ActionHandle:
        """Publish an Action as a signed AIP Envelope (`seal_action`; unsigned without a
        key) under its content-bound `Nats-Msg-Id` (`subjects.grammar.envelope_msg_id`: its
        id and the sha256 prefix of its bytes).

        Raises EnvelopeRejected, before publishing, for an Action the workers would refuse
        to decode (an id, capability or field of the wrong shape).
        """
        from schemas.ids import split_capability

        payload = self.seal_action(action)
        endpoint_id, _ = split_capability(action.capability)
        return await self.publish_action_envelope(endpoint_id, action.id, payload)

    async def publish_action_envelope(
        self, endpoint_id: str, action_id: str, payload: bytes
    ) -> ActionHandle:
        """Publish Action Envelope bytes already sealed (`seal_action`, or built elsewhere
        from the AIP rules) on the endpoint's actions subject, as they are."""
        return await self._publish_envelope(
            self.subjects.actions(endpoint_id), endpoint_id, action_id, payload
        )

    async def submit(self, **fields: Any) -> ActionHandle:
        return await self.publish(self.build_action(**fields))

    async def delegate(self, request: DelegationRequest) -> ActionHandle:
        """Publish a DelegationRequest to the delegate's endpoint as a signed AIP
        `aip.agent.v1.delegation_request` Envelope (`seal_delegation`; unsigned without a key).

        The returned handle follows the delegation's own Action id
        (`worker.delegation.delegation_action_id`): its chunks are the operator run's, its
        result carries the AIP DelegationResult in `output.delegation_result` (the verified
        child result is its `result`).
        """
        from worker.delegation.action_id import delegation_action_id
        from worker.delegation.router import delegate_endpoint

        payload = self.seal_delegation(request)
        endpoint_id = delegate_endpoint(request)
        action_id = delegation_action_id(request.delegation_id)
        return await self._publish_envelope(
            self.subjects.delegations(endpoint_id),
            endpoint_id,
            action_id,
            payload,
        )

    def seal_delegation(self, request: DelegationRequest) -> bytes:
        """The DelegationRequest Envelope of `request` as this client publishes it: signed
        with its key (unsigned without one), from `sender`; EnvelopeRejected, before
        anything is published, for a request the workers would refuse to decode."""
        payload = encode_delegation(request, signer=self.aip_signer(), sender=self.sender)
        decode_delegation(payload, max_bytes=self.max_envelope_bytes)
        return payload

    async def _publish_envelope(
        self,
        subject: str,
        endpoint_id: str,
        action_id: str,
        payload: bytes,
    ) -> ActionHandle:
        """Publish an AIP Envelope (its signature inside it) under its content-bound
        Msg-Id, inside a producer span whose trace the workers continue (`worker.tracing`)."""
        msg_id = envelope_msg_id(action_id, payload)
        headers = {"Nats-Msg-Id": msg_id}
        with tracing.producing(
            subject,
            headers,
            {"messaging.message.id": msg_id, "aip.action_id": action_id},
        ):
            ack = await self.nc.jetstream().publish(subject, payload, headers=headers)
        return ActionHandle(
            self,
            endpoint_id,
            action_id,
            duplicate=bool(ack.duplicate),
            envelope_sha256=sha256_hex(payload),
        )

    async def submit_and_wait(self, *, timeout_s: float = 60.0, **fields: Any) -> ActionResult:
        handle = await self.submit(**fields)
        return await handle.result(timeout_s=timeout_s)

    def handle(
        self, endpoint_id: str, action_id: str, *, envelope_sha256: str | None = None
    ) -> ActionHandle:
        """A handle on an Action published elsewhere; with `envelope_sha256` (the sha256 of
        the envelope bytes published) its result must answer exactly that envelope."""
        return ActionHandle(self, endpoint_id, action_id, envelope_sha256=envelope_sha256)

    async def stored_result(
        self, endpoint_id: str, action_id: str, *, envelope_sha256: str | None = None
    ) -> ActionResult | None:
        """The result already on the results stream, without waiting (verified like
        `result()`: when the last one is not a trusted worker's or not this Action's, the
        earlier ones are read)."""
        found = await self.stored_result_envelope(
            endpoint_id, action_id, envelope_sha256=envelope_sha256
        )
        return found.result if found is not None else None

    async def stored_result_envelope(
        self, endpoint_id: str, action_id: str, *, envelope_sha256: str | None = None
    ) -> BelievedResult | None:
        """`stored_result` with the result's exact Envelope bytes (`BelievedResult`)."""
        handle = self.handle(endpoint_id, action_id, envelope_sha256=envelope_sha256)
        try:
            msg = await self.nc.jetstream().get_last_msg(
                self.subjects.stream_name("results"),
                self.subjects.results(endpoint_id, action_id),
            )
        except NotFoundError:
            return None
        data = msg.data or b""
        try:
            return BelievedResult(handle.believe(data), data)
        except CannotSign:
            raise
        except UnverifiedResponse:
            return await handle.result_envelope(timeout_s=2.0)

    async def cancel(
        self,
        endpoint_id: str,
        action_id: str,
        *,
        reason: str = "",
        requested_by: str,
        requester_kind: str | None = None,
        wait_s: float = CANCEL_WAIT_S,
    ) -> CancelOutcome:
        """Ask the workers to cancel an Action: an AIP Cancel Envelope signed with this
        client's key (the gateway key) as `requested_by` (`from`; its kind is read from the
        id's prefix unless given). The answer is the Action's terminal result once the
        cancel settles it, or at once if it had already ended (`outcome.result`), or an
        error (`outcome.error`: a refusal, or `connector_host.not_ready` when it did not
        settle within `wait_s`; ask again). With trusted worker keys the answer must be a
        trusted worker's signed answer to this very Cancel (`UnverifiedResponse`)."""
        payload = encode_cancel(
            action_id,
            requester=requester_principal(requested_by, requester_kind),
            signer=self.aip_signer(),
            reason=reason,
            wait_ms=int(wait_s * 1000),
        )
        headers: dict[str, str] = {}
        tracing.inject(headers)
        reply = await self.nc.request(
            self.subjects.cancel(endpoint_id),
            payload,
            timeout=wait_s + CANCEL_REPLY_MARGIN_S,
            headers=headers or None,
        )
        return self.believe_cancel_reply(payload, reply.data or b"")

    def believe_cancel_reply(self, cancel: bytes, data: bytes) -> CancelOutcome:
        """The answer in `data` to the Cancel Envelope `cancel`: it must answer it
        (`in_response_to`) and, with trusted worker keys, be signed by one of them;
        `UnverifiedResponse` otherwise."""
        try:
            outcome, opened = decode_cancel_reply(data, max_bytes=self.max_envelope_bytes)
        except EnvelopeRejected as exc:
            raise UnverifiedResponse(f"cancel reply: {exc.reason}") from None
        asked = json.loads(cancel)["message_id"]
        if opened.envelope.get("in_response_to") != asked:
            raise UnverifiedResponse("cancel reply: it does not answer this Cancel")
        if self.trusted_worker_keys is not None:
            check_worker_signed(opened, self.trusted_worker_keys, what="cancel reply")
        return outcome

    async def receipts(self, endpoint_id: str, action_id: str) -> list[Receipt]:
        """Every audit receipt of one Action, in the order they were stored (as stored:
        not verified; `audit_chain` verifies)."""
        return [receipt for _, receipt in await self.receipt_log(endpoint_id, action_id)]

    async def receipt_log(self, endpoint_id: str, action_id: str) -> list[tuple[int, Receipt]]:
        """Every audit receipt of one Action with its audit-stream sequence number (what a
        qualification record cites), ordered by receipt time. Not verified; a message that
        is not a receipt is skipped (see `audit_chain` for the verified chain)."""
        found: list[tuple[int, Receipt]] = []
        for seq, data, _ in await self._audit_messages(endpoint_id, action_id):
            try:
                found.append((seq, read_receipt(data)[0]))
            except UnverifiedResponse:
                continue
        return sorted(found, key=lambda entry: entry[1].ts_unix_ms)

    async def audit_chain(
        self,
        endpoint_id: str,
        action_id: str,
        *,
        trusted_gateway_keys: TrustedGatewayKeys | None = None,
    ) -> AuditChain:
        """One Action's receipt chain as trusted workers signed it, and what was set aside.

        Each message is a `receipt_chain` Envelope of one AIP Receipt (`worker.wire.receipts`).
        With trusted worker keys, a receipt is in the chain when a trusted worker signed its
        Envelope, or when a receipt in the chain names its AIP `hash` as `previous_hash` (a
        worker signs the last receipt of each segment, `worker.bus.audit`) from the same
        worker about the same Action; it must name this Action and its id must not have been
        seen before (a copy). A gateway's `tool_call` receipt may instead be signed by a key
        of `trusted_gateway_keys`. Every other message is `unverified` (forged, unsigned,
        another Action's receipt copied here, or in a segment whose signed end is missing)
        or `malformed` (not a receipt), each with its audit-stream sequence, and none of
        them breaks the chain. Without trusted worker keys nothing is verified
        (`chain.verified` is False) and only malformed messages are set aside.
        """
        chain = AuditChain(verified=self.trusted_worker_keys is not None)
        decoded: list[tuple[int, str, Opened, Receipt]] = []
        for seq, data, _ in await self._audit_messages(endpoint_id, action_id):
            try:
                receipt, digest, opened = read_receipt(data)
            except UnverifiedResponse as exc:
                chain.malformed.append(SetAside(seq, f"not a receipt: {str(exc)[:200]}"))
                continue
            decoded.append((seq, digest, opened, receipt))
        if self.trusted_worker_keys is None:
            chain.entries = [AuditEntry(seq, receipt, None) for seq, _, _, receipt in decoded]
            chain.entries.sort(key=lambda entry: entry.receipt.ts_unix_ms)
            return chain
        by_hash = {digest: n for n, (_, digest, _, _) in enumerate(decoded)}
        signers: dict[int, str] = {}
        refusals: dict[int, str] = {}
        for n, (_, _, opened, _) in enumerate(decoded):
            try:
                signers[n] = check_worker_signed(
                    opened, self.trusted_worker_keys, what="receipt"
                )
            except UnverifiedResponse as exc:
                refusals[n] = str(exc)
        # Each receipt a worker signed vouches for the segment it ends: walk its links back.
        for anchor in list(signers):
            end = decoded[anchor][3]
            link = end.prev_sha256
            while link is not None and (at := by_hash.get(link)) is not None:
                linked = decoded[at][3]
                if at in signers or (linked.worker_id, linked.action_id) != (
                    end.worker_id,
                    end.action_id,
                ):
                    break
                signers[at] = signers[anchor]
                link = linked.prev_sha256
        for n in refusals:
            if n not in signers:
                _, _, opened, receipt = decoded[n]
                gateway = _gateway_signer(receipt, opened, trusted_gateway_keys)
                if gateway is not None:
                    signers[n] = gateway
        seen: set[str] = set()
        for n, (seq, _, _, receipt) in enumerate(decoded):
            signer = signers.get(n)
            if signer is None:
                reason = refusals.get(n, "unverified")
                if receipt.prev_sha256 is not None:
                    reason += "; no signed receipt of its segment links back to it"
                chain.unverified.append(SetAside(seq, reason, receipt.receipt_id))
            elif receipt.action_id != action_id:
                chain.unverified.append(
                    SetAside(seq, f"a receipt of {receipt.action_id[:80]}", receipt.receipt_id)
                )
            elif receipt.receipt_id in seen:
                chain.unverified.append(SetAside(seq, "a copy", receipt.receipt_id))
            else:
                seen.add(receipt.receipt_id)
                chain.entries.append(AuditEntry(seq, receipt, signer))
        chain.entries.sort(key=lambda entry: entry.receipt.ts_unix_ms)
        return chain

    async def _audit_messages(
        self, endpoint_id: str, action_id: str
    ) -> list[tuple[int, bytes, Mapping[str, str] | None]]:
        """`(audit-stream sequence, data, headers)` of every message on the Action's audit
        subject (message gets only: worker/bus/stream_reads.py)."""
        stored = await drain(
            self.nc.jetstream(),
            self.subjects.stream_name("audit"),
            self.subjects.audit(endpoint_id, action_id),
        )
        return [(msg.seq or 0, msg.data or b"", msg.headers) for msg in stored]

    async def session_messages(
        self,
        endpoint_id: str,
        session_id: str,
        *,
        after_message_id: int = -1,
        idle_timeout_s: float = 3600.0,
    ) -> AsyncIterator[ChannelMessage]:
        """The followed session's messages (channel ingress) with an id past
        `after_message_id`, once each and in id order, until none arrives for
        `idle_timeout_s` (then it returns). Each is an `aip.channel.v1.message_created`
        Envelope (`worker.wire.channels`); one that is not a follower's Envelope, or, with
        trusted worker keys, one a trusted worker did not sign (forged on the subject), is
        skipped and moves nothing."""
        subject = self.subjects.inbound(endpoint_id, session_id)
        last = after_message_id
        async with SubjectFollower(self.nc, self.subjects.stream_name("inbound"), subject) as f:
            while True:
                msg = await f.next(idle_timeout_s)
                if msg is None:
                    return
                try:
                    message, opened = decode_inbound(
                        msg.data or b"", max_bytes=self.max_envelope_bytes
                    )
                    if self.trusted_worker_keys is not None:
                        check_worker_signed(
                            opened, self.trusted_worker_keys, what="channel message"
                        )
                except (EnvelopeRejected, UnverifiedResponse):
                    continue
                if message.message_id <= last:
                    continue
                last = message.message_id
                yield message

    async def manifest(
        self, endpoint_id: str, request: ManifestRequest | None = None
    ) -> dict[str, Any]:
        """The endpoint's AIP manifest (`aip.discovery.v1.manifest_response`), as the worker
        sent it: the capabilities `request`'s filter selects (all without one). The request
        is signed with the client's key when it has one; the answer must be signed by a
        trusted worker key when the client has worker keys (UnverifiedResponse otherwise,
        and for an error answer or anything unreadable)."""
        data = encode_manifest_request(request, sender=self.sender, signer=self.aip_signer())
        reply = await self.nc.request(self.subjects.manifest(endpoint_id), data, timeout=5.0)
        try:
            _, opened = decode_manifest_response(reply.data, max_bytes=self.max_envelope_bytes)
        except EnvelopeRejected as exc:
            raise UnverifiedResponse(f"manifest: {exc.reason}") from None
        if self.trusted_worker_keys is not None:
            check_worker_signed(opened, self.trusted_worker_keys, what="manifest")
        return dict(opened.payload)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One receipt of the chain: its audit-stream sequence and the key that signed it
    (None when nothing is verified)."""

    seq: int
    receipt: Receipt
    signer: str | None


@dataclass(frozen=True, slots=True)
class SetAside:
    """A message on an audit subject left out of the chain, and why."""

    seq: int
    reason: str
    #: The receipt id it claims, when it decodes as a receipt.
    receipt_id: str | None = None


@dataclass(slots=True)
class AuditChain:
    """What `audit_chain` read: the chain, and what it left out."""

    #: Whether the chain was verified against trusted worker keys.
    verified: bool
    entries: list[AuditEntry] = field(default_factory=list)
    unverified: list[SetAside] = field(default_factory=list)
    malformed: list[SetAside] = field(default_factory=list)


#: The receipts a gateway key signs (the gateway's tool calls, the DLQ commands' decisions).
GATEWAY_RECEIPTS = frozenset(
    {ReceiptEvent.TOOL_CALL, ReceiptEvent.DLQ_REPLAYED, ReceiptEvent.DLQ_DISCARDED}
)


def _gateway_signer(
    receipt: Receipt, opened: Opened, trusted: TrustedGatewayKeys | None
) -> str | None:
    """The trusted gateway key that signed a gateway's own receipt (`tool_call`, or a
    publisher's `dlq_replayed` / `dlq_discarded`), if any: a gateway key never vouches for
    a worker's decision."""
    if trusted is None or receipt.event not in GATEWAY_RECEIPTS:
        return None
    try:
        return check_worker_signed(opened, trusted, what="receipt")
    except UnverifiedResponse:
        return None
