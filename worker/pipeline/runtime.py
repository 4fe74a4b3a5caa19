"""What every delivery shares: built once by the worker app (`worker.app`).

`Gate` is what the runtime asks of the trust layer (`worker.trust.gate.TrustGate`), in two
steps because they fail differently: an envelope whose *signature* fails cannot be trusted
even for its Action id, so it goes to the DLQ and touches no Action state (otherwise a forger
could settle, or poison the fingerprint of, someone else's Action id); a signed envelope
refused for its identity, tenant or approval is answered with a settled, failed ActionResult,
so its publisher learns why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nats.js import JetStreamContext

from schemas.action import Action
from schemas.audit import DetailValue
from subjects.grammar import Subjects
from worker.aip.signing import VerifiedEnvelope
from worker.bus.audit import AuditLog
from worker.bus.dead_letters import DeadLetters
from worker.bus.publisher import BusPublisher
from worker.endpoints import Endpoint
from worker.execution.context import Execution
from worker.execution.leases import LeaseKeeper
from worker.hermes.http_client import HermesClient
from worker.logs import RepeatedErrors
from worker.metrics import Metrics
from worker.operations.base import OperationSpec, Registry
from worker.pipeline.outbox import OutboxOutput
from worker.settings import Settings
from worker.store.lease_store import ActionSubject
from worker.store.stores import Stores
from worker.trust.signing import TrustedGatewayKeys


class Admitted(Protocol):
    """What admitted an envelope (`worker.trust.gate.AdmitDecision`)."""

    #: The trusted projection for provider requests.
    @property
    def headers(self) -> Mapping[str, str]: ...

    #: The verified tenant (not the claimed one).
    @property
    def tenant_id(self) -> str | None: ...

    def receipt_details(self) -> Mapping[str, DetailValue]:
        """Redacted facts for the `admitted` receipt: ids and revisions, never a credential."""
        ...


class Gate(Protocol):
    """The trust checks the runtime makes; each raises ConnectorError with the refusal code,
    and nothing has been sent to Hermes or recorded when one does."""

    #: Entries skipped at load because they had expired, by trust file (`identity`,
    #: `authority`): reported by the worker as a metric.
    @property
    def expired_entries(self) -> Mapping[str, int]: ...

    #: The trusted gateway keys (None: none configured), whose AIP signature makes a
    #: runtime store record evidence (`worker.delegation.stores`).
    @property
    def gateway_keys(self) -> TrustedGatewayKeys | None: ...

    def verify_signature(self, payload: bytes, headers: Mapping[str, str]) -> str | None:
        """The verified header signer of a payload still signed by headers; None when
        unsigned input is allowed in development."""
        ...

    def verify_action_signer(self, verified: VerifiedEnvelope | None) -> str | None:
        """The trusted gateway key that signed an Action's AIP Envelope (`verified`: what
        opening it found); None when unsigned input is allowed in development."""
        ...

    async def admit_verified(
        self,
        *,
        action: Action,
        signer: str | None,
        endpoint: Endpoint,
        spec: OperationSpec,
        stores: Stores,
        stored_at_ms: int | None = None,
        deadline_unix_ms: int | None = None,
    ) -> Admitted:
        """Identity, tenant and approval of an envelope whose signature `verify_signature`
        verified (`signer`): an Action or a delegation's internal Action alike.
        `stored_at_ms`: when JetStream stored its message (the replay window's reference);
        `deadline_unix_ms`: the runtime's effective deadline, projected to the provider."""
        ...

    async def check_delegated_child(
        self,
        stores: Stores,
        child: Action,
        *,
        delegator_id: str,
        tenant_id: str | None,
        decision_id: str | None,
    ) -> object:
        """The durable approval of the exact delegated `child`."""
        ...

    async def authorize_cancel(
        self, *, requested_by: str, subject: ActionSubject | None, stores: Stores
    ) -> None:
        """May `requested_by` cancel the Action whose lease recorded `subject`? With None
        (no worker leased it yet) only the requester's identity is checked."""
        ...

    async def check_fresh(self, sent_at_unix_ms: int, stores: Stores, message_id: str) -> None:
        """Refuse (`connector_host.replay`) a request sent outside the replay window of
        now, or whose `message_id` was used before: a cancel, which no stream stores."""
        ...

    def verify_strict(self, payload: bytes, headers: Mapping[str, str]) -> str:
        """A trusted-key signature over a store record; never waived by the unsigned-envelope
        development flag (records are evidence)."""
        ...


@dataclass(frozen=True, slots=True)
class EndpointRuntime:
    endpoint: Endpoint
    hermes: HermesClient


@dataclass(slots=True)
class Runtime:
    """What every delivery shares; built once by the worker app."""

    settings: Settings
    subjects: Subjects
    js: JetStreamContext
    stores: Stores
    publisher: BusPublisher
    dead_letters: DeadLetters
    audit: AuditLog
    keeper: LeaseKeeper[Execution]
    registry: Registry
    endpoints: dict[str, EndpointRuntime]
    gate: Gate
    worker_id: str
    metrics: Metrics
    shutting_down: bool = False
    #: Repeated delivery failures are logged once per cause per interval.
    errors: RepeatedErrors = field(default_factory=RepeatedErrors)
    #: What is published with a settled result, before it, in this order (the escalation
    #: output, then channel egress when configured): registered by the wiring, so the
    #: pipeline imports neither (worker/pipeline/outbox.py).
    outputs: list[OutboxOutput] = field(default_factory=list)
