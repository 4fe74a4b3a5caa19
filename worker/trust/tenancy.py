"""Endpoint tenant binding: an endpoint bound to a tenant serves that verified tenant only.

The tenant checked here is the directory's verified tenant, never one taken from `input`.
An unbound endpoint (no `tenant_id` in its descriptor) serves every tenant. A bound one
refuses, with `connector.hermes_agent.tenant_mismatch`, an Action whose verified tenant is
missing or different, and everything once the binding's `tenant_expires_at_unix_ms` passed.
"""

from __future__ import annotations

import re

from schemas.errors import ErrorCode
from schemas.ids import CAPABILITY_PATTERN, split_capability
from worker.endpoints import Endpoint
from worker.errors import ConnectorError
from worker.store.clock import Clock


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
    bound: str | None, expires_at_unix_ms: int | None, tenant_id: str | None, now_ms: int
) -> bool:
    """Whether a binding (`bound`, `expires_at_unix_ms`) admits an Action of `tenant_id` at
    `now_ms`: exactly what `check_endpoint_tenant` accepts, for those (the gateway's
    `aip_capabilities`) that must not offer what a worker would refuse."""
    if bound is None:
        return True
    if expires_at_unix_ms is not None and now_ms >= expires_at_unix_ms:
        return False
    return tenant_id is not None and tenant_id == bound


async def check_endpoint_tenant(endpoint: Endpoint, tenant_id: str | None, clock: Clock) -> None:
    bound = endpoint.descriptor.tenant_id
    if bound is None:
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
