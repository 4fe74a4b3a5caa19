"""A whole two-instance deployment on this machine, driven through the qualification list.

    python -m worker.testing.qualify_local --record docs/qualification/

starts NATS (JetStream) and Redis (AOF `always`), the AIP gateway (`aip-hermes-worker
gateway`, a process), two real `hermes-agent==0.19.0` API servers (each its own home, API
key, fake LLM and MCP token, so each calls the gateway as its own principal
`agent:hermes_operator:hermes-N`), one worker process per instance, and the driver's broken
endpoint; then runs `worker.qualify.driver` with a `ProcessControl` over those processes,
writes the record and stops everything it started (by pid, never by name).

It lives in `worker.testing` because it is built from the harness (servers, trust files, the
real Hermes with the fake LLM, worker processes: the `testing` extra); the driver it runs,
`worker.qualify`, is production code and imports nothing from here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nats

from schemas.ids import new_action_id
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from worker.qualify.broken import BrokenHermes
from worker.qualify.deployment import Deployment
from worker.qualify.driver import Report, drive
from worker.qualify.items import Broken, Context
from worker.qualify.settings import QualifySettings
from worker.settings import Settings
from worker.testing._procs import free_port
from worker.testing.gateway import (
    gateway_env,
    gateway_process,
    hermes_principal_id,
    hermes_trust,
    principal_entry,
    write_principals_file,
)
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    ISSUER,
    REVISION,
    USER_UNTENANTED,
    TrustFiles,
    write_api_key_file,
)
from worker.testing.real_hermes import RealHermes
from worker.testing.services import NatsServer, RedisServer, ServiceHandle
from worker.testing.workers import WorkerProcess

ENDPOINTS = ("hermes-1", "hermes-2")
BROKEN = "broken"
#: The principal of the driver's own MCP token (reads only: capabilities, its own Actions).
DRIVER_PRINCIPAL = "agent:qualify-driver"
#: Short, so takeovers (items 3 and 7) happen in seconds; long enough for a 2-core machine.
LEASE_TTL_MS = 3_000
WORKER_START_S = 30.0
TOPOLOGY = (
    "local: 1 nats-server (JetStream, file storage), 1 Redis (AOF always), 1 AIP gateway "
    "process, 2 real hermes-agent 0.19.0 API servers driven by the project's fake LLM (each "
    "its own HERMES_HOME, API key and MCP token), 1 worker process per instance (w-hermes-1 "
    "also serves the driver's broken endpoint), all on loopback"
)


def _secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


@dataclass
class LocalControl:
    """The `ProcessControl` of a local deployment: its workers by endpoint, and Redis."""

    root: Path
    redis: ServiceHandle
    envs: dict[str, dict[str, str]]
    #: (endpoint, fault point) -> the Action id it is armed for.
    faults: dict[tuple[str, str], str]
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    #: What `python -m` runs for a worker: `worker`, or a test-tree wrapper of it (the
    #: mutation test of item 5 plants a bug through `tests.chaos.launcher`).
    module: str = "worker"
    _starts: int = 0

    def armed_fault(self, endpoint_id: str, point: str) -> str | None:
        return self.faults.get((endpoint_id, point))

    async def wait_worker_exit(self, endpoint_id: str) -> None:
        await asyncio.to_thread(self.workers[endpoint_id].wait_exit, 60.0)

    async def kill_worker(self, endpoint_id: str) -> None:
        await asyncio.to_thread(self.workers[endpoint_id].kill)

    async def start_worker(self, endpoint_id: str, *, fault_points: str | None = None) -> None:
        old = self.workers.get(endpoint_id)
        if old is not None and old.alive:
            await asyncio.to_thread(old.kill)
        self._starts += 1
        if fault_points is None:  # what was armed in the old process is gone with it
            self.faults = {key: id_ for key, id_ in self.faults.items() if key[0] != endpoint_id}
        worker = WorkerProcess(
            worker_id=f"w-{endpoint_id}-{self._starts}",
            env=self.envs[endpoint_id],
            log_dir=self.root,
            fault_points=fault_points,
            module=self.module,
        )
        self.workers[endpoint_id] = worker
        await asyncio.to_thread(worker.start, wait_ready_s=WORKER_START_S)

    async def restart_redis(self) -> None:
        await asyncio.to_thread(self.redis.restart)

    def stop(self) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(Exception):
                worker.resume()
                worker.kill()


@dataclass
class Local:
    """A running local deployment: what the driver needs to drive it."""

    ctx: Context
    control: LocalControl


def worker_env(
    nats_url: str,
    redis_url: str,
    trust: TrustFiles,
    endpoints: Mapping[str, tuple[str, Path]],
) -> dict[str, str]:
    """A worker serving `endpoints` (id -> (url, key file)), delegation on for children on
    any Hermes endpoint, bounds short enough for a qualification run."""
    return {
        "AIPD_NATS_URL": nats_url,
        "AIPD_REDIS_URL": redis_url,
        "AIPD_HERMES_ENDPOINTS": ",".join(f"{e}={url}" for e, (url, _) in endpoints.items()),
        "AIPD_HERMES_API_KEY_FILES": ",".join(f"{e}={key}" for e, (_, key) in endpoints.items()),
        "AIPD_LEASE_TTL_MS": str(LEASE_TTL_MS),
        "AIPD_NAK_DELAY_MS": "200",
        "AIPD_SHUTDOWN_GRACE_S": "3",
        "AIPD_LOG_FORMAT": "json",
        "AIPD_HERMES_OPERATOR_DELEGATION_ENABLED": "true",
        "AIPD_HERMES_OPERATOR_CAPABILITY_PREFIXES": "cap:hermes_agent:",
        "AIPD_HERMES_OPERATOR_SCOPE_PREFIXES": "support.",
        "AIPD_HERMES_OPERATOR_POLL_INTERVAL_MS": "100",
        "AIPD_HERMES_OPERATOR_CANCEL_GRACE_MS": "1000",
        **trust.environment(),
    }


@contextlib.asynccontextmanager
async def local_deployment(
    root: Path,
    *,
    nats_server: ServiceHandle | None = None,
    redis: ServiceHandle | None = None,
    worker_module: str = "worker",
    worker_extra_env: Mapping[str, str] | None = None,
) -> AsyncIterator[Local]:
    """Start everything (reusing `nats_server`/`redis` when given: tests own theirs), yield
    the driver's context and control, stop everything on exit. `worker_module` and
    `worker_extra_env` change how the workers are started (a test's planted bug)."""
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as exits:
        if nats_server is None or redis is None:
            started_nats = NatsServer(root=root / "nats")
            started_redis = RedisServer(root=root / "redis")
            await asyncio.gather(
                asyncio.to_thread(started_nats.start), asyncio.to_thread(started_redis.start)
            )
            exits.callback(started_nats.close)
            exits.callback(started_redis.close)
            nats_server, redis = started_nats, started_redis
        trust = hermes_trust(root / "trust", ENDPOINTS)
        nc = await nats.connect(nats_server.url)
        exits.push_async_callback(nc.close)
        await provision(
            nc.jetstream(),
            Subjects(),
            [*ENDPOINTS, BROKEN],
            StreamPolicy(ack_wait_s=LEASE_TTL_MS / 1000),
            runtime_stores=True,
        )
        tokens = {key: "mcp-" + secrets.token_hex(16) for key in (*ENDPOINTS, "driver")}
        principals = [principal_entry(tokens[e], hermes_principal_id(e)) for e in ENDPOINTS] + [
            principal_entry(tokens["driver"], DRIVER_PRINCIPAL)
        ]
        principals_file = write_principals_file(trust.directory, principals)
        port = free_port()
        gateway = gateway_process(
            "gateway",
            gateway_env(
                nats_server.url,
                principals_file,
                trust.seed_file,
                port,
                # Children are worker Actions: their results count only when signed.
                AIPD_TRUSTED_WORKER_KEYS_FILE=str(trust.worker_keys_file),
            ),
            root,
        )
        await asyncio.to_thread(gateway.start, wait_ready_s=WORKER_START_S)
        exits.callback(gateway.kill)
        gateway_url = f"http://127.0.0.1:{port}/mcp"
        hermes: dict[str, RealHermes] = {}
        keys: dict[str, Path] = {}
        for endpoint_id in ENDPOINTS:
            api_key, keys[endpoint_id] = write_api_key_file(root, f"{endpoint_id}.key")
            hermes[endpoint_id] = RealHermes(
                root / endpoint_id,
                api_key=api_key,
                mcp_servers={"aip": (gateway_url, tokens[endpoint_id])},
            )
        # Both at once: each installs nothing (the venv is cached) and waits for its /health.
        await asyncio.gather(*(exits.enter_async_context(h) for h in hermes.values()))
        broken_server = BrokenHermes()
        broken_port = free_port()
        await broken_server.start("127.0.0.1", broken_port)
        exits.push_async_callback(broken_server.close)
        _, keys[BROKEN] = write_api_key_file(root, f"{BROKEN}.key")
        urls = {e: hermes[e].url for e in ENDPOINTS} | {BROKEN: f"http://127.0.0.1:{broken_port}"}
        fault_id = new_action_id()
        extra = dict(worker_extra_env or {})
        control = LocalControl(
            root=root,
            redis=redis,
            envs={
                "hermes-1": worker_env(
                    nats_server.url,
                    redis.url,
                    trust,
                    {e: (urls[e], keys[e]) for e in ("hermes-1", BROKEN)},
                )
                | extra,
                "hermes-2": worker_env(
                    nats_server.url,
                    redis.url,
                    trust,
                    {"hermes-2": (urls["hermes-2"], keys["hermes-2"])},
                )
                | extra,
            },
            faults={("hermes-1", "after_post_run"): fault_id},
            module=worker_module,
        )
        exits.callback(control.stop)
        await asyncio.gather(
            control.start_worker("hermes-1", fault_points=f"after_post_run=exit@{fault_id}"),
            control.start_worker("hermes-2"),
        )
        settings = Settings(
            nats_url=nats_server.url,
            redis_url=redis.url,
            hermes_endpoints=",".join(f"{e}={urls[e]}" for e in ENDPOINTS),
            hermes_api_key_files=",".join(f"{e}={keys[e]}" for e in ENDPOINTS),
            hermes_operator_delegation_enabled=True,
            hermes_operator_capability_prefixes="cap:hermes_agent:",
            hermes_operator_scope_prefixes="support.",
            **trust.settings_overrides(),
        )
        qualify = QualifySettings(
            gateway_signing_key_file=trust.seed_file,
            trusted_worker_keys_file=trust.worker_keys_file,
            qualify_gateway_url=gateway_url,
            mcp_access_token_file=_secret_file(root / "driver-mcp.token", tokens["driver"]),
            qualify_principal_id=USER_UNTENANTED,
            qualify_issuer=ISSUER,
            qualify_revision=REVISION,
            qualify_approver_id=APPROVER_UNTENANTED,
            qualify_approver_key_file=trust.approver_seed_files[APPROVER_UNTENANTED],
            qualify_delegation_scope="support.read",
            qualify_timeout_s=60.0,
        )
        deployment = await Deployment.connect(settings, qualify)
        exits.push_async_callback(deployment.close)
        ctx = Context(
            deployment,
            list(ENDPOINTS),
            control=control,
            broken=Broken(BROKEN, broken_server),
        )
        yield Local(ctx, control)


async def qualify_locally(
    root: Path,
    record: Path | None,
    *,
    nats_server: ServiceHandle | None = None,
    redis: ServiceHandle | None = None,
    only: tuple[int, ...] = (),
    worker_module: str = "worker",
    worker_extra_env: Mapping[str, str] | None = None,
) -> Report:
    async with local_deployment(
        root,
        nats_server=nats_server,
        redis=redis,
        worker_module=worker_module,
        worker_extra_env=worker_extra_env,
    ) as local:
        return await drive(local.ctx, record_path=record, topology=TOPOLOGY, only=only)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.testing.qualify_local",
        description="Start two real Hermes 0.19.0 and a whole deployment here; qualify it.",
    )
    parser.add_argument("--record", type=Path, help="directory (or file) for the record")
    parser.add_argument("--item", type=int, action="append", help="run only this item")
    parser.add_argument("--keep", action="store_true", help="keep the logs directory")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="aip-qualify-"))
    try:
        report = asyncio.run(qualify_locally(root, args.record, only=tuple(args.item or ())))
    finally:
        if args.keep:
            print(f"logs: {root}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
