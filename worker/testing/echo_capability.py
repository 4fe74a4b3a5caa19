"""A downstream AIP capability on the bus that echoes its input: a child the gateway can route.

Delegation tests need a child capability outside Hermes (`cap:support_sandbox:…`) that the
real gateway dispatches like any other: the route table sends it to `{subject_prefix}.actions`
and follows `{subject_prefix}.results.{id}`. This service is that executor — a JetStream
stream over `{subject_prefix}.>`, one push subscription, and for every child one
`ActionResult` with `{"echo": input, "capability": capability}`, published with
`Nats-Msg-Id` `{id}:result` (so a re-sent child still has exactly one result).

It speaks the wire a Hermes worker speaks: the child arrives as the gateway's signed
`aip.core.v1.action` Envelope (`worker.wire.actions`; an unsigned one, or one whose
signature does not verify, is terminated unanswered) and the answer is an
`aip.core.v1.action_result` Envelope signed with the executor's own key
(`worker.wire.results`; `signer`, a fresh key unless one is given: trust it through the
gateway's `AIPD_TRUSTED_WORKER_KEYS_FILE` where that is set).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import StreamConfig

from schemas.delegation import ChildAction
from schemas.errors import EnvelopeRejected
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import EndpointSubjects, result_msg_id
from worker import tracing
from worker.aip.signing import AipSigner
from worker.wire.actions import decode_child_action
from worker.wire.results import encode_result

log = logging.getLogger(__name__)

SANDBOX_PREFIX = "cap:support_sandbox:"
SANDBOX_SUBJECT_PREFIX = "aip.sandbox"
EXECUTOR_ID = "echo-capability"


def echo_output(child: ChildAction) -> dict[str, Any]:
    """What the echo capability answers for `child` (deterministic, comparable)."""
    return {"echo": child.input, "capability": child.capability}


class EchoCapability:
    def __init__(
        self,
        nc: NATS,
        subject_prefix: str = SANDBOX_SUBJECT_PREFIX,
        *,
        signer: AipSigner | None = None,
    ) -> None:
        self.nc = nc
        #: The key its result Envelopes are signed with.
        self.signer = signer or AipSigner.from_seed(os.urandom(32))
        self.subject_prefix = subject_prefix
        self.subjects = EndpointSubjects(subject_prefix)
        #: Every child executed, in order (a re-sent child dropped by JetStream is not here).
        self.executed: list[ChildAction] = []
        self._sub: Subscription | None = None

    @property
    def route(self) -> dict[str, str]:
        """The `AIPD_CAPABILITY_ROUTES` entry that sends sandbox children here."""
        return {SANDBOX_PREFIX: self.subject_prefix}

    async def start(self) -> None:
        js = self.nc.jetstream()
        name = self.subject_prefix.upper().replace(".", "_").replace("-", "_")
        await js.add_stream(
            StreamConfig(name=name, subjects=[f"{self.subject_prefix}.>"], duplicate_window=120)
        )
        self._sub = await js.subscribe(self.subjects.actions, cb=self._execute, manual_ack=True)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _execute(self, msg: Msg) -> None:
        with tracing.consuming(msg):  # an executor continues the dispatcher's trace
            await self._answer(msg)

    async def _answer(self, msg: Msg) -> None:
        try:
            child, opened = decode_child_action(msg.data)
        except EnvelopeRejected as exc:
            log.warning("echo capability: refused a child: %s", exc.reason)
            await msg.term()
            return
        if opened.verified is None:
            log.warning("echo capability: refused an unsigned child %s", child.id)
            await msg.term()
            return
        self.executed.append(child)
        result = ActionResult(
            action_id=child.id,
            capability=child.capability,
            endpoint_id="sandbox",
            status=ResultStatus.COMPLETED,
            output=echo_output(child),
            settled_by=EXECUTOR_ID,
            fence=0,
            settled_at_unix_ms=time.time_ns() // 1_000_000,
            action_sha256=hashlib.sha256(msg.data).hexdigest(),
        )
        await self.nc.jetstream().publish(
            self.subjects.results(child.id),
            encode_result(result, action=child, signer=self.signer, endpoint_id="sandbox"),
            headers={"Nats-Msg-Id": result_msg_id(child.id)},
        )
        await msg.ack()
