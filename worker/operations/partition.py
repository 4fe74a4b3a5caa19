"""Tenant partitions of a shared endpoint: a tenant neither lists nor reads another's ids.

One Hermes keeps one session database, one job list, one run table and one response store,
and answers every bearer of its key alike. An endpoint bound to no tenant but configured
`shared` (`AIPD_HERMES_SHARED_ENDPOINTS`, checked by the trust gate,
`worker.trust.tenancy`) therefore serves several tenants only through this module, which
every Hermes operation passes (`JsonOperation`, the model turns, `StreamOperation`, the
operator's session id):

* **The partition** of an Action is its verified tenant's (the trust gate admitted its
  identity): the prefix `t<12 hex of sha256("tenant:<id>")>-`, or `t<12 hex of
  sha256("untenanted")>-` for an Action without a tenant. Every Action on a shared
  endpoint has one (except the internal channel-delivery principal, which posts into the
  sessions the egress file names); ids outside every prefix (sessions Hermes names
  itself: `api-…` of chat completions, the uuid4 of a Responses chain) belong to no
  partition and are read by none.
* **Ids the caller names** (session ids, fork children, a run's `session_id`, a job's
  `name`, a Responses `conversation`) must start with the prefix; an id left out is
  minted inside it from the Action id (`<prefix><action id>`), so a redelivery names the
  same one. Anything else is refused before a request is sent.
* **Ids Hermes mints**: a run is its session's (its status names the `session_id`); a job
  is its name's; a stored response is recorded in Redis as its creator's partition when
  the turn returns it (`…:partition:v1:{endpoint}:response:{id}`). An unsafe request on
  such an id reads the owner first; a read checks it before answering.
* **Lists** (`sessions_list`, `jobs_list`) answer only the partition's rows. Hermes pages
  before the worker filters, so a page may hold fewer rows than `limit` while `has_more`
  is Hermes' own (`len(data) == limit` of the unfiltered page).

Every refusal is `connector.hermes_agent.tenant_mismatch`, and an id of another partition
is refused with the words used for one that does not exist: a tenant learns nothing about
another's ids from the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.exceptions import RedisError

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.operations.base import ExecutionContext, Outcome
from worker.trust.tenancy import partition_prefix as partition_prefix

log = logging.getLogger(__name__)

#: Redis keys of response owners (the worker's ACL covers `aip:connector:hermes_agent:*`).
RESPONSE_OWNER_NAMESPACE = "aip:connector:hermes_agent:partition:v1"
#: Hermes keeps at most 100 stored responses, least recently used first out; an owner
#: record outliving its response is harmless, so it lasts as long as a result record.
RESPONSE_OWNER_TTL_MS = 30 * 86_400_000

_SESSION_PARAM = frozenset(
    {
        "session_get",
        "session_patch",
        "session_delete",
        "session_messages",
        "session_chat",
        "session_chat_stream",
        "session_fork",
    }
)
_RUN_REF = frozenset({"run_status", "run_events", "run_approval", "run_stop"})
_JOB_REF = frozenset({"job_get", "job_update", "job_delete", "job_pause", "job_resume", "job_run"})
_RESPONSE_REF = frozenset({"response_get", "response_delete"})
#: The two Responses API turns (sync and streamed): both take `conversation` and `store`.
_RESPONSES = frozenset({"responses", "responses_stream"})


def prefix_of(ctx: ExecutionContext) -> str:
    """The Action's partition prefix on a shared endpoint, "" on any other."""
    if not ctx.endpoint.descriptor.shared:
        return ""
    return partition_prefix(ctx.action.identity.tenant_id)


def response_owner_key(endpoint_id: str, response_id: str) -> str:
    return f"{RESPONSE_OWNER_NAMESPACE}:{{{endpoint_id}}}:response:{response_id}"


def _outside(kind: str, value: object) -> ConnectorError:
    return ConnectorError(
        ErrorCode.TENANT_MISMATCH,
        f"no {kind} {value!r} in this tenant's partition of the shared endpoint",
    )


@dataclass(frozen=True, slots=True)
class Partition:
    """One Action's partition of a shared endpoint."""

    prefix: str

    def owns(self, value: object) -> bool:
        return isinstance(value, str) and value.startswith(self.prefix)

    def require(self, kind: str, value: object) -> None:
        if not self.owns(value):
            raise ConnectorError(
                ErrorCode.TENANT_MISMATCH,
                f"on this shared endpoint a {kind} must start with this tenant's partition "
                f"prefix {self.prefix!r}",
            )

    def minted(self, ctx: ExecutionContext) -> str:
        """The id an Action that names none gets: stable across redeliveries."""
        return self.prefix + ctx.action.id


def partition_of(ctx: ExecutionContext) -> Partition | None:
    """The Action's partition; None off a shared endpoint, and for a channel delivery: the
    internal principal that posts into the sessions the administrator's egress file names
    (never admitted from the bus: it is in no identity directory)."""
    prefix = prefix_of(ctx)
    if not prefix:
        return None
    from worker.wire.channels import CHANNEL_PRINCIPAL

    if ctx.action.identity.principal_id == CHANNEL_PRINCIPAL:
        return None
    return Partition(prefix)


async def guard(ctx: ExecutionContext, name: str, params: Any) -> Any:
    """`params` checked against the Action's partition (ids it lacks minted inside it);
    raises ConnectorError before any request of the operation is sent. Unchanged on an
    endpoint that is not shared."""
    part = partition_of(ctx)
    if part is None:
        return params
    if name in _SESSION_PARAM:
        part.require("session id", params.session_id)
    if name in ("session_create", "session_fork"):
        if params.id is None:
            params = msgspec.structs.replace(params, id=part.minted(ctx))
        part.require("session id", params.id)
    elif name == "run_start":
        if params.session_id is None:
            params = msgspec.structs.replace(params, session_id=part.minted(ctx))
        part.require("session id", params.session_id)
    elif name == "job_create":
        part.require("job name", params.name)
    elif name in _RESPONSES and params.conversation is not None:
        part.require("conversation", params.conversation)
    if name == "job_update" and isinstance(params.name, str):
        part.require("job name", params.name)
    previous = getattr(params, "previous_response_id", None)
    if name in ("responses", "responses_stream", "run_start") and previous is not None:
        await _require_response(ctx, part, previous)
    if name in _RESPONSE_REF:
        await _require_response(ctx, part, params.response_id)
    if name in _RUN_REF:
        run = await _read(ctx, "run", "/v1/runs/{run_id}", {"run_id": params.run_id})
        if not part.owns(run.get("session_id")):
            raise _outside("run", params.run_id)
    if name in _JOB_REF and name != "job_get":
        job = (await _read(ctx, "job", "/api/jobs/{job_id}", {"job_id": params.job_id})).get("job")
        if not isinstance(job, dict) or not part.owns(job.get("name")):
            raise _outside("job", params.job_id)
    return params


async def screen(ctx: ExecutionContext, name: str, params: Any, outcome: Outcome) -> Outcome:
    """What the Action may see of `outcome`: lists cut to the partition, a job read of
    another partition refused, a stored response recorded as the partition's. Called
    before the output is published, so nothing of another partition reaches a chunk."""
    part = partition_of(ctx)
    if part is None:
        return outcome
    body = outcome.output
    if name == "sessions_list" and isinstance(body, dict) and isinstance(body.get("data"), list):
        rows = [row for row in body["data"] if isinstance(row, dict) and part.owns(row.get("id"))]
        outcome.output = {**body, "data": rows}
    elif name == "jobs_list" and isinstance(body, dict) and isinstance(body.get("jobs"), list):
        jobs = [job for job in body["jobs"] if isinstance(job, dict) and part.owns(job.get("name"))]
        outcome.output = {**body, "jobs": jobs}
    elif name == "job_get":
        job = body.get("job") if isinstance(body, dict) else None
        if not isinstance(job, dict) or not part.owns(job.get("name")):
            raise _outside("job", params.job_id)
    elif name in _RESPONSES and params.store is not False and isinstance(body, dict):
        response_id = body.get("id")
        if isinstance(response_id, str) and response_id:
            await _record_response(ctx, part, response_id)
    return outcome


async def _read(
    ctx: ExecutionContext, kind: str, route: str, path: dict[str, str]
) -> dict[str, Any]:
    """The object an id names, read to learn its owner; a 404 is answered as "not in the
    partition", exactly like an id of another one."""
    try:
        response = await ctx.hermes.request_json(
            "GET", route, path, headers=ctx.trusted_headers(), total_timeout_s=ctx.remaining_s()
        )
    except ConnectorError as exc:
        if exc.remote_status == 404:
            raise _outside(kind, next(iter(path.values()))) from None
        raise
    body = response.body
    return body if isinstance(body, dict) else {}


async def _require_response(ctx: ExecutionContext, part: Partition, response_id: str) -> None:
    try:
        owner = await ctx.stores.client.get(response_owner_key(ctx.endpoint.id, response_id))
    except (RedisError, OSError) as exc:
        raise ConnectorError(
            ErrorCode.HOST_NOT_READY,
            f"the owner of a stored response could not be read: {type(exc).__name__}",
        ) from None
    if owner is None or (owner.decode() if isinstance(owner, bytes) else owner) != part.prefix:
        raise _outside("response", response_id)


async def _record_response(ctx: ExecutionContext, part: Partition, response_id: str) -> None:
    """Record the turn's stored response as the partition's; NX, so a response id can never
    change partition. A failure to record leaves the response readable by no one."""
    try:
        await ctx.stores.client.set(
            response_owner_key(ctx.endpoint.id, response_id),
            part.prefix,
            nx=True,
            px=RESPONSE_OWNER_TTL_MS,
        )
    except (RedisError, OSError) as exc:
        log.warning(
            "stored response %s on endpoint %s could not be recorded as its tenant "
            "partition's (%s): no Action can read it",
            response_id,
            ctx.endpoint.id,
            type(exc).__name__,
        )
