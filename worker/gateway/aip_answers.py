"""The answers of the AIP bindings (aip-1.0-wire.md §2.6, §3.1 to §3.3, §3.6): whatever
carried a request (the native NATS binding today), the same checks in the same order and
exactly one signed answer, so the bindings cannot drift apart.

An answer is signed with the gateway key in its `did:key` form and correlated by the reply
recipe (§2.6: fresh `message_id` and `sent_at`, `session_id` and `correlation_id` copied,
`in_response_to` the request's `message_id`, `to` its `from`).

The order of checks, each refusal an `aip.core.v1.error` Envelope with the reference's code:
frame (`envelope.decode.invalid` / `schema.envelope.invalid`), signature
(`auth.signature.invalid`), signer and sender (`auth.unverified_actor`,
`auth.claim_mismatch`: worker/gateway/native_trust.py), `sent_at` and the message id claim
(`replay.message_id`), then the body. What each body gets:

* `action` (mode `sync` or absent): our Action goes through `GatewayService.call` — queue
  entry, then the signed Action on the endpoint's `…actions` JetStream subject — and the
  answer is the `action_result` once it settles. The wait is bounded by the Action's
  `timeout_ms` and the requester's timeout (`AIPD_AIP_REQUEST_TIMEOUT_MS`, less a margin);
  past it the answer is the non-terminal `ack` `accepted` when the Action is on JetStream
  (send the same Action id again, a new `message_id`, to read its result), or a retryable
  `connector_host.not_ready` error with `uncertain_outcome` when it could not be confirmed
  on JetStream in time.
* `action` mode `async`: `ack` `queued` once the Action is on JetStream (`cached` when the
  Action id was already taken by the same contract).
* `action` mode `streaming`: the Action must carry a `callback` whose profile this binding
  serves (a sink per profile, worker/gateway/chunk_sinks.py; the NATS binding serves
  `aip.native.nats.v1`), else `action.invalid_input` before anything is enqueued. It runs as
  our `stream` mode, its chunks followed by the chunk follower (worker/gateway/
  chunk_follower.py) under the binding's release policy (`chunk_release`), and is waited for
  like a sync one; its chunks go to the callback, each a `stream_chunk` Envelope signed by
  the gateway key and correlated by the reply recipe, `sequence` from 0 in order, ending
  with its `done` (or `error`) chunk, and the answer is the final `action_result`. This
  binding releases them only once the signed result vouches for the chain
  (`Release.VOUCHED`: the run that settled it, never a superseded run's or a forger's
  chunks), so they arrive when the Action has ended, not as they are made. Past the wait,
  the same `ack` `accepted` as sync (the same Action id sent again streams and answers
  then).
* `manifest_request`: the pool's manifest, from the workers' manifests.
* `heartbeat`: `heartbeat_ack`.
* `action_status_request`: `action_status`; `action_result_request`: the `action_result`
  once the Action is terminal (within `wait_ms`), else its `action_status`; `cancel`: the
  executor is asked to cancel and the answer is the terminal `action_result` (cancelled,
  or how it had already ended), or the `action_status` when it has not settled yet.
* `action_events_request`: `action_events`, the Action's chunks as Events (kind
  `stream_chunk.{kind}`, `data` the StreamChunk's fields and whether the chain was verified
  against the signed result), paged by `cursor` (a sequence number) and `limit`, filtered by
  `kinds`, the StreamChunks too with `include_chunks`; `follow` waits within the request's
  timeout for a first event when there is none yet and the Action runs; `terminal` says
  whether it ended (no `cursor` once the last page of an ended Action was given).
* An Action id the binding's principal does not own is `action.not_found` in every
  lifecycle query, like one that does not exist.
* anything else (`action_list_request`: our records keep the bus id, a hash of the
  requester's id, so a list could not name the requester's own ids; delegation…):
  `capability.unsupported`.

Nothing a request carries can make `AipAnswers.answer` raise: every failure is an answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import msgspec

from schemas.aip.action import Action as AipAction
from schemas.aip.action import Mode as AipMode
from schemas.aip.control import Cancel, Heartbeat
from schemas.aip.lifecycle import ActionEventsRequest, ActionResultRequest, ActionStatusRequest
from schemas.aip.manifest import Manifest, ManifestRequest
from schemas.errors import EnvelopeRejected, ErrorCategory, ErrorCode
from worker.aip.canonical import canonical_bytes, loads
from worker.aip.envelope import BODY_KEYS, now_timestamp
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner
from worker.errors import ConnectorError, NativeRefusal
from worker.gateway.chunk_follower import ChunkFollower, ChunkSink, Release
from worker.gateway.chunk_sinks import CALLBACK_REFUSED, SinkFactory
from worker.gateway.chunk_sinks import answer_headers as answer_headers
from worker.gateway.facade import action_result, action_status, events_page
from worker.gateway.native_subjects import request_subject
from worker.gateway.native_trust import (
    MessageClaims,
    SignerBinding,
    TrustedSigners,
    check_sent_at,
)
from worker.gateway.principals import Principal
from worker.gateway.service import GatewayService, namespaced_action_id
from worker.gateway.settings import PROTECTED_SCOPES, GatewaySettings
from worker.tasks import stop_tasks
from worker.wire.envelopes import (
    DEFAULT_MAX_ENVELOPE_BYTES,
    Opened,
    open_envelope,
    open_payload,
    seal,
    sent_at_ms,
)
from worker.wire.manifests import MANIFEST_VERSION, NATIVE_NATS_PROFILE, select

log = logging.getLogger(__name__)

ACTION: Final = "aip.core.v1.action"
ACK: Final = "aip.core.v1.ack"
RESULT: Final = "aip.core.v1.action_result"
ERROR: Final = "aip.core.v1.error"
HEARTBEAT: Final = "aip.core.v1.heartbeat"
HEARTBEAT_ACK: Final = "aip.core.v1.heartbeat_ack"
MANIFEST_REQUEST: Final = "aip.discovery.v1.manifest_request"
MANIFEST_RESPONSE: Final = "aip.discovery.v1.manifest_response"
CANCEL: Final = "aip.core.v1.cancel"
STATUS_REQUEST: Final = "aip.lifecycle.v1.action_status_request"
STATUS: Final = "aip.lifecycle.v1.action_status"
RESULT_REQUEST: Final = "aip.lifecycle.v1.action_result_request"
EVENTS_REQUEST: Final = "aip.lifecycle.v1.action_events_request"
EVENTS: Final = "aip.lifecycle.v1.action_events"
STREAM_CHUNK: Final = "aip.core.v1.stream_chunk"
SERVED: Final = frozenset(
    {
        ACTION,
        HEARTBEAT,
        MANIFEST_REQUEST,
        CANCEL,
        STATUS_REQUEST,
        RESULT_REQUEST,
        EVENTS_REQUEST,
    }
)
#: Every message type the Envelope rules know: an unserved one is answered, not dropped.
ANY_TYPE: Final = frozenset(BODY_KEYS)
#: Kept of the requester's timeout for signing and sending the answer.
ANSWER_MARGIN_MS: Final = 500
#: How often a sync request whose child outlived the service's wait polls its record.
POLL_S: Final = 0.2
#: Events of an `action_events` page when the request names no `limit`.
EVENTS_PAGE: Final = 100

#: What answers a request's body once its frame, signature, signer and claim passed.
BodyAnswer = Callable[[Opened, SignerBinding, dict[str, Any]], Awaitable[bytes]]


def request_envelope(data: bytes, headers: Mapping[str, str] | None) -> bytes:
    """The Envelope's canonical bytes from a TransportMessage or a bare Envelope;
    EnvelopeRejected for anything else, or headers that contradict the Envelope."""
    if len(data) > DEFAULT_MAX_ENVELOPE_BYTES:
        raise EnvelopeRejected(
            ErrorCode.ENVELOPE_DECODE_INVALID,
            f"request is {len(data)} bytes, over {DEFAULT_MAX_ENVELOPE_BYTES}",
        )
    try:
        document = loads(data)
    except AipWireError as exc:
        raise EnvelopeRejected(ErrorCode.ENVELOPE_DECODE_INVALID, str(exc)) from None
    if not isinstance(document, dict):
        raise EnvelopeRejected(ErrorCode.ENVELOPE_DECODE_INVALID, "not a JSON object")
    envelope: Any = document
    if "envelope" in document and "aip_version" not in document:
        unknown = set(document) - {"envelope", "metadata"}
        metadata = document.get("metadata")
        if unknown or not (
            metadata is None
            or (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()))
        ):
            raise EnvelopeRejected(
                ErrorCode.SCHEMA_ENVELOPE_INVALID,
                "a TransportMessage is {envelope, metadata: {string: string}}",
            )
        envelope = document["envelope"]
    if not isinstance(envelope, dict):
        raise EnvelopeRejected(ErrorCode.SCHEMA_ENVELOPE_INVALID, "envelope is not an object")
    for header, field in (("AIP-Message-Type", "message_type"), ("AIP-Message-Id", "message_id")):
        said = (headers or {}).get(header)
        if said is not None and said != envelope.get(field):
            raise EnvelopeRejected(
                ErrorCode.SCHEMA_ENVELOPE_INVALID, f"header {header} is not the Envelope's {field}"
            )
    try:
        return canonical_bytes(envelope)
    except AipWireError as exc:
        raise EnvelopeRejected(ErrorCode.ENVELOPE_DECODE_INVALID, str(exc)) from None


def claimed_frame(data: bytes) -> dict[str, Any]:
    """What an answer to an unreadable request can still name: its `message_id`,
    `correlation_id` and `session_id` when they are strings (never believed, only echoed)."""
    try:
        document = loads(data)
    except AipWireError:
        return {}
    if isinstance(document, dict) and isinstance(document.get("envelope"), dict):
        document = document["envelope"]
    if not isinstance(document, dict):
        return {}
    frame = {}
    for ours, theirs in (
        ("in_response_to", "message_id"),
        ("correlation_id", "correlation_id"),
        ("session_id", "session_id"),
    ):
        value = document.get(theirs)
        if isinstance(value, str) and 0 < len(value) <= 256:
            frame[ours] = value
    return frame


def _refusal_of(exc: EnvelopeRejected) -> NativeRefusal:
    if exc.code is ErrorCode.HOST_AUTHENTICATION:
        return NativeRefusal("auth.signature.invalid", exc.reason)
    return NativeRefusal(exc.code.value, exc.reason, ErrorCategory.PERMANENT)


def _cursor_of(cursor: str | None) -> int:
    """The sequence an `action_events` cursor names (ours: a decimal sequence number)."""
    if cursor is None:
        return 0
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 19):
        raise NativeRefusal(
            "action.invalid_input",
            "cursor is not one this binding gave (a sequence number)",
            ErrorCategory.PERMANENT,
        )
    return int(cursor)


def _refusal_of_lookup(exc: ConnectorError, action_id: str) -> NativeRefusal:
    """A refusal of a lookup by Action id: `action.not_found` for an id this principal does
    not own, exactly as for one that does not exist."""
    if exc.code is ErrorCode.CONFIGURATION_OR_INPUT:
        return NativeRefusal(
            "action.not_found",
            f"no Action {action_id[:80]} of this principal",
            ErrorCategory.PERMANENT,
        )
    return _refusal_of_connector(exc)


def _refusal_of_connector(exc: ConnectorError) -> NativeRefusal:
    """A refusal of `GatewayService.call` in the answer's terms (its own code kept)."""
    error = exc.to_protocol(endpoint_id=None, read_only=False)
    return NativeRefusal(
        error.code.value,
        error.message,
        error.category,
        retryable=error.retryable,
        uncertain=error.uncertain_outcome,
    )


class AipAnswers:
    """The checks and the answer of every request, whatever binding carried it."""

    #: When a streaming Action's chunks go to its callback (worker/gateway/chunk_follower.py).
    chunk_release = Release.VOUCHED

    def __init__(
        self,
        settings: GatewaySettings,
        service: GatewayService,
        signers: TrustedSigners,
        claims: MessageClaims,
        signer: AipSigner,
        *,
        sinks: Mapping[str, SinkFactory] | None = None,
        binding: str = NATIVE_NATS_PROFILE,
    ) -> None:
        self.settings = settings
        self.service = service
        self.signers = signers
        self.claims = claims
        self.signer = signer
        #: Where the native binding takes Actions (the manifest names it).
        self.native_action_subject = request_subject(
            settings.aip_trust_domain, settings.aip_service, settings.aip_version, ACTION
        )
        #: Callback profile → where a streaming Action's chunks go (worker/gateway/chunk_sinks.py).
        self.sinks: dict[str, SinkFactory] = dict(sinks or {})
        #: The binding profile answering (errors' `source.binding`, the manifest's profiles).
        self.binding = binding
        #: The Principal this gateway answers as (`from`, with its did).
        self.principal = {"id": f"service:{settings.aip_service}", "kind": "service"}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def stop(self) -> None:
        """Cancel the calls still running for answers that have left."""
        await stop_tasks(list(self._tasks), 5.0)

    # --- building answers ---------------------------------------------------------------

    def _seal(
        self, message_type: str, payload: Mapping[str, Any], frame: Mapping[str, Any]
    ) -> bytes:
        return seal(
            message_type,
            payload,
            sender=self.principal,
            signer=self.signer,
            sent_at=now_timestamp(),
            **frame,
        )

    def sealed(
        self, message_type: str, payload: Mapping[str, Any], frame: Mapping[str, Any]
    ) -> bytes:
        """An answer signed and correlated as this module's own (for another binding's
        body, e.g. worker/gateway/delegation_route.py)."""
        return self._seal(message_type, payload, frame)

    def _error(self, refusal: NativeRefusal, frame: Mapping[str, Any]) -> bytes:
        error = self.translate(refusal).to_aip()
        error["source"]["binding"] = self.binding
        return self._seal(ERROR, {"error": error}, frame)

    # --- hooks of a binding with checks of its own (worker/gateway/connector_host.py) -----

    def translate(self, refusal: NativeRefusal) -> NativeRefusal:
        """The refusal as this binding words it (the NATS binding: as is)."""
        return refusal

    async def admitted(self, opened: Opened, binding: SignerBinding) -> None:
        """The binding's own checks of a request whose signer and sender are trusted, before
        its freshness and message id claim; raise NativeRefusal to refuse it (the NATS
        binding has none)."""

    @staticmethod
    def _reply_frame(opened: Opened) -> dict[str, Any]:
        """The reply recipe (§2.6)."""
        envelope = opened.envelope
        frame: dict[str, Any] = {"in_response_to": opened.message_id}
        sender = opened.sender
        if sender is not None:
            frame["to"] = dict(sender)
        for field in ("correlation_id", "session_id"):
            if isinstance(envelope.get(field), str):
                frame[field] = envelope[field]
        return frame

    # --- the checks, then the body ------------------------------------------------------

    async def answer(self, data: bytes, headers: Mapping[str, str] | None = None) -> bytes:
        """The one signed answer to a request's bytes (a TransportMessage or a bare
        Envelope, with the binding's `AIP-*` headers when it has them); never raises for
        anything the request holds."""
        return await self.answer_by(self._body, data, headers)

    async def answer_by(
        self, body: BodyAnswer, data: bytes, headers: Mapping[str, str] | None = None
    ) -> bytes:
        """`answer` with another body after the same checks (a binding serving other
        message types on a subject of its own: the delegation route)."""
        try:
            return await self._answer(data, headers, body)
        except asyncio.CancelledError:
            raise
        except Exception:  # never let a request stop the binding: answer it
            log.exception("an AIP request failed unexpectedly")
            return self.refusal(
                NativeRefusal(
                    ErrorCode.HOST_EXECUTION.value,
                    "the gateway failed to answer this request",
                    ErrorCategory.TEMPORARY,
                    retryable=True,
                    uncertain=True,
                ),
                data,
            )

    def refusal(self, refusal: NativeRefusal, data: bytes) -> bytes:
        """The error answer to a request refused before it was read (capacity, a failure):
        it echoes what the request claims as its ids, without believing them."""
        return self._error(refusal, claimed_frame(data))

    async def _answer(
        self, data: bytes, headers: Mapping[str, str] | None, body: BodyAnswer
    ) -> bytes:
        try:
            opened = open_envelope(request_envelope(data, headers), message_types=ANY_TYPE)
        except EnvelopeRejected as exc:
            return self._error(_refusal_of(exc), claimed_frame(data))
        frame = self._reply_frame(opened)
        try:
            binding = await self._admit(opened)
            return await body(opened, binding, frame)
        except NativeRefusal as refusal:
            return self._error(refusal, frame)
        except EnvelopeRejected as exc:
            return self._error(_refusal_of(exc), frame)

    async def _admit(self, opened: Opened) -> SignerBinding:
        """Signature, signer, sender, freshness, then the one claim of the message id."""
        if opened.verified is None:
            raise NativeRefusal("auth.signature.invalid", "the Envelope is not signed")
        binding = self.signers.sender_of(opened.verified.did, opened.sender)
        await self.admitted(opened, binding)
        check_sent_at(sent_at_ms(opened))
        await self.claims.claim(binding.did, opened.message_id)
        return binding

    async def _body(self, opened: Opened, binding: SignerBinding, frame: dict[str, Any]) -> bytes:
        message_type = opened.message_type
        if message_type not in SERVED:
            raise NativeRefusal(
                "capability.unsupported",
                f"{message_type} is not served by this binding (served: "
                f"{', '.join(sorted(SERVED))})",
                ErrorCategory.PERMANENT,
            )
        body = open_payload(opened, message_type)
        if isinstance(body, Heartbeat):
            ack = {"sequence": body.sequence, "received_at": now_timestamp()}
            return self._seal(HEARTBEAT_ACK, ack, frame)
        if isinstance(body, ManifestRequest):
            return self._seal(MANIFEST_RESPONSE, await self._manifest(body), frame)
        if isinstance(body, ActionStatusRequest | ActionResultRequest):
            return await self._lifecycle(body, binding, frame)
        if isinstance(body, Cancel):
            return await self._cancel(body, binding, frame)
        if isinstance(body, ActionEventsRequest):
            return await self._events(body, binding, frame)
        assert isinstance(body, AipAction)
        return await self._action(opened, body, binding, frame)

    async def _manifest(self, request: ManifestRequest) -> dict[str, Any]:
        """One manifest for the pool: every endpoint's capabilities the route table serves,
        in the frame of the first endpoint's manifest, naming this gateway as the agent
        and this binding's subject; `select` applies the request's filter."""
        manifests = sorted(
            await self.service.discovery.manifests(),
            key=lambda m: json.dumps(m.get("agent"), sort_keys=True, default=str),
        )
        if not manifests:
            raise NativeRefusal(
                ErrorCode.HOST_NOT_READY.value,
                "no worker answered a manifest request",
                ErrorCategory.TEMPORARY,
                retryable=True,
                retry_after_ms=1000,
            )
        merged = dict(manifests[0])
        capabilities: dict[str, Any] = {}
        bound: list[Any] = []
        for manifest in manifests:
            for entry in manifest.get("capabilities") or []:
                capability = entry.get("id") if isinstance(entry, dict) else None
                if isinstance(capability, str) and self.service.routes.resolve(capability):
                    capabilities.setdefault(capability, entry)
            compatibility = manifest.get("compatibility")
            if isinstance(compatibility, dict):
                bound.extend(compatibility.get("tenant_bound_endpoints") or [])
        merged["capabilities"] = list(capabilities.values())
        # One endpoint's own facts (worker version, binding expiry) do not describe the pool.
        merged.pop("extensions", None)
        merged["manifest_version"] = MANIFEST_VERSION
        merged["agent"] = {**self.principal, "did": self.signer.did}
        compatibility = dict(merged.get("compatibility") or {})
        compatibility["native_nats"] = {"subject": self.native_action_subject}
        if bound:
            compatibility["tenant_bound_endpoints"] = bound
        else:
            compatibility.pop("tenant_bound_endpoints", None)
        merged["compatibility"] = compatibility
        profiles = list(merged.get("profiles") or [])
        for profile in dict.fromkeys((self.binding, NATIVE_NATS_PROFILE)):
            if profile not in profiles:
                profiles.insert(0, profile)
        merged["profiles"] = profiles
        try:
            manifest = msgspec.convert(merged, Manifest, strict=True)
        except msgspec.ValidationError as exc:
            raise NativeRefusal(
                ErrorCode.HOST_EXECUTION.value,
                f"the workers' manifests do not merge into one manifest: {exc}",
                ErrorCategory.TEMPORARY,
                retryable=True,
            ) from None
        built: dict[str, Any] = msgspec.to_builtins(select(manifest, request))
        return built

    # --- action ---------------------------------------------------------------------------

    def _principal(self, binding: SignerBinding) -> Principal:
        """The caller as the gateway's tools know one: the binding, with every tool scope
        and no allowlist (which capabilities it may reach is the route table's)."""
        return Principal(
            principal_id=binding.principal_id,
            principal_kind=binding.principal_kind,
            tenant_id=binding.tenant_id,
            authentication_issuer=binding.issuer,
            revision=binding.revision,
            scopes=frozenset(PROTECTED_SCOPES),
            expires_at_unix_ms=2**53,
        )

    def _deadline(self, action: AipAction) -> float:
        """When the answer to an Action must leave (monotonic): within the Action's
        `timeout_ms` and the requester's timeout, less the margin for the answer."""
        bound_ms = self.settings.aip_request_timeout_ms - ANSWER_MARGIN_MS
        if action.timeout_ms is not None:
            bound_ms = min(bound_ms, action.timeout_ms)
        return time.monotonic() + max(0, bound_ms) / 1000

    @staticmethod
    def _arguments(action: AipAction, mode: str) -> dict[str, Any]:
        """The `GatewayService.call` contract of an AIP Action, run in our `mode`."""
        arguments: dict[str, Any] = {
            "action_id": action.id,
            "capability_id": action.capability_id,
            "input": action.input,
            "mode": mode,
        }
        if action.timeout_ms is not None:
            arguments["timeout_ms"] = action.timeout_ms
        if action.idempotency_key is not None:
            arguments["idempotency_key"] = action.idempotency_key
        return arguments

    async def _action(
        self, opened: Opened, action: AipAction, binding: SignerBinding, frame: dict[str, Any]
    ) -> bytes:
        mode = action.mode or AipMode.SYNC
        sink = self._sink(action, frame) if mode is AipMode.STREAMING else None
        arguments = self._arguments(
            action, {AipMode.SYNC: "sync", AipMode.ASYNC: "async"}.get(mode, "streaming")
        )
        # The request's correlation id stays with the answer, not the child: a retry under
        # a new correlation id must find the same child, not an idempotency collision.
        principal = self._principal(binding)
        bus_id = namespaced_action_id(principal.principal_id, principal.tenant_id, action.id)
        deadline = self._deadline(action)
        call = asyncio.get_running_loop().create_task(self.service.call(principal, arguments))
        # The call goes on when the answer must leave (its record and follower finish it).
        self._tasks.add(call)
        call.add_done_callback(self._tasks.discard)
        try:
            view = await asyncio.wait_for(
                asyncio.shield(call), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            return await self._not_yet(principal, action.id, bus_id, frame)
        except ConnectorError as exc:
            raise _refusal_of_connector(exc) from None
        if mode is AipMode.ASYNC:
            status = "cached" if view.get("duplicate") else "queued"
            return self._seal(ACK, {"action_id": action.id, "status": status}, frame)
        if sink is not None:
            await self._follow_chunks(principal, action.id, bus_id, sink, deadline)
        while view.get("result") is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            try:
                view = await self.service.result(principal, bus_id)
            except ConnectorError as exc:
                raise _refusal_of_connector(exc) from None
        if view.get("result") is None:
            return await self._not_yet(principal, action.id, bus_id, frame)
        return self._seal(RESULT, self._result(action.id, view["result"]), frame)

    def _sink(self, action: AipAction, frame: dict[str, Any]) -> ChunkSink:
        """Where a streaming Action's chunks go: its callback, through the sink of its
        profile, each chunk a `stream_chunk` Envelope signed and correlated like the
        answer; refused before anything is enqueued when there is none this binding
        serves, or the target is one it will not deliver to."""
        callback = action.callback
        if callback is None:
            raise NativeRefusal(
                CALLBACK_REFUSED,
                "a streaming Action needs a callback for its chunks (served profiles: "
                f"{', '.join(sorted(self.sinks)) or 'none'})",
                ErrorCategory.PERMANENT,
            )
        factory = self.sinks.get(callback.profile)
        if factory is None:
            raise NativeRefusal(
                CALLBACK_REFUSED,
                f"callback profile {callback.profile[:100]!r} is not served here (served: "
                f"{', '.join(sorted(self.sinks)) or 'none'})",
                ErrorCategory.PERMANENT,
            )
        return factory(callback, lambda chunk: self._seal(STREAM_CHUNK, chunk, frame))

    async def _follow_chunks(
        self,
        principal: Principal,
        action_id: str,
        bus_id: str,
        sink: ChunkSink,
        deadline: float,
    ) -> None:
        """Pass the streaming child's chunks to `sink` under this binding's release policy,
        until its signed result vouches for them or the answer must leave. Delivery is at
        most once: a chunk the sink could not take ends the stream with a log line, and the
        answer is still the final `action_result` (the chunks stay readable by
        `action_events_request`)."""
        try:
            record, route = await self.service.own_child(principal, bus_id)
        except ConnectorError as exc:
            raise _refusal_of_connector(exc) from None
        children = self.service.children
        await ChunkFollower(
            self.service.nc,
            children,
            route,
            record.action,
            caller_id=action_id,
            sink=sink,
            release=self.chunk_release,
            deadline=deadline,
            binding=self.binding,
            metrics=children.metrics,
            budget=self.service.held_chunks,
        ).run()

    async def _not_yet(
        self, principal: Principal, action_id: str, bus_id: str, frame: dict[str, Any]
    ) -> bytes:
        """The answer when the wait ran out: `ack` `accepted` if the Action's record says it
        was sent, else a retryable error whose outcome is uncertain."""
        try:
            view = await self.service.status(principal, bus_id)
        except ConnectorError:
            view = {}
        if view.get("state") not in (None, "queued"):
            return self._seal(
                ACK,
                {
                    "action_id": action_id,
                    "status": "accepted",
                    "reason": "still running past the request's timeout: send the same Action "
                    "id again (new message_id) to read its result",
                    "retry_after_ms": 1000,
                },
                frame,
            )
        raise NativeRefusal(
            ErrorCode.HOST_NOT_READY.value,
            "the Action was not confirmed on its work queue in time; send the same Action id "
            "again (new message_id)",
            ErrorCategory.TEMPORARY,
            retryable=True,
            retry_after_ms=1000,
            uncertain=True,
        )

    # --- lifecycle queries and cancel --------------------------------------------------

    async def _view(
        self, principal: Principal, action_id: str, *, wait_ms: int = 0
    ) -> dict[str, Any]:
        """The record of the requester's Action (by its own id), once terminal or after
        `wait_ms` (bounded by the request timeout); `action.not_found` for an id this
        principal does not own, exactly as for one that does not exist."""
        bus_id = namespaced_action_id(principal.principal_id, principal.tenant_id, action_id)
        bound_ms = min(wait_ms, self.settings.aip_request_timeout_ms - ANSWER_MARGIN_MS)
        deadline = time.monotonic() + max(0, bound_ms) / 1000
        while True:
            try:
                view = await self.service.result(principal, bus_id)
            except ConnectorError as exc:
                raise _refusal_of_lookup(exc, action_id) from None
            if view.get("result") is not None or time.monotonic() >= deadline:
                return view
            await asyncio.sleep(POLL_S)

    @staticmethod
    def _status(action_id: str, view: Mapping[str, Any], *, with_result: bool) -> dict[str, Any]:
        return action_status(action_id, view, with_result=with_result)

    async def _lifecycle(
        self,
        request: ActionStatusRequest | ActionResultRequest,
        binding: SignerBinding,
        frame: dict[str, Any],
    ) -> bytes:
        """`action_status` for a status request; for a result request the `action_result`
        once the Action is terminal, else its `action_status` (the registry's pairing)."""
        view = await self._view(
            self._principal(binding), request.action_id, wait_ms=request.wait_ms or 0
        )
        result = view.get("result")
        if isinstance(request, ActionResultRequest) and result is not None:
            return self._seal(RESULT, self._result(request.action_id, result), frame)
        with_result = isinstance(request, ActionStatusRequest) and request.include_result is True
        status = self._status(request.action_id, view, with_result=with_result)
        return self._seal(STATUS, status, frame)

    async def _cancel(
        self, request: Cancel, binding: SignerBinding, frame: dict[str, Any]
    ) -> bytes:
        """The executor is asked to cancel; the answer is the Action's terminal
        `action_result` (cancelled, or how it had already ended), or its `action_status`
        (`running`, `cancel` recorded) when it has not settled within the cancel wait."""
        action_id = request.target.action
        if action_id is None:
            raise NativeRefusal(
                "capability.unsupported",
                "only an Action can be cancelled here (target.action)",
                ErrorCategory.PERMANENT,
            )
        principal = self._principal(binding)
        view = await self._view(principal, action_id)
        if view.get("result") is None:
            bus_id = namespaced_action_id(principal.principal_id, principal.tenant_id, action_id)
            try:
                await self.service.cancel(principal, bus_id, request.reason or "")
            except ConnectorError as exc:
                raise _refusal_of_connector(exc) from None
            view = await self._view(principal, action_id, wait_ms=2_000)
        result = view.get("result")
        if result is not None:
            return self._seal(RESULT, self._result(action_id, result), frame)
        return self._seal(STATUS, self._status(action_id, view, with_result=False), frame)

    async def _events(
        self, request: ActionEventsRequest, binding: SignerBinding, frame: dict[str, Any]
    ) -> bytes:
        """One page of the Action's events: each chunk of its chain from `cursor` (a
        sequence number, as a decimal string) whose kind `kinds` names, an Event of kind
        `stream_chunk.{kind}`; the StreamChunks too with `include_chunks`. `follow` waits,
        within the request's timeout, for an event when the page would be empty and the
        Action has not ended. While it runs the chain is followed forward (each event's
        `data.verified` false: not yet checked against a signed result); once it settled,
        exactly the chain its signed result vouches for."""
        cursor = _cursor_of(request.cursor)
        kinds = frozenset(request.kinds or ())
        principal = self._principal(binding)
        bus_id = namespaced_action_id(
            principal.principal_id, principal.tenant_id, request.action_id
        )
        bound_ms = self.settings.aip_request_timeout_ms - ANSWER_MARGIN_MS
        deadline = time.monotonic() + (max(0, bound_ms) / 1000 if request.follow else 0)
        while True:
            try:
                read = await self.service.own_chain(principal, bus_id)
            except ConnectorError as exc:
                raise _refusal_of_lookup(exc, request.action_id) from None
            page = events_page(
                request.action_id,
                read.links,
                cursor=cursor,
                limit=request.limit or EVENTS_PAGE,
                kinds=kinds,
                verified=read.verified,
                terminal=read.record.state.terminal,
                include_chunks=request.include_chunks is True,
            )
            if page["events"] or page["terminal"] or time.monotonic() >= deadline:
                return self._seal(EVENTS, page, frame)
            await asyncio.sleep(POLL_S)

    @staticmethod
    def _result(action_id: str, result: Mapping[str, Any]) -> dict[str, Any]:
        """The AIP ActionResult of a settled child, named by the requester's Action id."""
        return action_result(action_id, result)
