"""What every delivery shares: built once by the worker app (`worker.app`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.js import JetStreamContext

from subjects.grammar import Subjects
from worker.admission import Admission
from worker.bus.audit import AuditLog
from worker.bus.dead_letters import DeadLetters
from worker.bus.publisher import BusPublisher
from worker.endpoints import Endpoint
from worker.execution.context import Execution
from worker.execution.leases import LeaseKeeper
from worker.hermes.http_client import HermesClient
from worker.logs import RepeatedErrors
from worker.metrics import Metrics
from worker.operations.base import Registry
from worker.pipeline.outbox import OutboxOutput
from worker.settings import Settings
from worker.store.stores import Stores


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
    admission: Admission
    worker_id: str
    metrics: Metrics
    shutting_down: bool = False
    #: Repeated delivery failures are logged once per cause per interval.
    errors: RepeatedErrors = field(default_factory=RepeatedErrors)
    #: What is published with a settled result, before it, in this order (the escalation
    #: output, then channel egress when configured): registered by the wiring, so the
    #: pipeline imports neither (worker/pipeline/outbox.py).
    outputs: list[OutboxOutput] = field(default_factory=list)
