"""The native NATS binding `aip.native.nats.v1` (aip-1.0-wire.md §3.1 to §3.3): a GetAIP
runtime, or any AIP client, sends signed Envelopes to this pool as core NATS requests.

One queue-group subscription on `aip.v1.{trust_domain}.{service}.{version}.>` (each part
sanitised as the reference does: `.`, space, `/` and `\\` become `_`), shared by every
gateway. A request is a TransportMessage `{"envelope": …, "metadata": {…}}` or a bare
Envelope; the answer is exactly one TransportMessage with `AIP-*` headers. What is checked
and answered is worker/gateway/aip_answers.py's; this module is the transport
(`NatsResponder`: the subscription, the bound on requests in flight, the reply), which the
delegation route (worker/gateway/delegation_route.py) serves its own subject with too, and
the binding (`NativeNatsResponder`), whose streaming Actions' chunks are published to their
`aip.native.nats.v1` callback (worker/gateway/chunk_sinks.py).

A request without a reply subject is dropped with a log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from schemas.errors import ErrorCategory, ErrorCode
from worker.aip.signing import AipSigner
from worker.errors import NativeRefusal
from worker.gateway.aip_answers import AipAnswers
from worker.gateway.chunk_sinks import NatsCallbackSinks, transport_message
from worker.gateway.native_subjects import service_subject
from worker.gateway.native_trust import MessageClaims, TrustedSigners
from worker.gateway.service import GatewayService
from worker.gateway.settings import GatewaySettings
from worker.tasks import stop_tasks
from worker.wire.manifests import NATIVE_NATS_PROFILE

log = logging.getLogger(__name__)

#: Answers one request's bytes (and its headers) with one signed Envelope; never raises.
Handler = Callable[[bytes, Mapping[str, str] | None], Awaitable[bytes]]


class NatsResponder:
    """The transport of a request/reply binding on one subject: a queue-group subscription,
    at most `AIPD_AIP_MAX_IN_FLIGHT` requests answered at once (past that one is answered
    `connector_host.capacity`, retryable, at once), and exactly one reply per request.
    What a request is answered with is `handle`'s; `answers` words the capacity refusal."""

    def __init__(
        self,
        settings: GatewaySettings,
        nc: NATS,
        subject: str,
        answers: AipAnswers,
        handle: Handler,
        *,
        name: str,
    ) -> None:
        self.settings = settings
        self.nc = nc
        #: The subject (or wildcard pattern) subscribed.
        self.subject = subject
        self.answers = answers
        self.handle = handle
        #: What the log lines call this responder.
        self.name = name
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._slots = asyncio.Semaphore(settings.aip_max_in_flight)

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(
            self.subject, queue=self.settings.aip_queue_group, cb=self._received
        )
        log.info(
            "%s serving %s (queue group %s, %d trusted signers)",
            self.name,
            self.subject,
            self.settings.aip_queue_group,
            len(self.answers.signers),
        )

    async def stop(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # a closed connection: nothing more arrives anyway
                log.info("%s unsubscribe: %s", self.name, type(exc).__name__)
        await stop_tasks(list(self._tasks), 5.0)
        await self.answers.stop()

    async def _received(self, msg: Msg) -> None:
        """Each request in its own task (a sync Action waits), at most
        `AIPD_AIP_MAX_IN_FLIGHT` at once; past that one is answered retryable at once."""
        if not msg.reply:
            log.warning(
                "%s request on %s has no reply subject: dropped", self.name, msg.subject[:200]
            )
            return
        if self._slots.locked():
            await self._answer(
                msg,
                self.answers.refusal(
                    NativeRefusal(
                        ErrorCode.HOST_CAPACITY.value,
                        "the gateway is answering as many requests as it may",
                        ErrorCategory.TEMPORARY,
                        retryable=True,
                        retry_after_ms=1000,
                    ),
                    msg.data or b"",
                ),
            )
            return
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(self._handle(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._slots.release())

    async def _handle(self, msg: Msg) -> None:
        await self._answer(msg, await self.handle(msg.data or b"", msg.headers))

    async def _answer(self, msg: Msg, envelope: bytes) -> None:
        payload, headers = transport_message(envelope)
        try:
            await self.nc.publish(msg.reply, payload, headers=headers)
        except Exception as exc:  # the requester is gone or NATS is down: nothing to do
            log.warning("%s answer not sent: %s", self.name, type(exc).__name__)


class NativeNatsResponder:
    """The binding: `AipAnswers` with the `aip.native.nats.v1` callback sink, answering on
    every subject under `aip.v1.{td}.{service}.{version}`."""

    def __init__(
        self,
        settings: GatewaySettings,
        nc: NATS,
        service: GatewayService,
        signers: TrustedSigners,
        claims: MessageClaims,
        signer: AipSigner,
    ) -> None:
        self.subject = subject = service_subject(
            settings.aip_trust_domain, settings.aip_service, settings.aip_version
        )
        self.answers = answers = AipAnswers(
            settings,
            service,
            signers,
            claims,
            signer,
            sinks={
                NATIVE_NATS_PROFILE: NatsCallbackSinks(
                    nc,
                    bus_prefix=settings.subject_prefix,
                    route_prefixes=service.routes.describe().values(),
                    binding_subject=subject,
                )
            },
        )
        self.responder = NatsResponder(
            settings, nc, f"{subject}.>", answers, answers.answer, name=NATIVE_NATS_PROFILE
        )

    async def start(self) -> None:
        await self.responder.start()

    async def stop(self) -> None:
        await self.responder.stop()
