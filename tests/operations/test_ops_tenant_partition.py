"""Every partitioned operation on a shared endpoint, against the Hermes server under test.

What `tests/integration/test_tenancy_boundaries.py` replays through workers (lists and reads
across tenants) is checked here per rule, on the operations themselves: ids are minted
inside the Action's partition, unsafe requests on another partition's job, run or response
are refused after reading the owner and before anything changes, and an Action without a
tenant has a partition of its own.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from ops_harness import ENDPOINT_ID, HermesServer, endpoint_for, make_action
from redis.asyncio import Redis

from schemas.action import Action, Identity
from schemas.codec import convert_input
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from tests.recording import RecordingContext
from worker.errors import ConnectorError
from worker.hermes.http_client import HermesClient
from worker.operations.base import Outcome, Registry
from worker.operations.partition import partition_prefix, response_owner_key
from worker.store.stores import Stores
from worker.testing.services import ServiceHandle

pytestmark = pytest.mark.asyncio(loop_scope="session")

A, B = "tenant-a", "tenant-b"


@pytest_asyncio.fixture(loop_scope="session")
async def shared(hermes: HermesServer) -> AsyncIterator[HermesClient]:
    client = HermesClient(endpoint_for(hermes.url, hermes.api_key, shared=True))
    try:
        yield client
    finally:
        await client.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def stores(redis_server: ServiceHandle) -> AsyncIterator[Stores]:
    client = Redis.from_url(redis_server.url)
    try:
        yield Stores.over(client)
    finally:
        await client.aclose()


def action_of(tenant: str | None, name: str, input_value: dict[str, Any]) -> Action:
    action = make_action(name, input_value, idempotency_key="idem-" + secrets.token_hex(8))
    identity = Identity(
        principal_id=f"user:{tenant or 'none'}",
        principal_kind="user",
        tenant_id=tenant,
        authentication_issuer="https://issuer.example",
    )
    return msgspec.structs.replace(action, identity=identity, delegation=None)


class Call:
    """`await call(tenant, operation, **input)` on the shared endpoint."""

    def __init__(self, client: HermesClient, registry: Registry, stores: Stores) -> None:
        self.client = client
        self.registry = registry
        self.stores = stores
        self.last: Action | None = None

    async def __call__(
        self, tenant: str | None, operation: str, /, **input_value: Any
    ) -> Outcome:
        op = self.registry.get(operation)
        assert op is not None, operation
        action = self.last = action_of(tenant, operation, input_value)
        ctx = RecordingContext(
            action=action, endpoint=self.client.endpoint, hermes=self.client, stores=self.stores
        )
        params = convert_input(action.input, op.spec.input_type)
        try:
            return await op.execute(ctx, params)
        except ConnectorError as exc:
            return Outcome(ResultStatus.FAILED, None, exc)


@pytest.fixture
def call(shared: HermesClient, registry: Registry, stores: Stores) -> Call:
    return Call(shared, registry, stores)


def refused(outcome: Outcome) -> None:
    assert outcome.status is ResultStatus.FAILED, outcome.output
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.TENANT_MISMATCH, outcome.error


async def test_sessions_are_minted_inside_the_partition_and_refused_outside(call: Call) -> None:
    a = partition_prefix(A)
    created = await call(A, "session_create")
    assert created.status is ResultStatus.COMPLETED, created.error
    assert call.last is not None
    assert created.output["session"]["id"] == a + call.last.id
    source = created.output["session"]["id"]
    fork = await call(A, "session_fork", session_id=source)
    assert fork.status is ResultStatus.COMPLETED, fork.error
    assert fork.output["session"]["id"].startswith(a)
    # Another tenant may neither fork it, nor name a child in tenant a's partition.
    refused(await call(B, "session_fork", session_id=source))
    refused(await call(B, "session_create", id=a + "squat"))
    refused(await call(A, "session_create", id="no-prefix"))
    # An Action without a tenant has a partition of its own, not everyone's.
    refused(await call(None, "session_get", session_id=source))
    untenanted = await call(None, "session_create")
    assert untenanted.output["session"]["id"].startswith(partition_prefix(None))


async def test_another_partitions_run_is_read_first_and_never_stopped(
    call: Call, hermes: HermesServer
) -> None:
    started = await call(A, "run_start", input="hello")
    assert started.status is ResultStatus.COMPLETED, started.error
    assert call.last is not None
    starter = call.last.id
    run_id = started.output["run_id"]
    status = await call(A, "run_status", run_id=run_id)
    assert status.status is ResultStatus.COMPLETED, status.error
    assert status.output["session_id"] == partition_prefix(A) + starter
    refused(await call(B, "run_stop", run_id=run_id))
    refused(await call(B, "run_approval", run_id=run_id, choice="always"))
    refused(await call(B, "run_events", run_id=run_id))
    refused(await call(B, "run_start", input="x", session_id=partition_prefix(A) + "theirs"))
    refused(await call(B, "run_status", run_id="run_" + "0" * 32))  # unknown: the same answer
    if hermes.fake is not None:
        assert hermes.fake.stats().runs.get(run_id, {}).get("POST /v1/runs/{run_id}/stop") is None


async def test_another_partitions_job_is_read_first_and_never_changed(call: Call) -> None:
    a = partition_prefix(A)
    refused(await call(A, "job_create", name="no-prefix", schedule="every 30m"))
    created = await call(A, "job_create", name=a + "job", schedule="every 30m", prompt="hi")
    assert created.status is ResultStatus.COMPLETED, created.error
    job_id = created.output["job"]["id"]
    refused(await call(A, "job_update", job_id=job_id, name="renamed-out"))
    for name in ("job_delete", "job_pause", "job_run", "job_resume", "job_get"):
        refused(await call(B, name, job_id=job_id))
    refused(await call(B, "job_update", job_id=job_id, prompt="exfiltrate"))
    still = await call(A, "job_get", job_id=job_id)
    assert still.status is ResultStatus.COMPLETED, still.error
    assert (still.output["job"]["prompt"], still.output["job"]["enabled"]) == ("hi", True)
    deleted = await call(A, "job_delete", job_id=job_id)
    assert deleted.status is ResultStatus.COMPLETED, deleted.error


async def test_a_stored_response_belongs_to_the_partition_that_made_it(
    call: Call, stores: Stores
) -> None:
    refused(await call(A, "responses", input="hi", conversation="no-prefix"))
    made = await call(A, "responses", input="hi", conversation=partition_prefix(A) + "c")
    assert made.status is ResultStatus.COMPLETED, made.error
    response_id = made.output["id"]
    key = response_owner_key(ENDPOINT_ID, response_id)
    assert await stores.client.get(key) == partition_prefix(A).encode()
    refused(await call(B, "response_delete", response_id=response_id))
    refused(await call(None, "response_get", response_id=response_id))
    unstored = await call(A, "responses", input="hi", store=False)
    assert unstored.status is ResultStatus.COMPLETED, unstored.error
    refused(await call(A, "response_get", response_id=unstored.output["id"]))
    own = await call(A, "response_get", response_id=response_id)
    assert own.status is ResultStatus.COMPLETED, own.error
    gone = await call(A, "response_delete", response_id=response_id)
    assert gone.status is ResultStatus.COMPLETED, gone.error
