"""Everything the demo runs, started on free loopback ports and torn down in one place.

NATS (JetStream, file storage) and Redis (AOF `always`, `noeviction`) are the test
harness's own server processes, so the demo runs exactly what the integration tests run.
Hermes is the project's fake (a subprocess) unless the user points at a real one. Workers
are `aip-hermes-worker run` subprocesses, so step (f) can `kill -9` one like a crash would.

Teardown is synchronous and idempotent: it runs from `finally` on a normal end, on Ctrl-C
(the event loop cancels the story) and on SIGTERM, and it only signals processes this
object started, by their pid. The server handles are also swept by the harness's `atexit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats

from subjects.grammar import Subjects
from subjects.provision import Change, provision
from subjects.streams import StreamPolicy
from worker.testing._procs import free_port
from worker.testing.echo_capability import EchoCapability
from worker.testing.identities import TrustFiles, authority_memberships, write_trust_files
from worker.testing.services import NatsServer, RedisServer
from worker.testing.workers import WorkerProcess

ENDPOINT = "hermes-1"
WORKER_IDS = ("demo-w1", "demo-w2")
#: Short enough that step (f)'s takeover is seconds away, long enough for a 2-core machine.
LEASE_TTL_MS = 3_000
_HERMES_START_S = 20.0
_WORKER_START_S = 30.0
#: The child capabilities step (g) delegates; the demo approver may approve them too.
DELEGATED_PREFIX = "cap:support_sandbox:"


class DemoError(Exception):
    """The root of the demo's exceptions; raised itself, a part of the demo environment
    could not start (the message says which and why)."""


#: The persisted Hermes session step h reads the delivered result back from.
DESK_SESSION = "aip-demo-desk"


@dataclass(frozen=True, slots=True)
class HermesTarget:
    """The Hermes the workers call: a URL and the file holding its API key."""

    url: str
    key_file: Path
    fake: bool


@dataclass
class DemoEnvironment:
    """The running pieces; `start()` builds them, `close()` removes them (safe to repeat)."""

    root: Path
    hermes_url: str | None = None
    hermes_key_file: Path | None = None
    nats: NatsServer | None = None
    redis: RedisServer | None = None
    hermes: HermesTarget | None = None
    trust: TrustFiles | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    subjects: Subjects = field(default_factory=Subjects)
    #: The AIP gateway process (`aip-hermes-worker gateway`) the fake Hermes calls `aip_call`
    #: on (step g); None with a real Hermes, which the demo cannot configure.
    gateway: WorkerProcess | None = None
    gateway_url: str | None = None
    #: The downstream capability the delegated child (`cap:support_sandbox:…`) runs on.
    echo: EchoCapability | None = None
    _mcp_token_file: Path | None = None
    _runtime_nc: Any = None
    _fake_proc: subprocess.Popen[bytes] | None = None
    _owns_root: bool = False

    @classmethod
    def create(
        cls, *, hermes_url: str | None = None, hermes_key_file: Path | None = None
    ) -> DemoEnvironment:
        root = Path(tempfile.mkdtemp(prefix="aip-hermes-demo-"))
        return cls(root=root, hermes_url=hermes_url, hermes_key_file=hermes_key_file,
                   _owns_root=True)

    # --- start ---------------------------------------------------------------------------

    async def start_services(self) -> None:
        """NATS and Redis side by side (each start blocks until the server answers)."""
        self.nats = NatsServer(root=self.root / "nats")
        self.redis = RedisServer(root=self.root / "redis")
        await asyncio.gather(
            asyncio.to_thread(self.nats.start), asyncio.to_thread(self.redis.start)
        )

    async def start_hermes(self) -> HermesTarget:
        if self.hermes_url is not None:
            if self.hermes_key_file is None:
                raise DemoError("--hermes needs --hermes-key-file (an owner-only key file)")
            self.hermes = HermesTarget(self.hermes_url.rstrip("/"), self.hermes_key_file, False)
            return self.hermes
        key_file = self.root / "hermes.key"
        key_file.write_text("demo-" + os.urandom(16).hex() + "\n", encoding="utf-8")
        os.chmod(key_file, 0o600)
        await asyncio.to_thread(self._spawn_fake, key_file)
        line = await asyncio.wait_for(
            asyncio.to_thread(self._read_fake_line), timeout=_HERMES_START_S
        )
        if not line.startswith("listening on "):
            raise DemoError(f"fake Hermes did not start: {line!r} (see {self.root})")
        self.hermes = HermesTarget(line.removeprefix("listening on ").strip(), key_file, True)
        return self.hermes

    async def start_aip_runtime(self) -> str:
        """The AIP gateway for the fake Hermes (`aip-hermes-worker gateway`, the production
        component): its MCP server, with a bearer token for the Hermes principal, and the
        runtime's queue and lifecycle streams; plus the echo capability its route for
        `cap:support_sandbox:` reaches."""
        from worker.testing.gateway import (
            gateway_env,
            gateway_process,
            hermes_principal_id,
            principal_entry,
            write_principals_file,
        )

        assert self.nats is not None
        assert self.trust is not None
        self._runtime_nc = await nats.connect(self.nats.url)
        self.echo = EchoCapability(self._runtime_nc)
        await self.echo.start()
        token = "demo-mcp-" + os.urandom(16).hex()
        token_file = self.root / "mcp.token"
        token_file.write_text(token + "\n", encoding="utf-8")
        os.chmod(token_file, 0o600)
        principals = write_principals_file(
            self.trust.directory, [principal_entry(token, hermes_principal_id(ENDPOINT))]
        )
        port = free_port()
        env = gateway_env(
            self.nats.url, principals, self.trust.seed_file, port,
            AIPD_CAPABILITY_ROUTES=json.dumps(self.echo.route), AIPD_LOG_FORMAT="json",
            # The echo capability answers unsigned: development only (docs/gateway.md).
            AIPD_ALLOW_UNSIGNED_RESPONSES="true",
        )  # fmt: skip
        self.gateway = gateway_process("gateway", env, self.root)
        await asyncio.to_thread(self.gateway.start, wait_ready_s=_HERMES_START_S)
        self.gateway_url = f"http://127.0.0.1:{port}/mcp"
        self._mcp_token_file = token_file
        return self.gateway_url

    async def stop_aip_runtime(self) -> None:
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.gateway.terminate, 10)
            self.gateway = None
        if self.echo is not None:
            with contextlib.suppress(Exception):
                await self.echo.stop()
        if self._runtime_nc is not None:
            with contextlib.suppress(Exception):
                await self._runtime_nc.close()
            self._runtime_nc = None

    def _spawn_fake(self, key_file: Path) -> None:
        mcp: list[str] = []
        if self.gateway_url is not None and self._mcp_token_file is not None:
            mcp = ["--mcp-url", self.gateway_url, "--mcp-token-file", str(self._mcp_token_file)]
        with (self.root / "fake-hermes.log").open("ab") as log:
            self._fake_proc = subprocess.Popen(
                [sys.executable, "-m", "worker.testing.fake_hermes", "--port", "0",
                 "--api-key-file", str(key_file), *mcp],
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )

    def _read_fake_line(self) -> str:
        assert self._fake_proc is not None
        assert self._fake_proc.stdout is not None
        return self._fake_proc.stdout.readline().decode("utf-8", errors="replace")

    def write_trust(self) -> TrustFiles:
        directory = self.root / "trust"
        directory.mkdir(mode=0o700)
        memberships = authority_memberships()
        for membership in memberships:
            membership["capability_prefixes"] = [
                *membership["capability_prefixes"], DELEGATED_PREFIX
            ]
        self.trust = write_trust_files(directory, memberships=memberships)
        return self.trust

    async def provision(self) -> list[str]:
        """Streams and consumers, as `aip-hermes-worker provision` creates them."""
        assert self.nats is not None
        nc = await nats.connect(self.nats.url)
        try:
            report = await provision(
                nc.jetstream(), self.subjects, [ENDPOINT],
                StreamPolicy(ack_wait_s=LEASE_TTL_MS / 1000),
            )
        finally:
            await nc.close()
        conflicts = [item.name for item in report if item.change is Change.CONFLICT]
        if conflicts:
            raise DemoError(f"provisioning conflicts: {', '.join(conflicts)}")
        return [f"{item.kind} {item.name}" for item in report]

    def worker_env(self) -> dict[str, str]:
        assert self.nats
        assert self.redis
        assert self.hermes
        assert self.trust
        return {
            "AIPD_NATS_URL": self.nats.url,
            "AIPD_REDIS_URL": self.redis.url,
            "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={self.hermes.url}",
            "AIPD_HERMES_API_KEY_FILE": str(self.hermes.key_file),
            "AIPD_LEASE_TTL_MS": str(LEASE_TTL_MS),
            "AIPD_NAK_DELAY_MS": "200",
            "AIPD_SHUTDOWN_GRACE_S": "3",
            "AIPD_CONCURRENCY": "16",
            "AIPD_LOG_FORMAT": "json",
            "AIPD_HERMES_OPERATOR_DELEGATION_ENABLED": "true",
            "AIPD_HERMES_OPERATOR_CAPABILITY_PREFIXES": DELEGATED_PREFIX,
            "AIPD_HERMES_OPERATOR_SCOPE_PREFIXES": "support.",
            **self.trust.environment(),
        }

    async def open_desk_session(self) -> Path:
        """The persisted Hermes session results are delivered into (channel egress), and the
        rule file that sends step a's `models` result there (docs/channels.md)."""
        assert self.hermes
        key = self.hermes.key_file.read_text(encoding="utf-8").strip()
        async with httpx.AsyncClient(
            base_url=self.hermes.url, headers={"Authorization": f"Bearer {key}"}, timeout=30.0
        ) as http:
            answer = await http.post("/api/sessions", json={"id": DESK_SESSION})
        if answer.status_code not in (201, 409):  # 409: kept from an earlier run
            raise DemoError(f"cannot create the demo session: HTTP {answer.status_code}")
        rules = self.root / "channel-egress.json"
        rules.write_text(
            json.dumps([{
                "id": "demo-desk",
                "match": {"capability_prefix": f"cap:hermes_agent:{ENDPOINT}:models",
                          "sources": ["result"]},
                "session_id": DESK_SESSION,
            }]),
            encoding="utf-8",
        )
        rules.chmod(0o600)
        return rules

    async def start_workers(self) -> list[WorkerProcess]:
        """Both workers at once; each is ready when it logged its consumer binding."""
        rules = await self.open_desk_session()
        base = {**self.worker_env(), "AIPD_CHANNEL_EGRESS_FILE": str(rules)}
        for worker_id in WORKER_IDS:
            port = free_port()
            self.metrics_ports[worker_id] = port
            env = {**base, "AIPD_METRICS_HOST": "127.0.0.1", "AIPD_METRICS_PORT": str(port)}
            self.workers.append(WorkerProcess(worker_id=worker_id, env=env, log_dir=self.root))
        await asyncio.gather(
            *(asyncio.to_thread(w.start, wait_ready_s=_WORKER_START_S) for w in self.workers)
        )
        return self.workers

    def worker(self, worker_id: str) -> WorkerProcess | None:
        return next((w for w in self.workers if w.worker_id == worker_id), None)

    def urls(self) -> Mapping[str, str]:
        """What `--keep` prints: where everything listens."""
        found: dict[str, str] = {"logs and trust files": str(self.root)}
        if self.nats is not None:
            found["nats"] = self.nats.url
            found["nats monitoring"] = self.nats.monitor_url
        if self.redis is not None:
            found["redis"] = self.redis.url
        if self.hermes is not None:
            found["hermes"] = self.hermes.url
        if self.gateway_url is not None and self.gateway is not None:
            found["aip gateway (MCP)"] = self.gateway_url
            found["aip gateway health"] = self.gateway_url.removesuffix("/mcp") + "/ready"
        for worker in self.workers:
            if worker.alive:
                port = self.metrics_ports[worker.worker_id]
                found[worker.worker_id] = f"http://127.0.0.1:{port}/ready (and /metrics)"
        return found

    # --- teardown ------------------------------------------------------------------------

    def close(self, *, keep_files: bool = False) -> None:
        """Stop every process this demo started, then remove its directory."""
        for worker in self.workers:
            if worker.alive:
                with contextlib.suppress(Exception):
                    worker.terminate(timeout_s=5.0)
        self.workers.clear()
        if self._fake_proc is not None:
            _end(self._fake_proc)
            self._fake_proc = None
        for server in (self.nats, self.redis):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.close()
        self.nats = self.redis = None
        if self._owns_root and not keep_files:
            shutil.rmtree(self.root, ignore_errors=True)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 5 s; the pid is ours, so nothing else is signalled."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()
