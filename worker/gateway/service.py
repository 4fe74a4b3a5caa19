"""The six AIP tools, independent of the transport that carries them.

Every tool takes the transport-authenticated `Principal` (never an identity from its input)
and returns a JSON document or raises `ConnectorError`, so the MCP layer only maps the two
onto a tool result. A principal sees, reads and cancels only the Actions whose queue entry
it owns in its own tenant partition; anything else is answered exactly like an Action that
does not exist, so ids of others are not even confirmed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec.structs import replace
from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from schemas.action import Action, Mode
from schemas.aip.action import Action as AipAction
from schemas.delegation import DELEGATE_PREFIX, ChildAction
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.ids import is_action_id, new_action_id
from schemas.lifecycle import ChildResult, LifecycleState, QueueRecord
from schemas.result import ActionResult
from worker import faults
from worker.bus.stream_reads import SubjectFollower
from worker.errors import ActionIdTaken, ConnectorError, QueueEntryExists, UnverifiedResponse
from worker.gateway.children import Children, child_result, now_ms
from worker.gateway.chunk_reads import ChunkReader, Link
from worker.gateway.discovery import Discovery
from worker.gateway.facade import (
    action_fields,
    check_arguments,
    events_page,
    extension_fields,
)
from worker.gateway.follow_limits import FollowLimits
from worker.gateway.held_chunks import HeldChunkBudget
from worker.gateway.principals import Principal
from worker.gateway.records import RuntimeStoreReader
from worker.gateway.routes import Route, RouteTable
from worker.gateway.settings import GatewaySettings
from worker.operations.catalog import default_mode
from worker.tasks import stop_tasks
from worker.trust.tenancy import binding_admits
from worker.wire.actions import (
    aip_action_body,
    identity_context,
    internal_fields,
    timestamp_of_ms,
)
from worker.wire.manifests import (
    MANIFEST_VERSION,
    bound_tenant_of,
    endpoint_of,
    extension_of_manifest,
)

log = logging.getLogger(__name__)

#: The most chunks one `aip_action_events` call returns.
MAX_EVENTS_PER_CALL = 1000
#: How long the cancel tool waits for the executor to settle the cancelled child.
CANCEL_WAIT_S = 10.0
#: The most messages one `aip_action_events` call reads from a chunk subject.
MAX_CHUNKS_READ = 20_000
#: `aip_capabilities` entries per page, by default and at most.
CAPABILITIES_PAGE = 20
MAX_CAPABILITIES_PAGE = 1000
#: How long an events read waits for the next chunk before answering with what it has.
EVENTS_IDLE_S = 0.3
#: What `aip_call` may not carry: identity is the credential's, `id` is spelt `action_id`.
FORBIDDEN_FIELDS = ("identity", "id")
#: The AIP mode of each internal mode (a capability's default when `aip_call` names none).
AIP_MODE_OF = {Mode.SYNC: "sync", Mode.ASYNC: "async", Mode.STREAM: "streaming"}
#: How often a read with `wait_ms` polls the record.
WAIT_POLL_S = 0.2
#: How long an `aip_action_events` call with `follow` waits for a new chunk.
FOLLOW_WAIT_S = 10.0
#: Domain separation of the namespaced Action ids (`namespaced_action_id`).
NAMESPACE_LABEL = "aip-hermes-worker/gateway-action-id/v1"


@dataclass(frozen=True, slots=True)
class ChainRead:
    """One read of a child's chunks: its record, the links of its chain in seq order, and
    whether the chain was checked against the child's signed result (`verified`: exactly
    the chunks of the run that settled it, ending with its terminal chunk; none for a
    child of a non-streaming capability)."""

    record: QueueRecord
    links: list[Link]
    verified: bool


def _invalid(message: str) -> ConnectorError:
    return ConnectorError(ErrorCode.SCHEMA_ENVELOPE_INVALID, message)


def not_found(action_id: str) -> ConnectorError:
    return ConnectorError(
        ErrorCode.CONFIGURATION_OR_INPUT, f"no Action {action_id} of this principal"
    )


def namespaced_action_id(principal_id: str, tenant_id: str | None, supplied: str) -> str:
    """The bus id of the Action a principal names `supplied` (docs/gateway.md): `act_` and
    the first 32 hex digits of sha256 over a fixed label, the principal id, its tenant and
    the caller's id, NUL-separated. Two principals (or one principal in two tenants) naming
    the same id get different Actions, so no caller can reach, squat or probe an id
    another uses; the same principal naming it again gets the same child (idempotency)."""
    material = "\0".join((NAMESPACE_LABEL, principal_id, tenant_id or "", supplied))
    return "act_" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


def _collision() -> ConnectorError:
    return ConnectorError(
        ErrorCode.CONFIGURATION_OR_INPUT,
        "idempotency collision: this action_id was first used with a different contract",
    )


def _unrouted(capability: str) -> ConnectorError:
    return ConnectorError(
        ErrorCode.HOST_ROUTE_MISMATCH,
        f"no route serves capability {capability[:200]!r} (AIPD_CAPABILITY_ROUTES)",
    )


def _view(record: QueueRecord) -> dict[str, Any]:
    return {
        "action_id": record.action.id,
        "capability": record.action.capability,
        "state": record.state.value,
        "enqueued_at_unix_ms": record.enqueued_at_unix_ms,
        "updated_at_unix_ms": record.updated_at_unix_ms,
    }


def _matches(
    entry: dict[str, Any], capability_id: str | None, profile: str | None, query: str | None
) -> bool:
    """Whether a manifest's Capability passes the `aip_capabilities` filters."""
    if capability_id is not None and entry.get("id") != capability_id:
        return False
    if profile is not None:
        bindings = entry.get("bindings")
        if not isinstance(bindings, list) or not any(
            isinstance(b, dict) and b.get("profile") == profile for b in bindings
        ):
            return False
    if query is not None:
        text = " ".join(str(entry.get(name) or "") for name in ("id", "name", "description"))
        return query in text.lower()
    return True


def _serves_tenant(manifest: dict[str, Any], tenant_id: str | None, now: int) -> bool:
    """Whether the AIP manifest's endpoint admits an Action of `tenant_id` now, as the
    worker's tenancy check decides it: the bound tenant from
    `compatibility.tenant_bound_endpoints`, its expiry and `shared` from our extension. A
    malformed binding hides the endpoint (fail closed)."""
    ours = extension_of_manifest(manifest)
    compatibility = manifest.get("compatibility")
    bound_list = (
        compatibility.get("tenant_bound_endpoints") if isinstance(compatibility, dict) else None
    )
    if bound_list is not None and not isinstance(bound_list, list):
        return False
    bound = bound_tenant_of(manifest)
    if bound_list and bound is None:
        return False
    expires = ours.get("tenant_expires_at_unix_ms")
    if expires is not None and (not isinstance(expires, int) or isinstance(expires, bool)):
        return False
    shared = ours.get("shared", False)
    if not isinstance(shared, bool):
        return False
    return binding_admits(bound, expires, tenant_id, now, shared=shared)


class GatewayService:
    def __init__(
        self,
        settings: GatewaySettings,
        nc: NATS,
        routes: RouteTable,
        reader: RuntimeStoreReader,
        children: Children,
        discovery: Discovery,
    ) -> None:
        self.settings = settings
        self.nc = nc
        self.routes = routes
        self.reader = reader
        self.children = children
        self.discovery = discovery
        self._following: set[asyncio.Task[None]] = set()
        self.follows = FollowLimits(settings.gateway_max_follows_per_principal)
        #: What the chunk followers of every binding of this process hold, together.
        self.held_chunks = HeldChunkBudget(settings.gateway_max_held_chunk_bytes)

    # --- aip_capabilities ---------------------------------------------------------------

    async def capabilities(
        self,
        principal: Principal,
        *,
        cursor: int = 0,
        limit: int = CAPABILITIES_PAGE,
        capability_id: str | None = None,
        profile: str | None = None,
        query: str | None = None,
        include_schemas: bool = False,
        include_contracts: bool = False,
        include_bindings: bool = True,
    ) -> dict[str, Any]:
        """The reference `aip_capabilities` page of what the bus serves to this principal's
        tenant, the route table admits and the principal's allowlists let it call, from the
        workers' manifests: at most `limit` AIP Capabilities from `cursor` (an index into
        the list ordered by endpoint and id; `next_cursor` is null on the last page),
        filtered by exact `capability_id`, binding `profile` and `query` (case-insensitive
        text of the id, name or description). Schemas and contracts are left out unless
        asked for: with them four endpoints were 112 KB, which a real Hermes cut to 1.9 KB
        before the model saw it (issue 27)."""
        if cursor < 0 or not 1 <= limit <= MAX_CAPABILITIES_PAGE:
            raise _invalid(f"cursor must be >= 0 and limit 1..{MAX_CAPABILITIES_PAGE}")
        wanted = query.lower() if query else None
        listed: list[tuple[str, str, dict[str, Any]]] = []
        profiles: set[str] = set()
        now = now_ms()
        for manifest in await self.discovery.manifests():
            if not _serves_tenant(manifest, principal.tenant_id, now):
                continue
            served = False
            for entry in manifest.get("capabilities", []):
                capability = entry.get("id") if isinstance(entry, dict) else None
                if not isinstance(capability, str):
                    continue
                route = self.routes.resolve(capability)
                if route is None or not principal.may_call(capability, route.endpoint_id):
                    continue
                served = True
                if not _matches(entry, capability_id, profile, wanted):
                    continue
                shown = dict(entry)
                for name, included in (
                    ("input_schema", include_schemas),
                    ("output_schema", include_schemas),
                    ("contract", include_contracts),
                    ("bindings", include_bindings),
                ):
                    if not included:
                        shown.pop(name, None)
                listed.append((str(endpoint_of(entry)), capability, shown))
            if served:
                profiles.update(p for p in manifest.get("profiles") or [] if isinstance(p, str))
        listed.sort(key=lambda item: (item[0], item[1]))
        page = [shown for _, _, shown in listed[cursor : cursor + limit]]
        following = cursor + len(page)
        return {
            "manifest_version": MANIFEST_VERSION,
            "agent": {"id": f"service:{self.settings.aip_service}", "kind": "service"},
            "profiles": sorted(profiles),
            "total": len(listed),
            "capabilities": page,
            "next_cursor": str(following) if following < len(listed) else None,
        }

    # --- aip_call -----------------------------------------------------------------------

    def decode_contract(
        self, principal: Principal, arguments: dict[str, Any]
    ) -> tuple[ChildAction, str]:
        """The child Action of reference-shaped `aip_call` arguments (worker/gateway/facade.py)
        and the caller's id of it: strict, bounded, identity from the credential. The bus id
        is the caller's id namespaced to the principal (`namespaced_action_id`), except for
        a delegated child, which keeps its protocol-assigned id."""
        size = len(json.dumps(arguments, separators=(",", ":"), ensure_ascii=False).encode())
        if size > self.settings.gateway_max_input_bytes:
            raise _invalid(
                f"the contract is {size} bytes, over {self.settings.gateway_max_input_bytes}"
            )
        context = arguments.get("context") if isinstance(arguments, dict) else None
        for name in FORBIDDEN_FIELDS:
            if isinstance(arguments, dict) and (
                name in arguments or (isinstance(context, dict) and name in context)
            ):
                why = "comes from the credential" if name == "identity" else "is spelt action_id"
                raise _invalid(f"field {name!r} is not accepted: it {why}")
        fields = action_fields(check_arguments("aip_call", arguments))
        extension = extension_fields(arguments)
        supplied = fields.pop("action_id", None)
        caller_id = supplied if isinstance(supplied, str) else new_action_id()
        if supplied is not None and extension.get("delegation") is not None:
            # A delegated child keeps its protocol-assigned id: the delegation resolver reads
            # the runtime's stores under exactly that id. Its `delegation` never reaches the
            # executor (Children.envelope), and the id is refused when anything else holds it.
            # Only a delegate (a Hermes operator principal, the one a DelegationRequest names)
            # makes one: any other principal naming a delegation could burn the child's id
            # before the delegate's run calls it (the resolver would then refuse the entry).
            if not principal.principal_id.startswith(DELEGATE_PREFIX):
                raise _invalid(
                    "`delegation` is accepted only from a delegate principal "
                    f"({DELEGATE_PREFIX}{{endpoint}}): it marks the child of a signed "
                    "DelegationRequest"
                )
            action_id = caller_id
        else:
            action_id = namespaced_action_id(principal.principal_id, principal.tenant_id, caller_id)
        if "mode" not in fields:
            # As AipClient.build_action: a streaming twin (`chat_stream`) takes only `stream`.
            internal_mode = default_mode(fields["capability_id"].rsplit(":", 1)[-1])
            fields["mode"] = AIP_MODE_OF[internal_mode]
        identity = principal.identity()
        body = {"id": action_id, "input": {}, **fields, "identity": identity_context(identity)}
        try:
            # The one mapping of an AIP Action onto ours (worker/wire/actions.py), as a worker
            # decodes an Action Envelope: the same child whichever binding carried it.
            typed = msgspec.convert(body, AipAction, strict=True)
            document = internal_fields(
                typed,
                extension=extension,
                sent_at=timestamp_of_ms(now_ms()),
                correlation_id=None,
            )
            document["identity"] = msgspec.to_builtins(identity)
            child = msgspec.convert(document, ChildAction)
            # Every route takes the child as an AIP Action Envelope, and the queue record
            # keeps it as an AIP Action: its typed objects (conversation, callback, ...)
            # must be AIP's.
            aip_action_body(child)
        except msgspec.ValidationError as exc:
            raise _invalid(f"invalid Action contract: {exc}") from None
        except EnvelopeRejected as exc:
            raise _invalid(f"invalid Action contract: {exc.reason}") from None
        return child, caller_id

    async def call(self, principal: Principal, arguments: dict[str, Any]) -> dict[str, Any]:
        """Enqueue, dispatch and (sync) wait for one child Action; a sync call counts
        against the principal's follow cap from before anything is enqueued."""
        child, caller_id = self.decode_contract(principal, arguments)
        supplied_created = "created_at_unix_ms" in extension_fields(arguments)
        if child.mode is Mode.SYNC:
            with self.follows.hold(principal):
                view = await self._call(principal, child, supplied_created)
        else:
            view = await self._call(principal, child, supplied_created)
        view["aip_action_id"] = caller_id
        return view

    async def _call(
        self, principal: Principal, child: ChildAction, supplied_created: bool
    ) -> dict[str, Any]:
        route = self.routes.resolve(child.capability)
        if route is None:
            raise _unrouted(child.capability)
        if not principal.may_call(child.capability, route.endpoint_id):
            raise ConnectorError(
                ErrorCode.HOST_ROUTE_MISMATCH,
                f"this principal may not call capability {child.capability[:200]!r} "
                "(its capability_prefixes / endpoints in the principals file)",
            )
        if not await self.children.served(route):
            raise ConnectorError(
                ErrorCode.HOST_ROUTE_MISMATCH,
                f"nothing on this bus takes {route.subjects.actions} (capability "
                f"{child.capability[:200]!r}): no stream binds it",
            )
        if route.endpoint_id is not None:
            # A Hermes worker takes a plain Action in an AIP Action Envelope: refuse here
            # what it would refuse, or what cannot travel as one (a `conversation` that is
            # not the AIP Conversation), before anything is enqueued.
            try:
                msgspec.convert(msgspec.to_builtins(child), Action)
                self.children.envelope(child, route, self.children.signer)
            except msgspec.ValidationError as exc:
                raise _invalid(f"invalid Action contract: {exc}") from None
            except EnvelopeRejected as exc:
                raise _invalid(f"invalid Action contract: {exc.reason}") from None
            await self._check_tenant(principal, route)
        existing = await self.reader.queue(child.id)
        if existing is None:
            if await self.children.on_bus(route, child.id):
                # Another Action's result holds the id: nothing there is this child's.
                raise not_found(child.id)
            now = now_ms()
            record = QueueRecord(
                action=child,
                owner_principal_id=principal.principal_id,
                authenticated=principal.authenticated(),
                actor_principal_id=principal.principal_id,
                tenant_partition=principal.tenant_id,
                state=LifecycleState.QUEUED,
                enqueued_at_unix_ms=now,
                updated_at_unix_ms=now,
            )
            try:
                await self.children.writer.create_queue_entry(record)
            except QueueEntryExists:
                existing = await self.reader.queue(child.id)
                if existing is None:  # created and gone again: not ours to guess about
                    raise not_found(child.id) from None
            else:
                faults.hit("gateway_after_enqueue", child.id)
                try:
                    record = await self.children.dispatch(record, route, first=True)
                except ActionIdTaken:
                    await self._settle_taken(record, route)
                    raise not_found(child.id) from None
                return await self._after_dispatch(record, route, principal)
        self._same_contract(principal, child, existing, supplied_created=supplied_created)
        view = _view(existing)
        lifecycle = (await self.reader.read(child.id)).lifecycle
        view["result"] = msgspec.to_builtins(lifecycle.result) if lifecycle else None
        view["duplicate"] = True
        return view

    async def _check_tenant(self, principal: Principal, route: Route) -> None:
        """Refuse, before anything is enqueued, a child for an endpoint whose manifest binds
        it to a tenant that does not admit the principal's (the worker would refuse it at
        admission; here nothing is stored or sent). No manifest answering leaves the check
        to the worker's admission, which applies the same rule."""
        manifest = await self.discovery.manifest(f"{route.subjects.base}.manifest")
        if manifest is not None and not _serves_tenant(manifest, principal.tenant_id, now_ms()):
            raise ConnectorError(
                ErrorCode.TENANT_MISMATCH,
                f"endpoint {route.endpoint_id} does not serve this principal's tenant",
            )

    async def _settle_taken(self, record: QueueRecord, route: Route) -> None:
        """End the queue entry of a child whose dispatch was dropped as a duplicate: it was
        never sent, so it failed with certainty, and no result on the bus is believed."""
        failure = ConnectorError(
            ErrorCode.CONFIGURATION_OR_INPUT,
            f"no Action {record.action.id} of this principal could be dispatched: the id is "
            "not usable; choose another",
        )
        error = failure.to_protocol(endpoint_id=route.endpoint_id, read_only=False)
        await self.children.settle(
            record,
            ChildResult(
                action_id=record.action.id,
                capability=record.action.capability,
                status="failed",
                error=msgspec.to_builtins(error),
                settled_at_unix_ms=now_ms(),
            ),
        )

    def _same_contract(
        self,
        principal: Principal,
        child: ChildAction,
        existing: QueueRecord,
        *,
        supplied_created: bool,
    ) -> None:
        if not self._owns(principal, existing):
            raise not_found(child.id)  # exactly like an unknown id: no oracle
        stored = existing.action
        if not supplied_created:
            child = replace(child, created_at_unix_ms=stored.created_at_unix_ms)
        if msgspec.json.encode(child) != msgspec.json.encode(stored):
            raise _collision()

    async def _after_dispatch(
        self, record: QueueRecord, route: Route, principal: Principal
    ) -> dict[str, Any]:
        timeout_s = self.follow_timeout_s(record)
        if record.action.mode is Mode.SYNC:
            view = await self.follow(record, route, timeout_s)
            return view
        # Past the principal's cap an asynchronous child is not followed in memory: the
        # recovery sweep settles it from its result (worker/gateway/follow_limits.py).
        if self.follows.try_take(principal):
            task = asyncio.get_running_loop().create_task(
                self._follow_quietly(record, route, timeout_s)
            )
            self._following.add(task)
            task.add_done_callback(self._following.discard)
            task.add_done_callback(lambda _: self.follows.release(principal))
        view = _view(record)
        view["result"] = None
        return view

    def follow_timeout_s(self, record: QueueRecord) -> float:
        timeout_ms = record.action.timeout_ms or self.settings.gateway_call_timeout_ms
        return max(0.0, (record.enqueued_at_unix_ms + timeout_ms - now_ms()) / 1000)

    async def follow(self, record: QueueRecord, route: Route, timeout_s: float) -> dict[str, Any]:
        """Wait for the child's result within `timeout_s` and settle both records."""
        result = await self.children.wait_result(route, record.action, timeout_s)
        if not isinstance(result, ActionResult):
            # None yet, or only refused ones: recovery settles it at its deadline.
            view = _view(record)
            view["result"] = None
            return view
        native = child_result(result)
        terminal = await self.children.settle(record, native)
        view = _view(terminal)
        view["result"] = msgspec.to_builtins(native)
        return view

    async def _follow_quietly(self, record: QueueRecord, route: Route, timeout_s: float) -> None:
        try:
            await self.follow(record, route, timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the recovery sweep finishes what this could not
            log.warning(
                "following %s failed (%s); recovery will finish it",
                record.action.id,
                type(exc).__name__,
                extra={"action_id": record.action.id},
            )

    async def stop(self) -> None:
        """Stop following (records stay; any gateway's recovery finishes them)."""
        await stop_tasks(list(self._following), 5.0)

    # --- status / result / events / cancel ------------------------------------------------

    @staticmethod
    def _owns(principal: Principal, record: QueueRecord) -> bool:
        return (
            record.owner_principal_id == principal.principal_id
            and record.authenticated.principal_id == principal.principal_id
            and record.tenant_partition == principal.tenant_id
        )

    async def _own_record(self, principal: Principal, action_id: str) -> QueueRecord:
        """The record of the principal's Action the caller names `action_id`: the id
        namespaced to the principal (what `aip_call` made of it), else the id itself (a
        delegated child keeps its own). Anything not owned is answered like an unknown id."""
        if not isinstance(action_id, str) or not is_action_id(action_id):
            raise _invalid("action_id must be act_ followed by 32 hex digits")
        namespaced = namespaced_action_id(principal.principal_id, principal.tenant_id, action_id)
        for candidate in (namespaced, action_id):
            record = await self.reader.queue(candidate)
            if record is not None and self._owns(principal, record):
                return record
        raise not_found(action_id)

    async def status(self, principal: Principal, action_id: str) -> dict[str, Any]:
        return _view(await self._own_record(principal, action_id))

    async def result(
        self, principal: Principal, action_id: str, wait_ms: int = 0
    ) -> dict[str, Any]:
        """The durable native result once the child is terminal (`result` null before),
        waiting up to `wait_ms` for it; a wait counts against the principal's follow cap."""
        if wait_ms <= 0:
            return await self._settled(principal, action_id)
        deadline = asyncio.get_running_loop().time() + wait_ms / 1000
        with self.follows.hold(principal):
            while True:
                view = await self._settled(principal, action_id)
                if view["result"] is not None or asyncio.get_running_loop().time() >= deadline:
                    return view
                await asyncio.sleep(WAIT_POLL_S)

    async def _settled(self, principal: Principal, action_id: str) -> dict[str, Any]:
        record = await self._own_record(principal, action_id)
        lifecycle = (await self.reader.read(record.action.id)).lifecycle
        view = _view(record)
        ready = record.state.terminal and lifecycle is not None and lifecycle.result is not None
        view["result"] = msgspec.to_builtins(lifecycle.result) if ready and lifecycle else None
        return view

    async def events(
        self,
        principal: Principal,
        action_id: str,
        cursor: int = 0,
        limit: int = 100,
        *,
        kinds: frozenset[str] = frozenset(),
        include_chunks: bool = False,
        follow: bool = False,
    ) -> tuple[dict[str, Any], QueueRecord]:
        """The AIP ActionEvents page of the child from chunk `cursor` along its hash chain
        (worker/gateway/chunk_reads.py; each event says whether the chain was checked
        against the child's signed result), and its record. With `follow`, an empty page
        of a running child is read again until a chunk arrives or `FOLLOW_WAIT_S` passes,
        counted against the principal's follow cap."""
        record = await self._own_record(principal, action_id)
        if cursor < 0 or not 1 <= limit <= MAX_EVENTS_PER_CALL:
            raise _invalid(f"cursor must be >= 0 and limit 1..{MAX_EVENTS_PER_CALL}")
        if not follow:
            page = await self._events_page(record, action_id, cursor, limit, kinds, include_chunks)
            return page, record
        deadline = asyncio.get_running_loop().time() + FOLLOW_WAIT_S
        with self.follows.hold(principal):
            while True:
                page = await self._events_page(
                    record, action_id, cursor, limit, kinds, include_chunks
                )
                if (
                    page["events"]
                    or page["terminal"]
                    or asyncio.get_running_loop().time() >= deadline
                ):
                    return page, record
                await asyncio.sleep(WAIT_POLL_S)

    async def _events_page(
        self,
        record: QueueRecord,
        caller_id: str,
        cursor: int,
        limit: int,
        kinds: frozenset[str],
        include_chunks: bool,
    ) -> dict[str, Any]:
        read = await self.read_chain(record)
        return events_page(
            caller_id,
            read.links,
            cursor=cursor,
            limit=limit,
            kinds=kinds,
            verified=read.verified,
            # Ended once its result is known (the record settled, or the chain checked
            # against the signed result): never on a terminal chunk alone, which a child
            # of a non-streaming capability does not have and anyone may forge.
            terminal=record.state.terminal or read.verified,
            include_chunks=include_chunks,
        )

    async def own_child(self, principal: Principal, action_id: str) -> tuple[QueueRecord, Route]:
        """The record and route of one of the principal's own children (`_not_found`
        otherwise): what a chunk follower (worker/gateway/chunk_follower.py) follows."""
        record = await self._own_record(principal, action_id)
        return record, self._route_of(record)

    async def own_chain(self, principal: Principal, action_id: str) -> ChainRead:
        """`read_chain` of one of the principal's own children (`_not_found` otherwise)."""
        return await self.read_chain(await self._own_record(principal, action_id))

    async def read_chain(self, record: QueueRecord) -> ChainRead:
        """What the child's chunk subject holds along its hash chain, read once from chunk 0
        (the chain is judged from there): walked back from the signed result when it is on
        the bus (`verified`), else followed forward."""
        bus_id = record.action.id
        route = self._route_of(record)
        reader = ChunkReader(bus_id)
        subject = route.subjects.chunks(bus_id)
        try:
            stream: str | None = await self.nc.jetstream().find_stream_name_by_subject(subject)
        except NotFoundError:
            stream = None
        if stream is not None:
            # Message gets, never a consumer (worker/bus/stream_reads.py).
            # Once a terminal chunk is read, only what is stored already is read on (a forged
            # terminal must not hide the real one from the walk back from the result).
            async with SubjectFollower(self.nc, stream, subject) as follower:
                # A terminal child's chunks are all stored (they go out before its
                # result): nothing to wait for.
                wait = 0.0 if record.state.terminal else EVENTS_IDLE_S
                for _ in range(MAX_CHUNKS_READ):
                    msg = await follower.next(wait)
                    if msg is None:
                        break
                    link = reader.add(msg.data or b"")
                    if link is not None and link.terminal:
                        wait = 0.0
        chain, verified = await self._chain(reader, route, record)
        if reader.skipped:
            log.info(
                "%d messages on %s are not chunks of %s and were skipped",
                reader.skipped,
                subject,
                bus_id,
                extra={"action_id": bus_id},
            )
        return ChainRead(record=record, links=chain, verified=verified)

    async def _chain(
        self, reader: ChunkReader, route: Route, record: QueueRecord
    ) -> tuple[list[Link], bool]:
        """The child's chain: walked back from its result's last chunk hash when its
        (verified) result is on the bus and names one, else followed forward. A child that
        ended without a chunk stream (its verified result names no last chunk: a
        non-streaming capability) has the empty chain, verified: whatever its subject holds
        is not the child's."""
        forward = reader.forward()
        terminal_read = any(link.terminal for link in reader.links)
        if not terminal_read and not record.state.terminal:
            return forward, False  # still running: nothing to check the chain against yet
        result = await self.children.stored_result(route, record.action)
        if not isinstance(result, ActionResult):
            return forward, False
        if result.last_chunk_sha256 is None:
            return [], True
        if not terminal_read:
            return forward, False
        authentic = reader.backward(result.last_chunk_sha256)
        # Not all of the chain is stored (aged out): pass nothing rather than guess.
        return (authentic, True) if authentic is not None else ([], False)

    async def cancel(
        self, principal: Principal, action_id: str, reason: str = ""
    ) -> dict[str, Any]:
        """An AIP Cancel to the executor, signed as the caller; the answer is the child's
        terminal result when the cancel settles it within `CANCEL_WAIT_S` (its status is
        `executor_status`; the record follows from the result on the bus), else the
        executor's error with what it found (`accepted`, `executor_state`)."""
        record = await self._own_record(principal, action_id)
        if record.state.terminal:
            return {**_view(record), "accepted": False, "reason": "the Action already ended"}
        route = self._route_of(record)
        try:
            outcome = await self.children.cancel(
                route,
                action_id,
                requested_by=principal.principal_id,
                requester_kind=principal.principal_kind,
                reason=reason[:1024],
                wait_s=CANCEL_WAIT_S,
            )
        except (NatsTimeout, TimeoutError):
            raise ConnectorError(
                ErrorCode.HOST_NOT_READY, "no executor answered the cancel request in time"
            ) from None
        except UnverifiedResponse as exc:
            raise ConnectorError(ErrorCode.HOST_RESPONSE_SIGNING, str(exc)) from None
        view = _view(record)
        view.update(accepted=outcome.accepted, executor_state=outcome.state)
        if outcome.result is not None:
            view["executor_status"] = outcome.result.status.value
        if outcome.error is not None:
            view["error"] = msgspec.to_builtins(outcome.error)
        return view

    def _route_of(self, record: QueueRecord) -> Route:
        route = self.routes.resolve(record.action.capability)
        if route is None:
            raise _unrouted(record.action.capability)
        return route
