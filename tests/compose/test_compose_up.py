"""The compose deployment, started for real: build, up, serve, lose a worker, restart Redis,
tear down.

This is the one test that runs the shipped files exactly as a user would (`compose/`, the
worker image from this checkout, NATS with its nkey users, Redis with AOF and its ACL users,
three workers, the gateway, the real Hermes 0.19 image with its mounted config, provisioning,
and the `dev` profile's fake LLM and fake Hermes). It publishes signed Actions through the
published NATS port and reads their results; calls `aip_call` on the gateway service as the
hermes-1 principal and gets the child a worker ran; has the real Hermes discover and call a
capability through the gateway with the token of its secret file; kills the worker container
holding a slow Action and sees another worker finish it; restarts the Redis container mid-run
and finds every stored result still there; and leaves nothing behind.

The workers' hermes-1 is the fake Hermes (`AIP_HERMES_1_URL`): a slow Action that another
worker can safely finish must be a read, and only the fake can be told to answer one slowly.
It needs a Docker engine (see `require_engine` for when it skips or fails).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS

from schemas.action import Action
from schemas.ids import new_action_id
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import Subjects
from tests.compose.deployment import COMPOSE, Deployment, compose_command
from worker.bus.stream_reads import drain
from worker.client import AipClient
from worker.gateway.service import namespaced_action_id
from worker.store.keys import ActionKeys
from worker.testing._procs import free_ports
from worker.testing.fake_hermes import FakeHermesControl, RouteDelay
from worker.testing.gateway import call_tool, hermes_principal_id
from worker.testing.pytest_plugin import require_engine, service_unavailable
from worker.testing.scenario import AIP_DISCOVER_CALL
from worker.wire.results import decode_result

ENDPOINT = "hermes-1"
#: The route the slow Actions call. Not `GET /v1/models`: every worker's readiness probe
#: sends that one, and a probe could use up a delay meant for an Action.
SKILLS = "GET /v1/skills"
#: A user of compose/config/identities.json without a tenant.
PRINCIPAL = "user:demo"
REVISION = 3
ISSUER = "https://idp.example.test"
WORKERS = 3
#: The capability the gateway calls dispatch: a read of hermes-1 that the workers' readiness
#: probes never send, so the fake Hermes' count of it is the children's alone.
CHILD = f"cap:hermes_agent:{ENDPOINT}:skills"
RUN_TIMEOUT_S = 120.0

pytestmark = [pytest.mark.timeout(900), pytest.mark.containers]


@pytest.fixture
def deployment() -> Iterator[Deployment]:
    require_engine()
    compose = compose_command()
    if compose is None:
        service_unavailable("neither `docker compose` nor `docker-compose` is installed")
    nats_port, gateway_port, hermes_port, fake_hermes_port = free_ports(4)
    deployment = Deployment(
        compose, nats_port=nats_port, gateway_port=gateway_port, hermes_port=hermes_port,
        fake_hermes_port=fake_hermes_port,
    )  # fmt: skip
    started = time.monotonic()
    try:
        built_s = deployment.up()
        deployment.wait_healthy("worker", WORKERS)
        # The real Hermes starts once the gateway is healthy (it lists MCP tools at start).
        deployment.wait_healthy("hermes", 1)
        print(
            f"compose: images built in {built_s:.0f}s,"
            f" deployment healthy {time.monotonic() - started - built_s:.0f}s later"
        )
        yield deployment
    finally:
        stopping = time.monotonic()
        deployment.down()
        print(f"compose: down in {time.monotonic() - stopping:.0f}s")
        leftovers = deployment.leftovers()
        assert not leftovers, f"compose down left {leftovers}"


@pytest.fixture
async def gateway(deployment: Deployment) -> AsyncIterator[AipClient]:
    """The publisher's side: the gateway nkey user, signing with the gateway's seed."""
    nc = await nats.connect(
        deployment.nats_url,
        nkeys_seed=str(COMPOSE / "secrets" / "nats_gateway.nk"),
        inbox_prefix="_INBOX_gateway",  # the only inboxes the gateway user may read
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
    )
    try:
        yield AipClient(nc, sign_key=COMPOSE / "secrets" / "gateway_signing.nk")
    finally:
        await nc.close()


def _read(client: AipClient, operation: str = "models") -> Action:
    return client.build_action(
        endpoint_id=ENDPOINT, operation=operation, input={}, principal_id=PRINCIPAL,
        credential_revision=REVISION, authentication_issuer=ISSUER,
    )  # fmt: skip


async def _results(nc: NATS, action_id: str) -> list[ActionResult]:
    """Every result message the results stream holds for `action_id`."""
    subject = Subjects().results(ENDPOINT, action_id)
    # Message gets: the gateway user may create no consumer (compose/nats/nats.conf).
    stored = await drain(nc.jetstream(), Subjects().stream_name("results"), subject)
    return [decode_result(msg.data or b"")[0] for msg in stored]


async def _lease_owner(deployment: Deployment, action_id: str, timeout_s: float = 30.0) -> str:
    """The worker id holding the Action's lease, read from Redis as the `admin` user."""
    key = ActionKeys.of(action_id).lease
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        owner = await asyncio.to_thread(deployment.redis_cli, "HGET", key, "owner")
        if owner:
            return owner.split("#", 1)[0]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no worker took {action_id} within {timeout_s:.0f}s")


def _uids(deployment: Deployment, service: str) -> set[str]:
    """The user ids of the service's processes: each container's main process and all it
    started. (Not Docker's healthcheck probes, which `docker exec` runs beside them.)"""
    found: set[str] = set()
    for container in deployment.containers(service):
        state = deployment.inspect(container)["State"]
        assert isinstance(state, dict)
        rows = deployment.docker("top", container, "-eo", "uid,pid,ppid").splitlines()[1:]
        processes = [row.split() for row in rows]
        tree = {str(state["Pid"])}
        grown = True
        while grown:
            before = len(tree)
            tree |= {pid for _, pid, ppid in processes if ppid in tree}
            grown = len(tree) > before
        found |= {uid for uid, pid, _ in processes if pid in tree}
    return found


async def _child_reads(control: FakeHermesControl) -> int:
    return (await control.stats()).count(SKILLS)


async def _run_on_real_hermes(deployment: Deployment, text: str) -> dict[str, Any]:
    """Start a run on the `hermes` service with the compose key; its terminal status."""
    key = (COMPOSE / "secrets" / "hermes_api_key").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=deployment.hermes_url, headers=headers, timeout=30.0
    ) as http:
        started = await http.post("/v1/runs", json={"input": text})
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            status: dict[str, Any] = (await http.get(f"/v1/runs/{run_id}")).json()
            if status.get("status") in ("completed", "failed", "cancelled"):
                return status
            if time.monotonic() > deadline:
                await http.post(f"/v1/runs/{run_id}/stop")
                raise AssertionError(f"run {run_id} not over in {RUN_TIMEOUT_S:.0f}s: {status}")
            await asyncio.sleep(0.2)


async def test_the_deployment_serves_and_survives_a_killed_worker_and_a_redis_restart(
    deployment: Deployment, gateway: AipClient
) -> None:
    async with FakeHermesControl(deployment.fake_hermes_url) as control:
        await _serve_lose_a_worker_restart_redis(deployment, gateway, control)


async def _serve_lose_a_worker_restart_redis(
    deployment: Deployment, gateway: AipClient, control: FakeHermesControl
) -> None:
    workers = deployment.containers("worker")
    # The images run every worker process as the unprivileged `aip` user (uid 10001), and
    # Hermes as `hermes` (uid 10002).
    assert _uids(deployment, "worker") == {"10001"}
    assert _uids(deployment, "gateway") == {"10001"}
    assert _uids(deployment, "hermes") == {"10002"}

    # 1. A signed Action through the published port: one completed result.
    first = _read(gateway)
    result = await (await gateway.publish(first)).result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error

    # 2. The gateway service: `aip_call` as the hermes-1 principal runs the child on a
    # worker, once, and answers with its native result.
    token = (COMPOSE / "secrets" / "mcp_token_hermes-1").read_text().strip()
    reads = await _child_reads(control)
    arguments = {
        "action_id": new_action_id(),
        "capability_id": CHILD,
        "input": {},
        "mode": "sync",
        "timeout_ms": 60_000,
    }
    answer = await call_tool(deployment.mcp_url, token, "aip_call", arguments)
    assert not answer.is_error, answer.document
    assert answer.aip["status"] == "completed", answer.aip
    # On the bus the child's id is the caller's, namespaced to its principal.
    child_id = namespaced_action_id(hermes_principal_id(ENDPOINT), None, arguments["action_id"])
    child = await gateway.handle(ENDPOINT, child_id).result(timeout_s=10)
    assert child.status is ResultStatus.COMPLETED
    assert any(child.settled_by.startswith(deployment.hostname(c)) for c in workers)
    assert await _child_reads(control) == reads + 1

    # 3. The real Hermes: its model (the fake LLM) lists the AIP capabilities and calls one
    # through the gateway, authenticated by the token its entrypoint rendered from the secret.
    started = time.monotonic()
    run = await _run_on_real_hermes(deployment, f"{AIP_DISCOVER_CALL}{CHILD} please")
    print(f"compose: the real Hermes' run via the gateway took {time.monotonic() - started:.1f}s")
    assert run["status"] == "completed", run
    called = f"I called {CHILD} through aip_call"
    assert called in run["output"], f"{run['output']}\nhermes log:\n{deployment.logs('hermes')}"
    # The child the run made: the last queue entry (its id on the bus). The reference facade
    # answers a settled aip_call with the output, so the model's prose names no id.
    last = await gateway.nc.jetstream().get_last_msg(
        Subjects().runtime_stream_name("queue"), "aip.runtime.queue.>"
    )
    found = msgspec.json.decode(last.data or b"")["body"]["action_status"]["action_id"]
    # The child is the hermes-1 principal's: only its owner may read its result.
    owned = await call_tool(deployment.mcp_url, token, "aip_action_result", {"action_id": found})
    assert not owned.is_error, owned.document
    assert owned.body["status"] == "completed", owned.document
    assert await _child_reads(control) == reads + 2

    # 4. The worker holding a slow Action is killed; another one finishes it, once.
    await control.add_faults(RouteDelay(route=SKILLS, delay_s=120, times=1))
    slow = _read(gateway, "skills")
    handle = await gateway.publish(slow)
    holder = await _lease_owner(deployment, slow.id)
    (victim,) = [c for c in workers if holder.startswith(deployment.hostname(c) + "-")]
    deployment.docker("kill", victim)
    taken_over = await handle.result(timeout_s=120)
    assert taken_over.status is ResultStatus.COMPLETED, taken_over.error
    assert not taken_over.settled_by.startswith(holder), (taken_over.settled_by, holder)
    assert taken_over.fence >= 2
    state = deployment.inspect(victim)["State"]
    assert isinstance(state, dict)
    assert state["Running"] is False

    # 5. Redis restarts while an Action runs: it completes, and nothing stored is lost.
    await control.add_faults(RouteDelay(route=SKILLS, delay_s=8, times=1))
    during = _read(gateway, "skills")
    handle = await gateway.publish(during)
    await _lease_owner(deployment, during.id, timeout_s=60)
    deployment.run("restart", "redis", timeout_s=120)
    assert (await handle.result(timeout_s=120)).status is ResultStatus.COMPLETED
    for action in (first, slow, during):
        key = ActionKeys.of(action.id).result
        assert deployment.redis_cli("EXISTS", key) == "1", f"{key} lost by the restart"
    after = await (await gateway.publish(_read(gateway))).result(timeout_s=60)
    assert after.status is ResultStatus.COMPLETED, after.error

    # Exactly one result message per Action on the stream.
    for action in (first, slow, during):
        assert len(await _results(gateway.nc, action.id)) == 1, action.id
