"""What the gateway tells operators: Prometheus metrics and one audit receipt per tool call.

Receipts go to the audit stream the workers use (`{prefix}.hermes.{endpoint}.audit.{id}`):
a call about a Hermes child is filed under that child's endpoint and id, beside the
worker's own receipts of the same Action, so `aip-hermes-worker audit` shows both sides; a
call with no Action (`aip_capabilities`, a refusal before an id exists) is filed under the
pseudo-endpoint `_gateway` and a fresh id. A receipt names who (principal, tenant), what
(tool, capability) and the decision (allowed, or the refusal code) — never an input.
"""

from __future__ import annotations

import logging
import time

from nats.aio.client import Client as NATS
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from schemas.audit import DetailValue, Receipt, ReceiptEvent
from schemas.ids import new_action_id
from subjects.grammar import Subjects
from worker.aip.signing import AipSigner
from worker.bus.publisher import receipt_headers
from worker.wire.receipts import encode_receipt

log = logging.getLogger(__name__)

PREFIX = "aip_gateway"
GATEWAY_AUDIT_ENDPOINT = "_gateway"


class GatewayMetrics:
    """A private registry (several gateways can live in one test process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tool_calls = Counter(
            f"{PREFIX}_tool_calls_total",
            "MCP tool calls by tool and decision",
            ["tool", "decision"],
            registry=self.registry,
        )
        self.unauthenticated = Counter(
            f"{PREFIX}_unauthenticated_requests_total",
            "HTTP requests refused with 401",
            registry=self.registry,
        )
        self.recoveries = Counter(
            f"{PREFIX}_recoveries_total",
            "Children moved on by the recovery sweep, by step",
            ["step"],
            registry=self.registry,
        )
        self.unverified_results = Counter(
            f"{PREFIX}_unverified_results_total",
            "Child results refused because no trusted worker key signed them",
            registry=self.registry,
        )
        self.chain_breaks = Counter(
            f"{PREFIX}_chunk_chain_breaks_total",
            "Messages on a streaming child's chunk subject not passed on as its chunks "
            "(worker/gateway/chunk_follower.py), by binding and reason",
            ["binding", "reason"],
            registry=self.registry,
        )
        self.ready = Gauge(
            f"{PREFIX}_ready", "1 when the last /ready check passed", registry=self.registry
        )

    def tool_call(self, tool: str, decision: str) -> None:
        self.tool_calls.labels(tool, decision).inc()

    def unverified_result(self) -> None:
        self.unverified_results.inc()

    def chain_break(self, binding: str, reason: str, count: int = 1) -> None:
        self.chain_breaks.labels(binding, reason).inc(count)

    def recovered(self, step: str) -> None:
        self.recoveries.labels(step).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ToolReceipts:
    """Publishes one receipt per tool call; never blocks or fails the call."""

    def __init__(
        self, nc: NATS, subjects: Subjects, gateway_id: str, *, seed: bytes | None = None
    ) -> None:
        self.nc = nc
        self.subjects = subjects
        self.gateway_id = gateway_id
        #: The gateway's signing seed: each receipt is signed with it, so `audit` (given the
        #: trusted gateway keys) shows it as the gateway's, never as a forgery.
        self.seed = seed

    async def emit(
        self,
        *,
        tool: str,
        principal_id: str,
        tenant_id: str | None,
        decision: str,
        action_id: str | None,
        endpoint_id: str | None,
        **details: DetailValue,
    ) -> None:
        receipt_action = action_id or new_action_id()
        endpoint = endpoint_id or GATEWAY_AUDIT_ENDPOINT
        ts = time.time_ns() // 1_000_000
        receipt = Receipt(
            receipt_id=f"{receipt_action}:tool_call:{tool}:{self.gateway_id}:{time.time_ns()}"[
                :256
            ],
            event=ReceiptEvent.TOOL_CALL,
            action_id=receipt_action,
            endpoint_id=endpoint,
            worker_id=self.gateway_id,
            ts_unix_ms=ts,
            details={
                "tool": tool,
                "principal_id": principal_id,
                "tenant_id": tenant_id,
                "decision": decision,
                **details,
            },
        )
        signer = AipSigner.from_nkey_seed(self.seed.strip()) if self.seed is not None else None
        data = encode_receipt(receipt, signer=signer)[0]
        headers = receipt_headers()  # no Nats-Msg-Id: it says why
        try:
            await self.nc.publish(
                self.subjects.audit(endpoint, receipt_action), data, headers=headers
            )
        except Exception as exc:
            log.warning("audit receipt not published: %s", type(exc).__name__)
