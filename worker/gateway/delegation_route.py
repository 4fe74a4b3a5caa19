"""The delegation route (aip-1.0-wire.md §3.4, §1.12, §7.5): a GetAIP runtime configured with
`--delegation-nats-route CAPABILITY_ID=SERVER_URL,SUBJECT,PEER_ID,PEER_DID[,TIMEOUT_MS]` sends
a signed `aip.agent.v1.delegation_request` Envelope as a core NATS request on exactly
`SUBJECT` and waits up to `TIMEOUT_MS` for one signed `aip.agent.v1.delegation_result`.

The gateway answers on `AIPD_AIP_DELEGATION_SUBJECT`, in the native binding's queue group:

1. the native binding's checks, in its order (worker/gateway/aip_answers.py: frame,
   signature, trusted signer and `from`, `sent_at`, the message id claim);
2. the body is our internal DelegationRequest (`worker.wire.delegations.delegation_of`,
   the delegations subject's own decoding); refused before anything is published: a
   `requested_by` outside the signer's tenant (`auth.tenant_mismatch`), a delegate whose
   endpoint no stream serves (`delegation.target_mismatch`), a child capability no route
   serves (`capability.unsupported`);
3. the request is signed again with the gateway key (the key workers trust for every
   Action) and published on `aip.hermes.{endpoint}.delegations`, where the worker's
   delegation intake runs it (worker/delegation/: router policy, identity, approval, the
   Hermes operator run calling `aip_call` once, the verified child result). The first
   request of a `delegation_id` is recorded (`FirstSight`, KV bucket
   `AIP_DELEGATION_ROUTE`): asking again with the same body (a new `message_id`, after an
   `accepted` answer) publishes those same bytes again, which JetStream deduplicates and a
   worker recognises as the same delegation, and reads its result (already on the bus:
   answered at once); a different body under a used `delegation_id` is refused
   (`action.invalid_input`) before anything is published;
4. the answer is the DelegationResult the worker settled (`output.delegation_result`), or
   one built from its error when it refused the delegation, signed by the gateway and
   correlated by the reply recipe (§2.6), so getaip-server's peer checks hold with
   `PEER_ID` = `service:{AIPD_AIP_SERVICE}` and `PEER_DID` = the gateway key's `did:key`.
   Past `AIPD_AIP_DELEGATION_TIMEOUT_MS` (less a margin) the answer is the non-terminal
   `accepted` DelegationResult (the delegation was stored on its work queue and goes on;
   the same request again reads its result), or, when the publish could not be confirmed,
   a retryable `connector_host.not_ready` error whose outcome is uncertain.

The Envelope's `callback` is not used: the answer travels on the request's reply subject.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeout
from nats.js.client import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from schemas.aip.delegation import DelegationResult as AipDelegationResult
from schemas.delegation import DelegationRequest
from schemas.errors import EnvelopeRejected, ErrorCategory, ErrorCode, ProtocolError
from schemas.result import ActionResult, ResultStatus
from worker.aip.canonical import canonical_bytes
from worker.aip.signing import AipSigner
from worker.client import AipClient, UnverifiedResponse
from worker.delegation.action_id import delegation_action_id
from worker.delegation.router import delegate_endpoint
from worker.errors import NativeRefusal
from worker.gateway.aip_answers import ANSWER_MARGIN_MS, AipAnswers
from worker.gateway.native_nats import NatsResponder
from worker.gateway.native_trust import (
    MessageClaims,
    SignerBinding,
    TrustedSigners,
    open_bucket,
)
from worker.gateway.service import GatewayService
from worker.gateway.settings import GatewaySettings
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.delegations import (
    MESSAGE_TYPE,
    decode_delegation,
    delegation_of,
    delegation_result,
)
from worker.wire.envelopes import Opened

log = logging.getLogger(__name__)

RESULT: Final = "aip.agent.v1.delegation_result"
FIRST_SIGHT_BUCKET: Final = "AIP_DELEGATION_ROUTE"
#: As long as a worker keeps a delegation's result (AIPD_RESULT_TTL_MS' default).
FIRST_SIGHT_TTL_S: Final = 86_400


def _refused(code: str, message: str) -> NativeRefusal:
    return NativeRefusal(code, message, ErrorCategory.PERMANENT)


class FirstSight:
    """The first request of each delegation, durably, in a JetStream key-value bucket: the
    Envelope the gateway published for it (a pure function of the request and the gateway
    key, `encode_delegation`) and the digest of the body it was asked with. A later ask
    reuses that request, so its bytes, `Nats-Msg-Id` and operator fingerprint are the
    first's, whatever its own `sent_at` or correlation id."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, *, replicas: int = 1) -> FirstSight:
        description = "delegation route: the first request of each delegation_id"
        return cls(
            await open_bucket(js, FIRST_SIGHT_BUCKET, FIRST_SIGHT_TTL_S, description, replicas)
        )

    async def first(
        self, request: DelegationRequest, opened: Opened, client: AipClient
    ) -> DelegationRequest:
        """The request to publish for `request`: itself when its delegation is new, else
        the first one (NativeRefusal `action.invalid_input` when the bodies differ)."""
        key = delegation_action_id(request.delegation_id)
        digest = hashlib.sha256(canonical_bytes(opened.payload)).hexdigest()
        sealed = client.seal_delegation(request)
        record = msgspec.json.encode({"body_sha256": digest, "envelope": sealed.decode()})
        try:
            await self.kv.create(key, record)
            return request
        except KeyWrongLastSequenceError:
            entry = await self.kv.get(key)
        first = msgspec.json.decode(entry.value or b"{}")
        if first.get("body_sha256") != digest:
            raise _refused(
                "action.invalid_input",
                f"delegation {request.delegation_id[:80]!r} was first asked with another "
                "request: use a new delegation_id",
            )
        previous, _ = decode_delegation(str(first["envelope"]).encode())
        return previous


class DelegationRoute:
    """The body of a delegation route request, once `AipAnswers` admitted it."""

    def __init__(
        self,
        settings: GatewaySettings,
        answers: AipAnswers,
        service: GatewayService,
        client: AipClient,
        first: FirstSight,
    ) -> None:
        self.settings = settings
        self.answers = answers
        self.service = service
        self.first = first
        #: Publishes the request on the delegations subject (signed with the gateway key)
        #: and reads the delegation's result (verified against the trusted worker keys).
        self.client = client

    async def answer(self, opened: Opened, binding: SignerBinding, frame: dict[str, Any]) -> bytes:
        if opened.message_type != MESSAGE_TYPE:
            raise _refused(
                "capability.unsupported",
                f"{opened.message_type} is not served on the delegation route (served: "
                f"{MESSAGE_TYPE})",
            )
        request = delegation_of(opened)
        endpoint_id = await self._check(request, binding)
        request = await self.first.first(request, opened, self.client)
        action_id = delegation_action_id(request.delegation_id)
        stored = await self._stored(endpoint_id, action_id)
        if stored is not None:
            return self._result(request, stored, frame)
        deadline = (
            time.monotonic() + (self.settings.aip_delegation_timeout_ms - ANSWER_MARGIN_MS) / 1000
        )
        try:
            handle = await asyncio.wait_for(
                self.client.delegate(request), max(0.0, deadline - time.monotonic())
            )
        except EnvelopeRejected:
            raise  # a request the workers would refuse to decode: answered as such
        except Exception as exc:  # NATS down, the stream gone: the publish is not confirmed
            log.warning("delegation %s not published: %s", action_id, type(exc).__name__)
            raise NativeRefusal(
                ErrorCode.HOST_NOT_READY.value,
                "the delegation was not confirmed on its work queue; send the same "
                "delegation again (new message_id)",
                ErrorCategory.TEMPORARY,
                retryable=True,
                retry_after_ms=1000,
                uncertain=True,
            ) from None
        try:
            result = await handle.result(timeout_s=max(0.0, deadline - time.monotonic()))
        except (NatsTimeout, TimeoutError, UnverifiedResponse):
            return self._pending(request, frame)
        return self._result(request, result, frame)

    async def _check(self, request: DelegationRequest, binding: SignerBinding) -> str:
        """Refuse, before anything is published, what cannot run here; the delegate's
        endpoint."""
        if binding.tenant_id is not None and request.delegator.tenant_id != binding.tenant_id:
            raise NativeRefusal(
                "auth.tenant_mismatch",
                "requested_by is not in the tenant of the signer's binding",
            )
        endpoint_id = delegate_endpoint(request)
        subject = self.client.subjects.delegations(endpoint_id)
        try:
            await self.client.nc.jetstream().find_stream_name_by_subject(subject)
        except NotFoundError:
            raise _refused(
                "delegation.target_mismatch",
                f"no endpoint {endpoint_id[:80]!r} takes delegations on this bus",
            ) from None
        capability = request.action.capability
        route = self.service.routes.resolve(capability)
        if route is None or not await self.service.children.served(route):
            raise _refused(
                "capability.unsupported",
                f"no route on this bus serves the child capability {capability[:200]!r}",
            )
        return endpoint_id

    async def _stored(self, endpoint_id: str, action_id: str) -> ActionResult | None:
        try:
            return await self.client.stored_result(endpoint_id, action_id)
        except UnverifiedResponse:
            return None

    def _result(
        self, request: DelegationRequest, result: ActionResult, frame: dict[str, Any]
    ) -> bytes:
        """The DelegationResult of the delegation's settled result: the worker's own, when
        it names this request's ids, else one built from the result's error."""
        output = result.output if isinstance(result.output, dict) else {}
        settled = output.get("delegation_result")
        if settled is not None:
            try:
                typed = msgspec.convert(settled, AipDelegationResult, strict=True)
            except msgspec.ValidationError:
                typed = None
            expected = (request.delegation_id, request.action.id)
            if typed is None or (typed.delegation_id, typed.child_action_id) != expected:
                raise _refused(
                    "action.invalid_input",
                    f"delegation {request.delegation_id[:80]!r} already ran with another "
                    "child Action: use a new delegation_id",
                )
            return self.answers.sealed(RESULT, msgspec.to_builtins(typed), frame)
        # The worker refused the delegation (policy, identity, approval...): its error.
        error = result.error or ProtocolError(
            code=ErrorCode.HOST_EXECUTION,
            message="the delegation ended without a DelegationResult",
            category=ErrorCategory.CONNECTOR,
            retryable=False,
            uncertain_outcome=False,
        )
        status = result.status
        if status not in (ResultStatus.FAILED, ResultStatus.CANCELLED):
            status = ResultStatus.FAILED
        body = delegation_result(request, status, None, error)
        return self.answers.sealed(RESULT, body, frame)

    def _pending(self, request: DelegationRequest, frame: dict[str, Any]) -> bytes:
        contract = request.action.delegation
        body = {
            "delegation_id": request.delegation_id,
            "parent_action_id": contract.parent_action_id if contract else "",
            "child_action_id": request.action.id,
            "status": "accepted",
        }
        return self.answers.sealed(RESULT, body, frame)


class DelegationRouteResponder:
    """The route's one subject, served by the native binding's transport (queue group,
    in-flight bound, one reply: `NatsResponder`), each request answered by
    `DelegationRoute` after `AipAnswers`' checks."""

    def __init__(
        self,
        settings: GatewaySettings,
        nc: NATS,
        service: GatewayService,
        signers: TrustedSigners,
        claims: MessageClaims,
        signer: AipSigner,
        *,
        worker_keys: TrustedGatewayKeys | None,
        first: FirstSight,
    ) -> None:
        assert settings.aip_delegation_subject is not None
        self.subject = settings.aip_delegation_subject
        self.answers = answers = AipAnswers(
            settings,
            service,
            signers,
            claims,
            signer,
        )
        client = AipClient(
            nc,
            prefix=settings.subject_prefix,
            sign_key=settings.gateway_signing_key_file,
            trusted_worker_keys=worker_keys,
        )
        self.route = route = DelegationRoute(settings, answers, service, client, first)

        async def handle(data: bytes, headers: Mapping[str, str] | None) -> bytes:
            return await answers.answer_by(route.answer, data, headers)

        self.responder = NatsResponder(
            settings, nc, self.subject, answers, handle, name="delegation route"
        )

    async def start(self) -> None:
        await self.responder.start()

    async def stop(self) -> None:
        await self.responder.stop()
