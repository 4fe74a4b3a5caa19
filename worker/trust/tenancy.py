"""Endpoint tenant binding: an endpoint bound to a tenant serves that verified tenant only.

The tenant checked here is the directory's verified tenant, never one taken from `input`.
Every refusal is `connector.hermes_agent.tenant_mismatch`, before anything is sent:

- a bound endpoint (`tenant_id` in its descriptor) refuses an Action whose verified tenant
  is missing or different, and everything once `tenant_expires_at_unix_ms` passed;
- an unbound endpoint refuses every Action that carries a tenant, unless it is configured
  `shared` (`AIPD_HERMES_SHARED_ENDPOINTS`): one Hermes keeps one session database, job
  list and response store, so serving two tenants there is a decision an administrator
  makes, and a shared endpoint partitions those ids per tenant
  (`worker.operations.partition`). Actions without a tenant are admitted on either.
"""

from __future__ import annotations

import hashlib
import re

from schemas.errors import ErrorCode
from schemas.ids import CAPABILITY_PATTERN, split_capability
from worker.endpoints import Endpoint
from worker.errors import ConnectorError
from worker.store.clock import Clock


def partition_prefix(tenant_id: str | None) -> str:
    """The id prefix of a tenant's partition on a shared endpoint (of the untenanted one for
    None): `worker.operations.partition` applies it; channel egress rules check a session
    against it. Here, beside the other tenancy rules, so both can import it."""
    material = "untenanted" if tenant_id is None else f"tenant:{tenant_id}"
    return "t" + hashlib.sha256(material.encode()).hexdigest()[:12] + "-"


def check_route(capability: str, endpoint: Endpoint) -> None:
    """The capability must name this endpoint: tenant binding is per endpoint, so a mismatch
    here would check the wrong binding (`connector_host.route_mismatch`)."""
    if not re.fullmatch(CAPABILITY_PATTERN, capability):
        raise ConnectorError(ErrorCode.HOST_ROUTE_MISMATCH, "capability id is malformed")
    endpoint_id, _ = split_capability(capability)
    if endpoint_id != endpoint.id:
        raise ConnectorError(
            ErrorCode.HOST_ROUTE_MISMATCH,
            f"capability names endpoint {endpoint_id!r}, delivered to endpoint {endpoint.id!r}",
        )


def binding_admits(
    bound: str | None,
    expires_at_unix_ms: int | None,
    tenant_id: str | None,
    now_ms: int,
    *,
    shared: bool = True,
) -> bool:
    """Whether a binding (`bound`, `expires_at_unix_ms`, `shared`) admits an Action of
    `tenant_id` at `now_ms`: exactly what `check_endpoint_tenant` accepts, for those (the
    gateway's `aip_capabilities`) that must not offer what a worker would refuse. `shared`
    defaults to True for a caller that does not read the manifest's `shared` yet: it may
    then offer what the worker refuses, never the reverse."""
    if bound is None:
        return tenant_id is None or shared
    if expires_at_unix_ms is not None and now_ms >= expires_at_unix_ms:
        return False
    return tenant_id is not None and tenant_id == bound


async def check_endpoint_tenant(endpoint: Endpoint, tenant_id: str | None, clock: Clock) -> None:
    bound = endpoint.descriptor.tenant_id
    if bound is None:
        if tenant_id is not None and not endpoint.descriptor.shared:
            raise ConnectorError(
                ErrorCode.TENANT_MISMATCH,
                f"endpoint {endpoint.id!r} is bound to no tenant and not configured shared "
                "(AIPD_HERMES_SHARED_ENDPOINTS); an Action carrying a tenant is refused",
            )
        return
    expires = endpoint.descriptor.tenant_expires_at_unix_ms
    if expires is not None and await clock.now_ms() >= expires:
        raise ConnectorError(
            ErrorCode.TENANT_MISMATCH,
            f"endpoint {endpoint.id!r}: its tenant binding has expired; nothing is admitted",
        )
    if tenant_id is None:
        raise ConnectorError(
            ErrorCode.TENANT_MISMATCH,
            f"endpoint {endpoint.id!r} is bound to a tenant; the Action has no verified tenant",
        )
    if tenant_id != bound:
        raise ConnectorError(
            ErrorCode.TENANT_MISMATCH,
            f"endpoint {endpoint.id!r} is bound to another tenant than the Action's",
        )
