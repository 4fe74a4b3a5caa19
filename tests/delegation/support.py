"""Builders shared by the delegation tests: one valid request, changed one field at a time."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import nats
from nats.aio.client import Client as NATS

from schemas.action import DelegationRef, Identity
from schemas.delegation import ChildAction, DelegationRequest
from schemas.ids import new_action_id
from subjects.grammar import Subjects
from subjects.provision import StreamPolicy, provision
from tests.integration.stack import Stack
from worker.client import AipClient
from worker.operator.policy import HermesOperatorPolicy
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import GatewayRuntime, gateway_runtime, hermes_principal_id
from worker.testing.gateway import hermes_trust as hermes_trust
from worker.testing.identities import TrustFiles, write_api_key_file

CHILD_CAPABILITY = "cap:support_sandbox:case.get"
DELEGATOR = "user:demo"
ISSUER = "https://idp.example.test"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def enabled_policy(**changes: Any) -> HermesOperatorPolicy:
    fields: dict[str, Any] = {
        "delegation_enabled": True,
        "capability_prefixes": ("cap:support_sandbox:",),
        "scope_prefixes": ("support.",),
        "poll_interval_ms": 50,
    }
    fields.update(changes)
    return HermesOperatorPolicy(**fields)


def make_request(
    endpoint_id: str = "h1",
    *,
    tenant_id: str | None = None,
    chain: list[str] | None = None,
    child_input: dict[str, Any] | None = None,
    deadline_s: float = 30.0,
    delegator: str = DELEGATOR,
    **child_changes: Any,
) -> DelegationRequest:
    delegate = f"agent:hermes_operator:{endpoint_id}"
    delegation_id = "dlg-" + secrets.token_hex(8)
    chain = chain if chain is not None else [delegator]
    created = now_ms()
    child = ChildAction(
        id=new_action_id(),
        capability=CHILD_CAPABILITY,
        input=child_input if child_input is not None else {"case_id": "case-2030"},
        identity=Identity(principal_id=delegate, principal_kind="agent", tenant_id=tenant_id),
        created_at_unix_ms=created,
        idempotency_key="idem-" + secrets.token_hex(6),
        timeout_ms=60_000,
        # The AIP Conversation (closed: id, channel, status): it travels in the child's
        # AIP Action Envelope.
        conversation={"id": "conv_" + "c" * 32, "channel": {"thread": "t-1"}, "status": "open"},
        memory={"notes": ["keep"]},
        delegation=DelegationRef(
            delegation_id=delegation_id, parent_action_id=new_action_id(), chain=list(chain)
        ),
    )
    if child_changes:
        child = msgspec.structs.replace(child, **child_changes)
    return DelegationRequest(
        delegation_id=delegation_id,
        delegator=Identity(
            principal_id=delegator,
            principal_kind="user",
            tenant_id=tenant_id,
            authentication_issuer=ISSUER,
            credential_revision=3,
        ),
        delegate=delegate,
        action=child,
        chain=list(chain),
        scopes=["support.read"],
        created_at_unix_ms=created,
        deadline_unix_ms=created + int(deadline_s * 1000),
    )


def downstream_env(
    nats_url: str,
    redis_url: str,
    key_file: Path,
    trust: TrustFiles,
    child_prefix: str,
    *,
    lease_ttl_ms: int,
    poll_interval_ms: int,
) -> dict[str, str]:
    """Workers' environment for delegations whose child is a Hermes capability on the bus
    (`child_prefix`, allowed and exempt from the child approval)."""
    return {
        "AIPD_NATS_URL": nats_url,
        "AIPD_REDIS_URL": redis_url,
        "AIPD_HERMES_API_KEY_FILE": str(key_file),
        "AIPD_LEASE_TTL_MS": str(lease_ttl_ms),
        "AIPD_NAK_DELAY_MS": "200",
        "AIPD_HERMES_OPERATOR_DELEGATION_ENABLED": "true",
        "AIPD_HERMES_OPERATOR_CAPABILITY_PREFIXES": child_prefix,
        "AIPD_HERMES_OPERATOR_SCOPE_PREFIXES": "support.",
        "AIPD_HERMES_OPERATOR_DELEGATION_APPROVAL_EXEMPT_PREFIXES": child_prefix,
        "AIPD_HERMES_OPERATOR_POLL_INTERVAL_MS": str(poll_interval_ms),
        **trust.environment(),
    }


class DownstreamBus(NamedTuple):
    """What a two-instance delegation fixture starts from."""

    trust: TrustFiles
    api_key: str
    key_file: Path
    nc: NATS
    #: endpoint -> (its Hermes' gateway principal, no tenant), for `gateway_runtime`.
    principals: dict[str, tuple[str, str | None]]


async def downstream_bus(
    tmp_path: Path, nats_url: str, endpoints: Sequence[str], *, ack_wait_s: float
) -> DownstreamBus:
    """Trust files naming each endpoint's Hermes, one Hermes API key, a NATS connection (the
    caller closes it) and the streams of `endpoints`, provisioned."""
    trust = hermes_trust(tmp_path / "trust", endpoints)
    api_key, key_file = write_api_key_file(tmp_path)
    nc = await nats.connect(nats_url)
    policy = StreamPolicy(ack_wait_s=ack_wait_s)
    await provision(nc.jetstream(), Subjects(), list(endpoints), policy)
    principals: dict[str, tuple[str, str | None]] = {
        endpoint_id: (hermes_principal_id(endpoint_id), None) for endpoint_id in endpoints
    }
    return DownstreamBus(trust, api_key, key_file, nc, principals)


@contextlib.asynccontextmanager
async def real_hermes_to_a_worker(
    tmp_path: Path, nats_url: str, redis_url: str, child_prefix: str, **gateway_settings: Any
) -> AsyncIterator[tuple[Stack, FakeHermes, GatewayRuntime]]:
    """The real Hermes 0.19.0 as h1's operator (its `mcp_servers.aip` the gateway, with its
    own token), worker w-h1 driving it and w-h2 serving h2 over a fake Hermes, children of
    `child_prefix` allowed and exempt from approval; the gateway in-process with
    `gateway_settings` and the child results counted only as signed by a trusted worker.
    Yields the stack, h2's fake Hermes and the gateway."""
    from worker.testing.real_hermes import RealHermes

    trust, api_key, key_file, nc, principals = await downstream_bus(
        tmp_path, nats_url, ("h1", "h2"), ack_wait_s=15.0
    )
    async with contextlib.AsyncExitStack() as exits:
        runtime = await exits.enter_async_context(
            gateway_runtime(
                nats_url,
                tmp_path,
                trust.seed_file,
                principals,
                trusted_worker_keys_file=trust.worker_keys_file,
                **gateway_settings,
            )
        )
        downstream = await exits.enter_async_context(FakeHermes(api_key=api_key))
        # Hermes lists MCP tools when it starts: the gateway is already serving.
        real = await exits.enter_async_context(
            RealHermes(
                tmp_path / "hermes",
                api_key=api_key,
                mcp_servers={"aip": (runtime.url, runtime.tokens["h1"])},
            )
        )
        stack = Stack(
            root=tmp_path,
            nats_url=nats_url,
            redis_url=redis_url,
            fake=None,
            trust=trust,
            nc=nc,
            client=AipClient(nc, sign_key=trust.seed_file),
            env=downstream_env(
                nats_url,
                redis_url,
                key_file,
                trust,
                child_prefix,
                lease_ttl_ms=15_000,
                poll_interval_ms=100,
            ),
        )
        try:
            await stack.spawn("w-h1", AIPD_HERMES_ENDPOINTS=f"h1={real.url}")
            await stack.spawn("w-h2", AIPD_HERMES_ENDPOINTS=f"h2={downstream.url}")
            yield stack, downstream, runtime
        finally:
            stack.stop_workers()
            await nc.close()
