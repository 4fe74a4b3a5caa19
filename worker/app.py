"""The worker process: wires the runtime together, runs it, and drains it on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from nats.aio.client import Client as NATS

from subjects.grammar import Subjects
from subjects.provision import provision
from worker import gc_policy
from worker.bus.acked_publish import AckedPublisher
from worker.bus.audit import AuditLog, provider_receipt
from worker.bus.connections import connect_nats, open_redis_for, stream_policy
from worker.bus.consumer import MAX_ADMITTING, AllGates, FetchGate, PullLoop, Slots
from worker.bus.dead_letters import DeadLetters
from worker.bus.publisher import BusPublisher
from worker.bus.queue_depth import QueueDepthGauge
from worker.bus.server_requirements import version_problem
from worker.control import BindingCancelHook, ControlPlane
from worker.delegation.handler import DelegationIntake
from worker.delegation.operation import DelegatedOperation
from worker.delegation.stores import JetStreamLifecycleStores
from worker.dependencies import METRICS_PORT_SETTINGS, check_port_free, no_jetstream
from worker.endpoints import api_key_files, resolve_endpoints
from worker.escalation.gauge import EndpointEscalations, OpenEscalationsGauge
from worker.escalation.output import EscalationOutput
from worker.execution.context import Execution
from worker.execution.leases import LeaseKeeper
from worker.execution.renewal_backstop import RenewalBackstop
from worker.health import (
    CallbackProbe,
    HealthServer,
    hermes_models_check,
    redis_ping_check,
    start_health_server,
)
from worker.hermes.http_client import HermesClient
from worker.logs import RepeatedErrors
from worker.metrics import Metrics
from worker.operations.base import Registry
from worker.pipeline.exhausted import ExhaustionOutput
from worker.pipeline.pipeline import Pipeline
from worker.pipeline.runtime import EndpointRuntime, Gate, Runtime
from worker.pipeline.steps import ActionIntake
from worker.scrape_refresh import before_every_scrape
from worker.serving import ServingGate, settings_blockers
from worker.settings import Settings
from worker.store.health import StoreHealth
from worker.store.stores import Stores
from worker.tasks import stop_tasks
from worker.trust.responses import signer_from_settings, worker_trust
from worker.trust.signing import TrustedGatewayKeys

log = logging.getLogger(__name__)

#: How long shutdown waits for the worker's background tasks to end once cancelled.
_TASK_STOP_TIMEOUT_S = 10.0


class Worker:
    """One worker process serving every configured endpoint."""

    def __init__(
        self,
        settings: Settings,
        *,
        gate: Gate,
        registry: Registry,
        binding_cancel: BindingCancelHook | None = None,
        delegation: DelegatedOperation | None = None,
        settle_gc: bool = False,
    ) -> None:
        self.settings = settings
        #: Tune the process's garbage collector once wired (worker/gc_policy.py): only the
        #: worker process itself asks, never a test process that embeds a worker.
        self.settle_gc = settle_gc
        #: The delegated entry; None serves no delegations subject at all.
        self.delegation = delegation
        self.gate = gate
        self.registry = registry
        self.binding_cancel = binding_cancel
        self.subjects = Subjects(settings.subject_prefix)
        self.nc: NATS | None = None
        #: Built at start-up over the one Redis client (worker/store/stores.py).
        self.stores: Stores | None = None
        self.rt: Runtime | None = None
        self.loops: list[PullLoop] = []
        self.control: ControlPlane | None = None
        self.slots = Slots(settings.concurrency)
        self.delegation_slots = Slots(settings.concurrency)
        #: Every pull loop's fetched deliveries not yet under the lease heartbeat (one CPU).
        self.admitting = Slots(MAX_ADMITTING)
        #: The work subject of each consumer kind, from the subject grammar.
        self._work_subject = {
            "actions": self.subjects.actions,
            "delegations": self.subjects.delegations,
            "egress": self.subjects.egress,
        }
        self.metrics = Metrics(worker_id=settings.worker_id)
        #: Repeated failures are logged once per cause per interval, and counted.
        self.errors = RepeatedErrors(on_count=self.metrics.error)
        self.store_health: StoreHealth | None = None
        self.fetch_gate: FetchGate | None = None
        self.health: HealthServer | None = None
        self.escalations_open: OpenEscalationsGauge | None = None
        self.queue_depth: QueueDepthGauge | None = None
        #: Renews the held leases from a thread while the heartbeat is behind.
        self.backstop: RenewalBackstop | None = None
        #: Whose signed escalations the gauge counts (`trusted_workers`).
        self._trusted_workers: TrustedGatewayKeys | None = None
        #: What keeps this worker from serving each endpoint (worker/serving.py).
        self.serving: ServingGate | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        #: Channel ingress followers (worker/channel/ingress.py); their leases are given
        #: back on shutdown.
        self.followers: list[Any] = []

    async def start(self) -> None:
        settings = self.settings
        check_port_free(
            settings.metrics_host, settings.metrics_port, settings=METRICS_PORT_SETTINGS
        )
        endpoints = resolve_endpoints(settings)
        if not endpoints:
            raise ValueError("no Hermes endpoint is configured (AIPD_HERMES_ENDPOINTS)")
        # Before any connection: a key that cannot be read refuses the start.
        signer = signer_from_settings(
            settings.worker_signing_key_file, allow_unsigned=settings.allow_unsigned_responses
        )
        # What workers publish to workers (channel deliveries, ingress messages) is believed
        # only when a trusted worker key signed it: this worker's own, plus the file's.
        worker_keys = worker_trust(signer, settings.trusted_worker_keys_file)
        self._trusted_workers = worker_keys
        for file, count in self.gate.expired_entries.items():
            self.metrics.trust_entries_expired(file, count)
        if settings.hermes_api_key:
            log.warning(
                "AIPD_HERMES_API_KEY holds a key value in the environment; "
                "prefer AIPD_HERMES_API_KEY_FILE (an owner-only file)"
            )
        redis = open_redis_for(settings)
        health = self.store_health = StoreHealth(
            redis,
            check_interval_s=settings.redis_check_interval_ms / 1000,
            reserve_bytes=settings.redis_memory_reserve_mb * 1024 * 1024,
            errors=self.errors,
            metrics=self.metrics,
            url=settings.redis_url,
        )
        stores = self.stores = Stores.over(
            redis,
            result_ttl_ms=settings.result_ttl_ms,
            idempotency_ttl_ms=settings.effective_idempotency_ttl_ms,
            health=health,
        )
        where = _redis_location(settings.redis_url)
        if not await health.wait_ready(settings.redis_startup_wait_s, what=where):
            log.error(
                "redis at %s did not answer within %.0f s (%s); exiting without fetching",
                where, settings.redis_startup_wait_s, health.reason,
            )
            raise ConnectionError(f"redis at {where} did not answer ({health.reason})")
        self.nc = await connect_nats(settings, errors=self.errors)
        problem = version_problem(self.nc.connected_server_version)
        if problem is not None:
            # A warning, not a refusal: `provision` refuses (worker/bus/server_requirements.py).
            log.warning("%s; serving anyway", problem)
        js = self.nc.jetstream()
        await _require_jetstream(js, settings.nats_url)
        if settings.auto_provision:
            await provision(js, self.subjects, [e.id for e in endpoints], stream_policy(settings))
        publisher = BusPublisher(
            js, self.subjects, signer=signer, acks=AckedPublisher(self.nc), nc=self.nc
        )
        audit = AuditLog(publisher, settings.worker_id)
        publisher.before_result = audit.seal  # a result's receipts are on the bus before it
        keeper: LeaseKeeper[Execution] = LeaseKeeper(
            stores.leases, audit, lease_ttl_ms=settings.lease_ttl_ms, metrics=self.metrics,
            health=health, errors=self.errors,
        )
        # The pull loops fetch only while the store takes new leases and the heartbeat
        # keeps up with the leases already held.
        self.fetch_gate = AllGates(health, keeper.pressure)
        self.rt = Runtime(
            settings=settings,
            subjects=self.subjects,
            js=js,
            stores=stores,
            publisher=publisher,
            dead_letters=DeadLetters(
                publisher,
                self.metrics,
                worker_id=settings.worker_id,
                keep_bytes=settings.dlq_keep_bytes,
                rate_per_s=settings.dlq_rate_per_s,
                burst=settings.dlq_burst,
            ),
            audit=audit,
            keeper=keeper,
            registry=self.registry,
            endpoints={
                e.id: EndpointRuntime(e, HermesClient(
                    e,
                    transport=settings.hermes_http_transport,
                    metrics=self.metrics,
                    on_exchange=provider_receipt,
                ))
                for e in endpoints
            },
            gate=self.gate,
            worker_id=settings.worker_id,
            metrics=self.metrics,
            errors=self.errors,
        )
        self.rt.outputs.append(
            EscalationOutput(
                publisher,
                self.metrics,
                approval_ttl_ms=settings.hermes_operator_timeout_ms,
                risk_of=self._capability_risk,
            )
        )
        self.rt.outputs.append(
            ExhaustionOutput(publisher, audit, self.metrics, keep_bytes=settings.dlq_keep_bytes)
        )
        self.serving = ServingGate(
            settings_blockers(settings),
            {eid: ep.hermes for eid, ep in self.rt.endpoints.items()},
            interval_s=settings.serving_probe_interval_s,
            serve_anyway=settings.serve_when_unready,
            errors=self.errors,
            key_files=api_key_files(settings),
        )
        self.serving.log_static()
        self._warn_without_authority()
        # Probed before any consumer starts: a healthy worker binds at once, one whose key
        # Hermes refuses never takes a first Action.
        await self.serving.probe_all()
        actions = Pipeline(self.rt, ActionIntake(self.rt))
        rt = self.rt
        # Before the first pull loop: its "bound to consumer" line tells a supervisor the
        # worker is up, and a scrape right after it must find the metrics port open. With
        # no loop bound yet, /readyz answers not ready (consumers_bound is empty).
        self.escalations_open = self._open_escalations(js, endpoints)
        self.queue_depth = QueueDepthGauge(
            js,
            self.subjects,
            [
                (endpoint.id, kind)
                for kind in (("actions", "delegations") if self.delegation else ("actions",))
                for endpoint in endpoints
            ],
            self.metrics,
            self.errors,
            min_interval_s=settings.queue_depth_refresh_ms / 1000,
        )
        probe = CallbackProbe(
            nats=lambda: bool(self.nc is not None and self.nc.is_connected),
            consumers=lambda: {pull.durable: pull.bound for pull in self.loops},
            redis=redis_ping_check(stores.client),
            hermes={eid: hermes_models_check(ep.hermes) for eid, ep in rt.endpoints.items()},
            serving=self._serving_reasons,
            publishing=rt.publisher.health.reason,
        )
        self.health = await start_health_server(
            probe,
            self.metrics,
            host=settings.metrics_host,
            port=settings.metrics_port,
            before_scrape=before_every_scrape([self.escalations_open, self.queue_depth]),
        )
        if self.settle_gc:
            # Wired, and nothing consumed yet. Before the first pull loop on purpose: its
            # "bound to consumer" line is what readiness waits for, and the collection
            # (tens of ms, more on a busy machine) between an egress loop's line and the
            # control plane's subscriptions left a demo's manifest request unanswered.
            gc_policy.settle_startup()
        if settings.channel_egress_file is not None:
            await self._start_egress(js, endpoints, worker_keys)
        if settings.channel_ingress_file is not None:
            await self._start_ingress(js, endpoints, publisher, worker_keys)
        self.control = ControlPlane(
            self.nc, self.rt, binding_cancel=self.binding_cancel, status=self.live_status
        )
        await self.control.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(keeper.run()))
        # Its own Redis client, opened on its thread: the main loop's client and its
        # multiplexed connection belong to the main loop.
        self.backstop = RenewalBackstop(
            keeper, lambda: open_redis_for(settings), metrics=self.metrics
        )
        self.backstop.start()
        self._tasks.append(loop.create_task(health.run()))
        self._tasks.append(loop.create_task(self.serving.run()))
        for endpoint in endpoints:
            self._pull(js, "actions", endpoint.id, self.slots, actions)
        if self.delegation is not None:
            lifecycle = JetStreamLifecycleStores(js, self.subjects, self.gate.gateway_keys)
            delegations = Pipeline(
                self.rt, DelegationIntake(self.rt, self.delegation.with_stores(lifecycle))
            )
            for endpoint in endpoints:
                # Their own slots: a delegation waits for its child, which may be an Action
                # this very pool must execute; shared slots could starve it.
                self._pull(js, "delegations", endpoint.id, self.delegation_slots, delegations)
        log.info(
            "worker %s serving %s (concurrency %d, lease ttl %d ms)",
            settings.worker_id,
            ", ".join(e.id for e in endpoints),
            settings.concurrency,
            settings.lease_ttl_ms,
        )

    async def _start_egress(
        self, js: Any, endpoints: Any, worker_keys: TrustedGatewayKeys | None
    ) -> None:
        """Channel egress: refuse rules naming unknown endpoints or sessions or crossing a
        tenant binding, then consume the egress queue of every served endpoint a rule
        delivers to (docs/channels.md)."""
        from worker.channel.egress import EgressIntake, check_sessions
        from worker.channel.output import ChannelOutput
        from worker.channel.rules import load_egress_rules

        assert self.rt is not None
        assert self.settings.channel_egress_file is not None
        table = load_egress_rules(
            self.settings.channel_egress_file,
            [e.id for e in endpoints],
            {e.id: e.descriptor.tenant_id for e in endpoints},
            frozenset(e.id for e in endpoints if e.descriptor.shared),
        )
        await check_sessions(table, self.rt.endpoints)
        self.rt.outputs.append(ChannelOutput(self.rt.publisher, table))
        intake = EgressIntake(
            self.rt,
            table,
            trusted=worker_keys,
            approval_ttl_ms=self.settings.hermes_operator_timeout_ms,
        )
        egress = Pipeline(self.rt, intake)
        for endpoint_id in sorted({endpoint_id for endpoint_id, _ in table.targets()}):
            self._pull(js, "egress", endpoint_id, self.slots, egress)

    async def _start_ingress(
        self,
        js: Any,
        endpoints: Any,
        publisher: BusPublisher,
        worker_keys: TrustedGatewayKeys | None,
    ) -> None:
        """Channel ingress: a follower per configured session (docs/channels.md)."""
        from worker.channel.ingress import start_followers
        from worker.channel.rules import load_ingress_rules

        assert self.rt is not None
        assert self.settings.channel_ingress_file is not None
        targets = load_ingress_rules(
            self.settings.channel_ingress_file, [e.id for e in endpoints]
        )
        self.followers = await start_followers(
            targets,
            self.rt.endpoints,
            store=self.rt.stores.ingress,
            js=js,
            subjects=self.subjects,
            publisher=publisher,
            metrics=self.metrics,
            worker_id=self.settings.worker_id,
            lease_ttl_ms=self.settings.lease_ttl_ms,
            trusted=worker_keys,
            dead_letters=self.rt.dead_letters,  # refusals share the DLQ's rate and cut
        )
        loop = asyncio.get_running_loop()
        self._tasks.extend(loop.create_task(follower.run()) for follower in self.followers)

    def _capability_risk(self, capability: str) -> str | None:
        """The registered risk of a capability id (None: not an operation served here)."""
        operation = self.registry.get(capability.rsplit(":", 1)[-1])
        return operation.spec.risk.value if operation is not None else None

    def _open_escalations(self, js: Any, endpoints: Any) -> OpenEscalationsGauge:
        """The `escalations_open` gauge of the served endpoints, counted from the stores."""
        assert self.stores is not None
        client = self.stores.client
        return OpenEscalationsGauge(
            [
                EndpointEscalations(js, client, self.subjects, e.id, trusted=self._trusted_workers)
                for e in endpoints
            ],
            self.metrics,
            self.errors,
            min_interval_s=self.settings.escalations_open_refresh_ms / 1000,
        )

    def _pull(
        self,
        js: Any,
        kind: str,
        endpoint_id: str,
        slots: Slots,
        handler: Pipeline,
    ) -> None:
        """Start the pull loop of one endpoint's durable consumer of `kind`."""
        pull = PullLoop(
            js,
            stream=self.subjects.stream_name(kind),
            durable=self.subjects.durable(endpoint_id, kind),
            subject=self._work_subject[kind](endpoint_id),
            slots=slots,
            handle=_bound(handler, endpoint_id),
            gate=self.fetch_gate,
            errors=self.errors,
            endpoint_id=endpoint_id,
            serving=self.serving,
            window=self.admitting,
        )
        self.loops.append(pull)
        self._tasks.append(asyncio.get_running_loop().create_task(pull.run()))

    def _serving_reasons(self) -> tuple[bool, list[str]]:
        gate = self.serving
        if gate is None:
            return False, ["not started"]
        return all(gate.servable(eid) for eid in gate.clients), gate.reasons()

    def _warn_without_authority(self) -> None:
        """Governed capabilities without an approval authority are refused one by one
        (connector_host.approval_authorization_unavailable): said once, at start."""
        if self.settings.approval_authority_file is not None:
            return
        governed = sorted(
            name for name, op in self.registry.operations.items() if op.spec.approval_required
        )
        if governed:
            log.warning(
                "AIPD_APPROVAL_AUTHORITY_FILE is not set: the governed capabilities (%s) "
                "will be refused until an approval authority is configured",
                ", ".join(governed),
            )

    def live_status(self) -> dict[str, object]:
        """What this worker tells `$SRV.STATS` about itself (cheap, never waits): its slots,
        the leases it holds, whether it is ready and serving, and why not."""
        serving, reasons = self._serving_reasons()
        rt = self.rt
        return {
            "slots": self.slots.capacity,
            "slots_in_use": self.slots.in_use,
            "delegation_slots_in_use": self.delegation_slots.in_use,
            "leases": 0 if rt is None else len(rt.keeper.executions),
            "ready": self.ready,
            "serving": serving,
            "reasons": reasons[:8],
            "publishing": None if rt is None else rt.publisher.health.reason(),
            "draining": self._stopped.is_set(),
        }

    async def _wait_idle(self, timeout_s: float) -> bool:
        """Until no Action and no delegation executes, or `timeout_s`; True when idle."""
        idle = await asyncio.gather(
            self.slots.wait_idle(timeout_s), self.delegation_slots.wait_idle(timeout_s)
        )
        return all(idle)

    @property
    def ready(self) -> bool:
        return bool(
            self.nc
            and self.nc.is_connected
            and self.loops
            and all(loop.bound for loop in self.loops)
        )

    async def shutdown(self) -> None:
        """Stop fetching, let in-flight work finish within the grace period (heartbeating),
        then release the leases of unfinished work without settling it."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for pull in self.loops:
            pull.stop()
        for task in self._tasks[1:]:
            task.cancel()
        self._say_what_drain_waits_for()
        finished = await self._wait_idle(self.settings.shutdown_grace_s)
        if not finished and self.rt is not None:
            running = list(self.rt.keeper.executions.values())
            log.warning(
                "drain: %d run(s) still going after AIPD_SHUTDOWN_GRACE_S=%.0f s (%s): "
                "cancelling them and releasing their leases unsettled (another worker takes "
                "them over)",
                len(running), self.settings.shutdown_grace_s, _runs(running),
            )
            self.rt.shutting_down = True
            for execution in list(self.rt.keeper.executions.values()):
                if execution.task is not None:
                    execution.task.cancel("shutdown")
            await self._wait_idle(10.0)
        await stop_tasks(self._tasks, _TASK_STOP_TIMEOUT_S)
        if self.backstop is not None:
            await self.backstop.stop()
        for follower in self.followers:
            await follower.release()
        if self.health is not None:
            await self.health.stop()
        if self.escalations_open is not None:
            await self.escalations_open.stop()
        if self.queue_depth is not None:
            await self.queue_depth.stop()
        if self.control is not None:
            await self.control.stop()
        if self.rt is not None:
            await self.rt.audit.drain()
            for ep in self.rt.endpoints.values():
                await ep.hermes.aclose()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        if self.stores is not None:
            with contextlib.suppress(Exception):
                await self.stores.client.aclose()
        log.info("worker %s stopped", self.settings.worker_id)

    def _say_what_drain_waits_for(self) -> None:
        """One line at the start of a drain: how many runs, which, and until when."""
        running = [] if self.rt is None else list(self.rt.keeper.executions.values())
        if not running:
            log.info("drain: no run in progress; stopping")
            return
        log.info(
            "drain: fetching stopped; waiting up to %.0f s (AIPD_SHUTDOWN_GRACE_S) for %d "
            "run(s) to finish: %s",
            self.settings.shutdown_grace_s, len(running), _runs(running),
        )

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal received: draining")
        await self.shutdown()


async def _require_jetstream(js: Any, url: str) -> None:
    """Stop the start-up when NATS answers without JetStream: nothing here works without
    it, and the pull loops would otherwise bind and fail in a loop."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import ServiceUnavailableError

    try:
        await js.account_info()
    except (NoRespondersError, ServiceUnavailableError, NatsTimeout, TimeoutError):
        raise no_jetstream(url) from None


def _runs(executions: list[Any], shown: int = 10) -> str:
    """`act_… (capability)` of each run (the capability names the endpoint), the first
    `shown` of them."""
    named = [f"{e.action.id} ({e.action.capability})" for e in executions[:shown]]
    more = len(executions) - shown
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def _redis_location(url: str) -> str:
    """host:port (or the socket path) of a Redis URL: never its user or password."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


def _bound(handler: Pipeline, endpoint_id: str) -> Any:
    async def handle(msg: Any) -> None:
        await handler.handle(msg, endpoint_id)

    return handle
