"""The connector host over native HTTP `aip.native.http.v1` (aip-1.0-wire.md §3.6, §3.7):
a GetAIP central invokes this pool as a remote connector with `POST /aip/v1/messages` and
reads `GET /aip/v1/manifest`, on the gateway's HTTP port.

A request is one signed Envelope; the answer is one signed Envelope (`application/aip+json`,
`AIP-*` headers), correlated by the reply recipe. The checks run in the reference host's
order, each refusal an `aip.core.v1.error` Envelope with the reference code and HTTP status:

1. schema, then decode (`schema.envelope.invalid` / `envelope.decode.invalid`, 400);
2. signature, trusted signer, `from` its bound principal (`connector_host.route_mismatch`,
   401): worker/gateway/aip_answers.py's checks, worded as the host words them;
3. recipient (`to` is this host) and the pinned route `security.connector_route` (tenant,
   instance, replica, version, manifest digest; for an Action its id and capability, for a
   cancel or lifecycle query its Action id); a streaming Action must name exactly the
   central callback, any other Action none; the central's approval record when the Action
   carries an approval, and only then (worker/gateway/host_approvals.py)
   (`connector_host.route_mismatch`, 403);
4. Actions only: readiness (not draining, a live lease when a central is configured, NATS
   connected: `connector_host.not_ready`, 503), then capacity (`connector_host.capacity`,
   429);
5. Actions only: the pinned credential revision (`connector_host.credential_revision_denied`,
   403), then the import of the central's approval record
   (`connector_host.approval_authorization_conflict`, 403, or `..._unavailable`, 503);
6. `sent_at` and the one claim of the message id (`connector_host.replay`, 409), then the
   body, answered as aip_answers.py answers it; a streaming Action's chunks are forwarded
   live to the central callback (worker/gateway/chunk_follower.py `Release.LIVE`, through
   worker/gateway/connector_stream.py) and its answer is the `action_result`.

The registration, heartbeat and drain lease with the central is
worker/gateway/connector_control.py's. Nothing a request carries can make the host raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx
import msgspec
from starlette.types import Receive, Scope, Send

from schemas.aip.action import Action as AipAction
from schemas.aip.action import Mode as AipMode
from schemas.aip.control import Cancel
from schemas.aip.lifecycle import ActionResultRequest, ActionStatusRequest
from schemas.aip.manifest import ManifestRequest
from schemas.errors import ErrorCategory, ErrorCode
from worker.aip.canonical import canonical_bytes
from worker.aip.signing import AipSigner
from worker.errors import ControlFailed, NativeRefusal
from worker.gateway.aip_answers import (
    ACTION,
    CANCEL,
    RESULT_REQUEST,
    STATUS_REQUEST,
    AipAnswers,
    answer_headers,
)
from worker.gateway.chunk_follower import ChunkSink, Release
from worker.gateway.connector_control import (
    CALLBACKS_PATH,
    HTTP_PROFILE,
    ConnectorControl,
)
from worker.gateway.connector_stream import ChunkStream
from worker.gateway.host_approvals import HostApprovalImports, check_route_authorization
from worker.gateway.http_limits import bounded_body, send_response
from worker.gateway.native_trust import MessageClaims, SignerBinding, TrustedSigners
from worker.gateway.service import GatewayService
from worker.gateway.settings import GatewaySettings
from worker.wire.envelopes import Opened, open_payload

log = logging.getLogger(__name__)

MESSAGES_PATH: Final = "/aip/v1/messages"
MANIFEST_PATH: Final = "/aip/v1/manifest"
PATHS: Final = frozenset({MESSAGES_PATH, MANIFEST_PATH})
CONTENT_TYPE: Final = b"application/aip+json"
#: The reference host's bound on a request body.
MAX_REQUEST_BYTES: Final = 4 * 1024 * 1024
#: The reference's retry hints.
NOT_READY_RETRY_MS: Final = 10_000
CAPACITY_RETRY_MS: Final = 100
#: How long the pool's manifest (and so the digest a route must pin) is reused; the
#: reference host's heartbeat interval.
MANIFEST_MAX_AGE_S: Final = 10.0

ROUTE_MISMATCH: Final = ErrorCode.HOST_ROUTE_MISMATCH.value
#: The signer/sender refusals of aip_answers.py, as the reference host words them.
_SIGNER_CODES: Final = frozenset(
    {"auth.signature.invalid", "auth.unverified_actor", "auth.claim_mismatch"}
)
#: The HTTP status of each host code (§3.6); route_mismatch is 403 unless it is the
#: signer's (401).
STATUS_OF_CODE: Final = {
    ErrorCode.SCHEMA_ENVELOPE_INVALID.value: 400,
    ErrorCode.ENVELOPE_DECODE_INVALID.value: 400,
    ROUTE_MISMATCH: 403,
    ErrorCode.HOST_AUTHENTICATION.value: 401,
    ErrorCode.HOST_REPLAY.value: 409,
    ErrorCode.HOST_NOT_READY.value: 503,
    ErrorCode.HOST_CAPACITY.value: 429,
    ErrorCode.HOST_CREDENTIAL_REVISION_DENIED.value: 403,
    "connector_host.credential_revision_unavailable": 503,
    ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT.value: 403,
    ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE.value: 503,
    ErrorCode.HOST_EXECUTION.value: 502,
    ErrorCode.HOST_RESPONSE_SIGNING.value: 500,
}
#: Any other code by its category (the native HTTP binding's rule, §3.7).
STATUS_OF_CATEGORY: Final = {
    ErrorCategory.AUTH: 401,
    ErrorCategory.POLICY: 403,
    ErrorCategory.TEMPORARY: 503,
    ErrorCategory.TRANSPORT: 503,
    ErrorCategory.CONNECTOR: 502,
    ErrorCategory.PERMANENT: 400,
}
#: The route fields every routed request must match, and the setting each is checked with.
_ROUTE_FIELDS: Final = ("tenant_id", "instance_id", "replica_id", "version_id")


@dataclass
class Exchange:
    """One HTTP request's facts the answer does not carry: its status, and whether it holds
    one of the host's Action slots."""

    status: int = 200
    slot: bool = False


_EXCHANGE: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar(
    "connector_host_exchange", default=None
)


def _status_of(refusal: NativeRefusal) -> int:
    status = STATUS_OF_CODE.get(refusal.code)
    if status is not None:
        return status
    if refusal.code.startswith(("auth.", "action.", "delegation.", "credential.")):
        return 403  # a gateway policy error, passed through
    return STATUS_OF_CATEGORY.get(refusal.category, 502)


def _mismatch(message: str) -> NativeRefusal:
    return NativeRefusal(ROUTE_MISMATCH, message, ErrorCategory.AUTH)


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """`sha256:` and the hex SHA-256 of the manifest's canonical JSON."""
    return "sha256:" + hashlib.sha256(canonical_bytes(dict(manifest))).hexdigest()


class HostAnswers(AipAnswers):
    """aip_answers.py's checks and answers, with the host's own checks and wording."""

    #: Chunks go to the central while the Action runs, as the reference host sends them
    #: and the central expects them (docs/aip.md, "What each binding guarantees of chunks").
    chunk_release = Release.LIVE

    def __init__(
        self,
        settings: GatewaySettings,
        service: GatewayService,
        signers: TrustedSigners,
        claims: MessageClaims,
        signer: AipSigner,
        *,
        approvals: HostApprovalImports,
        healthy: Callable[[], bool],
    ) -> None:
        super().__init__(
            settings,
            service,
            signers,
            claims,
            signer,
            binding=HTTP_PROFILE,
        )
        self.healthy = healthy
        #: The central's approval records this host imported (host_approvals.py).
        self.approvals = approvals
        #: Where streamed chunks are POSTed from (connector_stream.py).
        self.client = httpx.AsyncClient(follow_redirects=False)
        self.replica_id = settings.aip_host_replica_id or settings.gateway_id
        self.control: ConnectorControl | None = None
        self.draining = False
        self.in_flight = 0
        #: Set while no Action holds a slot (what a drain waits for).
        self.idle = asyncio.Event()
        self.idle.set()
        self._manifest_cache: tuple[float, dict[str, Any], str] | None = None
        self._manifest_lock = asyncio.Lock()

    # --- the manifest and its digest -----------------------------------------------------

    async def manifest(self) -> tuple[dict[str, Any], str]:
        """The pool's manifest as this host serves it, and its digest: read from the workers
        at most every `MANIFEST_MAX_AGE_S` (a read collects every worker's answer, which
        takes a while, and the manifest changes only when the pool is redeployed), by one
        request at a time."""
        async with self._manifest_lock:
            cached = self._manifest_cache
            if cached is not None and time.monotonic() - cached[0] < MANIFEST_MAX_AGE_S:
                return cached[1], cached[2]
            manifest = await self._manifest(ManifestRequest())
            digest = manifest_digest(manifest)
            self._manifest_cache = (time.monotonic(), manifest, digest)
            return manifest, digest

    async def manifest_facts(self) -> tuple[str, int]:
        """The digest and capability count the registration reports."""
        manifest, digest = await self.manifest()
        return digest, len(manifest.get("capabilities") or [])

    # --- hooks --------------------------------------------------------------------------

    def translate(self, refusal: NativeRefusal) -> NativeRefusal:
        """The reference host's code for the checks aip_answers.py makes, and the HTTP
        status of the answer."""
        status: int | None = None
        if refusal.code in _SIGNER_CODES:
            refusal = NativeRefusal(ROUTE_MISMATCH, refusal.message, ErrorCategory.AUTH)
            status = 401
        elif refusal.code == "replay.message_id":
            refusal = NativeRefusal(
                ErrorCode.HOST_REPLAY.value, refusal.message, ErrorCategory.POLICY
            )
        elif refusal.code == "capability.unsupported":
            refusal = NativeRefusal(
                ErrorCode.HOST_EXECUTION.value, refusal.message, ErrorCategory.CONNECTOR
            )
        exchange = _EXCHANGE.get()
        if exchange is not None:
            exchange.status = status or _status_of(refusal)
        return refusal

    async def admitted(self, opened: Opened, binding: SignerBinding) -> None:
        """Recipient and route; for an Action then readiness, capacity, credential
        revision and approval authorization (the reference order)."""
        self._check_recipient(opened.envelope.get("to"))
        message_type = opened.message_type
        if message_type not in (ACTION, CANCEL, STATUS_REQUEST, RESULT_REQUEST):
            return  # manifest, heartbeat: nothing is routed
        route = await self._check_route(opened)
        body = open_payload(opened, message_type)
        if isinstance(body, AipAction):
            self._check_action_route(body, route)
            record = check_route_authorization(body, route, self.settings.aip_host_tenant_id)
            self._check_ready()
            self._take_slot()
            self._check_credential_revision(route)
            if record is not None:
                await self.approvals.record(record)
            return
        check_route_authorization(body, route, self.settings.aip_host_tenant_id)
        if isinstance(body, Cancel):
            target = body.target.action
        else:
            assert isinstance(body, ActionStatusRequest | ActionResultRequest)
            target = body.action_id
        if target != route.get("action_id"):
            raise _mismatch("the request's Action is not the pinned route's action_id")

    def _check_recipient(self, to: Any) -> None:
        if (
            not isinstance(to, Mapping)
            or to.get("id") != self.principal["id"]
            or to.get("kind") != self.principal["kind"]
            or to.get("did", self.signer.did) != self.signer.did
        ):
            raise _mismatch("`to` is not this connector host")

    async def _check_route(self, opened: Opened) -> Mapping[str, Any]:
        security = opened.envelope.get("security")
        route = security.get("connector_route") if isinstance(security, Mapping) else None
        if not isinstance(route, Mapping):
            raise _mismatch("the request carries no security.connector_route")
        settings = self.settings
        expected = {
            "tenant_id": settings.aip_host_tenant_id,
            "instance_id": settings.aip_host_instance_id,
            "replica_id": self.replica_id,
            "version_id": settings.aip_host_version_id,
        }
        for field in _ROUTE_FIELDS:
            if route.get(field) != expected[field]:
                raise _mismatch(f"the pinned route's {field} is not this host's")
        _, digest = await self.manifest()
        if route.get("manifest_digest") != digest:
            raise _mismatch("the pinned route's manifest_digest is not this host's manifest")
        return route

    def _check_action_route(self, action: AipAction, route: Mapping[str, Any]) -> None:
        if route.get("action_id") != action.id:
            raise _mismatch("the pinned route's action_id is not the Action's id")
        if route.get("capability_id") != action.capability_id:
            raise _mismatch("the pinned route's capability_id is not the Action's")
        # The central put the verified tenant there; a claim of another is refused (the
        # identity the Action runs as is still the signer binding's, never the wire's).
        tenant = action.identity.tenant if action.identity is not None else None
        if tenant is not None and tenant.id != route.get("tenant_id"):
            raise _mismatch("the Action's identity.tenant is not the pinned route's tenant")
        callback = action.callback
        if action.mode is not AipMode.STREAMING:
            if callback is not None:
                raise _mismatch("a non-streaming Action carries a callback")
            return
        central = self.settings.aip_central_url
        if central is None:
            raise _mismatch("streaming needs a central (AIPD_AIP_CENTRAL_URL is not set)")
        metadata = callback.metadata if callback is not None else None
        recipient = metadata.get("connector_callback_recipient") if metadata else None
        if (
            callback is None
            or callback.profile != HTTP_PROFILE
            or callback.target != central.rstrip("/") + CALLBACKS_PATH
            or not isinstance(metadata, dict)
            or set(metadata) != {"connector_callback", "connector_callback_recipient"}
            or metadata["connector_callback"] != dict(route)
            or not isinstance(recipient, dict)
            or not isinstance(recipient.get("id"), str)
            or not isinstance(recipient.get("kind"), str)
        ):
            raise _mismatch("a streaming Action's callback is not the central callback")

    def _check_ready(self) -> None:
        why = None
        if self.draining:
            why = "the connector host is draining"
        elif self.control is not None and not self.control.lease_valid():
            why = "the connector host holds no valid lease from the central"
        elif not self.healthy():
            why = "the connector host's bus connection is down"
        if why is not None:
            raise NativeRefusal(
                ErrorCode.HOST_NOT_READY.value,
                why,
                ErrorCategory.TEMPORARY,
                retryable=True,
                retry_after_ms=NOT_READY_RETRY_MS,
            )

    def _take_slot(self) -> None:
        exchange = _EXCHANGE.get()
        if self.in_flight >= self.settings.aip_host_max_in_flight:
            raise NativeRefusal(
                ErrorCode.HOST_CAPACITY.value,
                "the connector host runs as many Actions as it may",
                ErrorCategory.TEMPORARY,
                retryable=True,
                retry_after_ms=CAPACITY_RETRY_MS,
            )
        if exchange is not None and not exchange.slot:
            self.in_flight += 1
            self.idle.clear()
            exchange.slot = True

    def release(self, exchange: Exchange) -> None:
        if exchange.slot:
            exchange.slot = False
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.set()

    def _check_credential_revision(self, route: Mapping[str, Any]) -> None:
        """The reference's static policy: revoked never; else current or an accepted
        previous; no pinned revision only while the host names none."""
        settings = self.settings
        pinned = route.get("credential_revision_ref")
        accepted = settings.accepted_credential_revisions
        current = settings.aip_host_credential_revision
        if pinned is None:
            allowed = current is None and not accepted
        else:
            allowed = pinned not in settings.revoked_credential_revisions and (
                pinned == current or pinned in accepted
            )
        if not allowed:
            raise NativeRefusal(
                ErrorCode.HOST_CREDENTIAL_REVISION_DENIED.value,
                "the pinned credential revision is not authorised by this host",
                ErrorCategory.AUTH,
            )

    # --- streaming ------------------------------------------------------------------------

    def _sink(self, action: AipAction, frame: dict[str, Any]) -> ChunkSink:
        """The central callback the Action was admitted with (`_check_action_route`), as
        the sink its chunks are forwarded to live (`release`)."""
        callback = action.callback
        if callback is None or not isinstance(callback.metadata, dict):
            raise _mismatch("a streaming Action's callback is not the central callback")
        return ChunkStream(
            self.client,
            self.signer,
            self.principal,
            target=callback.target,
            recipient=callback.metadata["connector_callback_recipient"],
            route=callback.metadata["connector_callback"],
            correlation_id=frame.get("correlation_id"),
        )


class ConnectorHost:
    """The two HTTP paths, and the host's life: lease with the central, drain, stop."""

    def __init__(self, answers: HostAnswers) -> None:
        self.settings = settings = answers.settings
        self.answers = answers
        if settings.aip_central_url is not None:
            answers.control = ConnectorControl(
                settings,
                answers.signer,
                answers.principal,
                in_flight=lambda: answers.in_flight,
                manifest_facts=answers.manifest_facts,
                healthy=answers.healthy,
            )

    def start(self) -> None:
        if self.answers.control is not None:
            self.answers.control.start()
        log.info(
            "aip.native.http.v1 connector host serving %s (instance %s, replica %s, central %s)",
            MESSAGES_PATH,
            self.settings.aip_host_instance_id,
            self.answers.replica_id,
            self.settings.aip_central_url or "none",
        )

    def ready(self) -> bool:
        """For `/ready`: not draining, and holding a live lease when a central is set."""
        control = self.answers.control
        return not self.answers.draining and (control is None or control.lease_valid())

    async def drain(self) -> None:
        """Refuse new Actions, tell the central, let the running ones end (at most the
        drain timeout), then go offline."""
        answers = self.answers
        answers.draining = True
        control = answers.control
        if control is not None:
            await control.stop_heartbeats()
            try:
                await control.drain()
            except ControlFailed as exc:
                log.warning("connector-control drain: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                answers.idle.wait(), self.settings.aip_host_drain_timeout_ms / 1000
            )
        if control is not None:
            try:
                await control.offline()
            except ControlFailed as exc:
                log.warning("connector-control offline: %s", exc)

    async def stop(self) -> None:
        if self.answers.control is not None:
            await self.answers.control.close()
        await self.answers.stop()
        await self.answers.client.aclose()

    # --- HTTP -----------------------------------------------------------------------------

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        method = scope.get("method", "GET")
        if path == MANIFEST_PATH and method == "GET":
            await self._manifest(send)
        elif path == MESSAGES_PATH and method == "POST":
            await bounded_body(self._message, scope, receive, send, MAX_REQUEST_BYTES)
        else:
            allow = b"GET" if path == MANIFEST_PATH else b"POST"
            await send_response(
                send, 405, b'{"error": "method_not_allowed"}', extra_headers=((b"allow", allow),)
            )

    async def _manifest(self, send: Send) -> None:
        """The bare Manifest JSON (503 with the error while no worker answers)."""
        try:
            manifest, _ = await self.answers.manifest()
        except NativeRefusal as refusal:
            await send_response(send, 503, canonical_bytes({"error": refusal.to_aip()}))
            return
        await send_response(send, 200, canonical_bytes(manifest))

    async def _message(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        data = message.get("body", b"") if message["type"] == "http.request" else b""
        said: dict[str, str] = {}
        for name, value in scope.get("headers") or ():
            if name.lower() == b"aip-message-type":
                said["AIP-Message-Type"] = value.decode("latin-1")
            elif name.lower() == b"aip-message-id":
                said["AIP-Message-Id"] = value.decode("latin-1")
        exchange = Exchange()
        token = _EXCHANGE.set(exchange)
        try:
            answer = await self.answers.answer(data, said)
        finally:
            _EXCHANGE.reset(token)
            self.answers.release(exchange)
        document = msgspec.json.decode(answer)
        headers = tuple(
            (name.lower().encode(), value.encode())
            for name, value in answer_headers(document).items()
        )
        await send_response(send, exchange.status, answer, CONTENT_TYPE, headers)
