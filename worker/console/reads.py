"""What the console shows, read when a page asks: the bus's streams and Redis, never a copy.

Each read goes through the reader that already owns it: results and receipt chains through
`AipClient` (verified against the trusted worker keys), leases through `LeaseStore`,
escalations through `worker/escalation/ledger.py` with their resolutions from Redis, what an
approval waits on through the operator binding (`pending_from_binding`), DLQ entries through
`dlq_admin.read_entries`, workers through their own `$SRV.STATS` answers
(worker/control.py). The only read of its own is the list of which Actions exist: the audit
stream's subjects (`aip.hermes.{endpoint}.audit.{action_id}`), one `STREAM.INFO` with a
subjects filter, since every Action a worker took leaves a `received` receipt there.

Tenancy is decided here, once per record (`Viewer.sees`): a run's tenant is what its lease
recorded at acquisition, else its verified `admitted` receipt; an escalation's is its own
field; a DLQ entry was never authenticated, so only an all-tenants token sees the DLQ.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from schemas.audit import Receipt, ReceiptEvent
from schemas.ids import is_action_id, is_endpoint_id
from schemas.result import ActionResult
from subjects.grammar import Subjects
from worker.bus.stream_reads import next_stored
from worker.client import AipClient, AuditChain
from worker.commands.dlq_admin import Entry, read_entries
from worker.commands.escalation_admin import pending_from_binding
from worker.console.tokens import Viewer
from worker.control import gather_replies
from worker.errors import UnverifiedResponse
from worker.escalation.ledger import EscalationView, Unreadable, read_escalations, read_resolutions
from worker.store.clock import now_ms
from worker.store.lease_store import LeaseStore
from worker.trust.responses import read_receipt
from worker.trust.signing import TrustedGatewayKeys

T = TypeVar("T")

#: Reads of one page in flight at once (each is one request to NATS or Redis).
CONCURRENT_READS = 32
#: States of a run without a result: a worker holds a live lease, or nobody does (queued,
#: between owners, or refused before a lease).
RUNNING = "running"
WAITING = "waiting"

#: How long the workers page collects `$SRV.STATS` answers.
WORKERS_WAIT_S = 0.5



@dataclass(frozen=True, slots=True)
class RunFilter:
    """The runs page's filters (None / empty: any)."""

    endpoint_id: str | None = None
    state: str | None = None
    principal_id: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """One Action as the console lists it."""

    endpoint_id: str
    action_id: str
    capability: str
    state: str
    owner: str | None
    fence: int | None
    principal_id: str | None
    tenant_id: str | None
    received_at_ms: int | None
    settled_at_ms: int | None


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: Run
    result: ActionResult | None
    chain: AuditChain
    lease: dict[str, str]


@dataclass(frozen=True, slots=True)
class Waiting:
    """An open escalation and what its run waits on (from the binding, for an approval)."""

    view: EscalationView
    pending: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Worker:
    """One worker as it answered `$SRV.STATS` (worker/control.py)."""

    worker_id: str
    version: str
    started: str
    endpoints: list[str]
    #: Cancel and manifest requests it answered.
    requests: int
    #: Its live status (`App.live_status`): slots, leases, readiness.
    status: dict[str, Any]


class _Endpoint(msgspec.Struct):
    name: str
    num_requests: int = 0
    data: dict[str, Any] | None = None


class _ServiceStats(msgspec.Struct):
    name: str
    id: str
    version: str = ""
    started: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    endpoints: list[_Endpoint] = msgspec.field(default_factory=list)


@dataclass(slots=True)
class Escalations:
    waiting: list[Waiting] = field(default_factory=list)
    #: Messages on the escalation subjects believed by no one (forged, unsigned, malformed).
    ignored: int = 0


async def bounded(calls: Iterable[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run `calls` at most `CONCURRENT_READS` at a time; results in order."""
    gate = asyncio.Semaphore(CONCURRENT_READS)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


class ConsoleReader:
    """Every read behind the console's pages, over one NATS connection and one Redis client."""

    def __init__(
        self,
        nc: NATS,
        redis: Any,
        subjects: Subjects,
        trusted: TrustedGatewayKeys | None,
        *,
        max_runs: int = 500,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.redis = redis
        self.subjects = subjects
        self.trusted = trusted
        self.client = AipClient(nc, prefix=subjects.prefix, trusted_worker_keys=trusted)
        self.leases = LeaseStore(redis, call_budget_s=2.0)
        self.max_runs = max_runs

    # -- which Actions and endpoints exist ------------------------------------------------

    async def _subjects(self, kind: str, pattern: str) -> list[str]:
        """The subjects stream `kind` stores messages on that match `pattern`."""
        try:
            info = await self.js.stream_info(
                self.subjects.stream_name(kind), subjects_filter=pattern
            )
        except NotFoundError:
            return []
        return sorted((info.state.subjects or {}).keys())

    def _endpoint_base(self) -> str:
        return f"{self.subjects.prefix}.hermes."

    async def _actions(self, endpoint_id: str | None) -> list[tuple[str, str]]:
        """`(endpoint, action id)` of every Action with a receipt on the audit stream."""
        pattern = f"{self._endpoint_base()}{endpoint_id or '*'}.audit.*"
        found = []
        for subject in await self._subjects("audit", pattern):
            endpoint, kind, action_id = subject.removeprefix(self._endpoint_base()).split(".")
            if kind == "audit" and is_action_id(action_id):
                found.append((endpoint, action_id))
        return found

    async def endpoints(self, kind: str) -> list[str]:
        """The endpoints with anything on stream `kind` (escalations, dlq)."""
        pattern = f"{self._endpoint_base()}*.{kind}"
        base = self._endpoint_base()
        return [s.removeprefix(base).split(".")[0] for s in await self._subjects(kind, pattern)]

    # -- runs -----------------------------------------------------------------------------

    async def _first_receipt(self, endpoint_id: str, action_id: str) -> Receipt | None:
        msg = await next_stored(
            self.js,
            self.subjects.stream_name("audit"),
            self.subjects.audit(endpoint_id, action_id),
            1,
        )
        if msg is None:
            return None
        try:
            return read_receipt(msg.data or b"")[0]
        except UnverifiedResponse:
            return None

    async def _lease(self, action_id: str) -> dict[str, str]:
        return await self.leases.lease_view(await self.leases.keys_of(action_id))

    async def _run(
        self,
        endpoint_id: str,
        action_id: str,
        first: Receipt | None,
        chain: AuditChain | None = None,
    ) -> tuple[Run, ActionResult | None, dict[str, str], AuditChain | None]:
        lease, result = await asyncio.gather(
            self._lease(action_id), self._result(endpoint_id, action_id)
        )
        principal, tenant = lease.get("principal") or None, lease.get("tenant") or None
        if principal is None:
            # No worker leased it (refused, or not yet): who it ran for is in the verified
            # `admitted` receipt, if any.
            chain = chain or await self.client.audit_chain(endpoint_id, action_id)
            for entry in chain.entries:
                if entry.receipt.event is ReceiptEvent.ADMITTED:
                    details = entry.receipt.details
                    principal = _text(details.get("principal_id"))
                    tenant = _text(details.get("tenant_id"))
        capability = lease.get("capability") or (
            _text(first.details.get("capability")) if first is not None else None
        )
        run = Run(
            endpoint_id=endpoint_id,
            action_id=action_id,
            capability=capability or (result.capability if result else "?"),
            state=_state(result, lease),
            owner=lease.get("owner") or None,
            fence=int(lease["fence"]) if lease.get("fence", "").isdigit() else None,
            principal_id=principal,
            tenant_id=tenant,
            received_at_ms=first.ts_unix_ms if first is not None else None,
            settled_at_ms=result.settled_at_unix_ms if result is not None else None,
        )
        return run, result, lease, chain

    async def _result(self, endpoint_id: str, action_id: str) -> ActionResult | None:
        try:
            return await self.client.stored_result(endpoint_id, action_id)
        except (UnverifiedResponse, TimeoutError, msgspec.DecodeError):
            return None  # nothing a trusted worker signed: no result to show

    async def runs(self, viewer: Viewer, wanted: RunFilter) -> list[Run]:
        """The newest runs `viewer` may see that match `wanted`, at most `max_runs`."""
        if wanted.endpoint_id is not None and not is_endpoint_id(wanted.endpoint_id):
            return []  # never a subject wildcard from a URL
        actions = await self._actions(wanted.endpoint_id)
        firsts = await bounded(functools.partial(self._first_receipt, e, a) for e, a in actions)
        dated = [
            (first.ts_unix_ms if first else 0, endpoint, action_id, first)
            for (endpoint, action_id), first in zip(actions, firsts, strict=True)
            if _within(first.ts_unix_ms if first else None, wanted)
        ]
        dated.sort(key=lambda item: item[0], reverse=True)
        shown: list[Run] = []
        batch = CONCURRENT_READS
        for start in range(0, len(dated), batch):
            part = dated[start : start + batch]
            read = await bounded(functools.partial(self._run, e, a, f) for _, e, a, f in part)
            for run, _, _, _ in read:
                if viewer.sees(run.tenant_id) and _matches(run, wanted):
                    shown.append(run)
                    if len(shown) >= self.max_runs:
                        return shown
        return shown

    async def run(self, viewer: Viewer, endpoint_id: str, action_id: str) -> RunDetail | None:
        """One run with its result, verified receipt chain and lease; None when it does not
        exist or `viewer` may not see it (the two are not told apart)."""
        if not is_action_id(action_id) or not is_endpoint_id(endpoint_id):
            return None  # never a subject wildcard from a URL
        chain = await self.client.audit_chain(endpoint_id, action_id)
        first = chain.entries[0].receipt if chain.entries else None
        if first is None:
            return None
        run, result, lease, chain_read = await self._run(endpoint_id, action_id, first, chain)
        if not viewer.sees(run.tenant_id):
            return None
        return RunDetail(run=run, result=result, chain=chain_read or chain, lease=lease)

    # -- escalations, DLQ ------------------------------------------------------------------

    async def escalations(self, viewer: Viewer) -> Escalations:
        """Every open escalation `viewer` may see, oldest first, with what its run waits on."""
        out = Escalations()
        views: list[EscalationView] = []
        for endpoint_id in await self.endpoints("escalations"):
            unreadable = Unreadable()
            views += await read_escalations(
                self.js, self.subjects, endpoint_id, unreadable, trusted=self.trusted
            )
            out.ignored += unreadable.total
        resolutions = await read_resolutions(
            self.redis, [v.escalation.escalation_id for v in views]
        )
        for view, resolution in zip(views, resolutions, strict=True):
            view.resolution = resolution
            if not view.open or not viewer.sees(view.escalation.tenant_id):
                continue
            approval = view.escalation.approval
            pending = None if approval is None else await pending_from_binding(self.redis, approval)
            out.waiting.append(Waiting(view, pending))
        out.waiting.sort(key=lambda w: w.view.escalation.raised_at_unix_ms)
        return out

    async def dead_letters(self, viewer: Viewer) -> list[tuple[str, Entry]] | None:
        """`(endpoint, entry)` of every DLQ entry a trusted worker signed, newest first; None
        for a tenant's token (an entry was never authenticated, so it has no tenant)."""
        if viewer.tenant_id is not None:
            return None
        found: list[tuple[str, Entry]] = []
        for endpoint_id in await self.endpoints("dlq"):
            entries = await read_entries(self.js, self.subjects, endpoint_id, self.trusted)
            found += [(endpoint_id, entry) for entry in entries]
        found.sort(key=lambda item: item[1].seq, reverse=True)
        return found

    async def workers(
        self, viewer: Viewer, *, wait_s: float = WORKERS_WAIT_S
    ) -> list[Worker] | None:
        """Every worker that answers `$SRV.STATS` within `wait_s`, by worker id; None for a
        tenant's token (workers serve every tenant: an operator's view)."""
        if viewer.tenant_id is not None:
            return None
        answers = await gather_replies(self.nc, "STATS", wait_s=wait_s)
        found = [w for w in (_worker(data) for data in answers) if w is not None]
        return sorted(found, key=lambda w: w.worker_id)


def _worker(data: bytes) -> Worker | None:
    """One `$SRV.STATS` answer as a row; None when it is not a worker's."""
    try:
        stats = msgspec.json.decode(data, type=_ServiceStats)
    except msgspec.DecodeError:
        return None
    status = next((e.data for e in stats.endpoints if e.data), {})
    endpoints = sorted({e.name.split("-", 1)[1] for e in stats.endpoints if "-" in e.name})
    return Worker(
        worker_id=str(stats.metadata.get("worker_id", stats.id)),
        version=stats.version,
        started=stats.started,
        endpoints=endpoints,
        requests=sum(e.num_requests for e in stats.endpoints),
        status=status,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _state(result: ActionResult | None, lease: dict[str, str]) -> str:
    if result is not None:
        return result.status.value
    expires = lease.get("expires_at_ms", "")
    if lease.get("owner") and expires.isdigit() and int(expires) > now_ms():
        return RUNNING
    return WAITING


def _within(received_ms: int | None, wanted: RunFilter) -> bool:
    if wanted.since_ms is None and wanted.until_ms is None:
        return True
    if received_ms is None:
        return False
    if wanted.since_ms is not None and received_ms < wanted.since_ms:
        return False
    return wanted.until_ms is None or received_ms <= wanted.until_ms


def _matches(run: Run, wanted: RunFilter) -> bool:
    if wanted.state and run.state != wanted.state:
        return False
    return not wanted.principal_id or run.principal_id == wanted.principal_id
