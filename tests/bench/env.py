"""The servers one benchmark session shares, and the processes each measurement starts.

One NATS, one Redis and one zero-latency fake Hermes serve the whole session; between
measurements they are wiped (streams deleted, FLUSHALL, stats reset, fake runs forgotten)
instead of restarted, so every system meets the same warm servers. Workers of every kind are
separate processes: their CPU is read from the kernel (getrusage through psutil), never
estimated, and a kill -9 is a real one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aredis
from nats.js.errors import NotFoundError

from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.bench import require
from worker.testing.fake_hermes import FakeHermesControl
from worker.testing.identities import TrustFiles, write_trust_files
from worker.testing.services import NatsServer, RedisServer

require("psutil")
import psutil  # noqa: E402  (after the check, so a missing extra says how to install it)

ENDPOINT = "h1"
#: The repository root: workers run `python -m tests.bench.…` from here.
REPO = Path(__file__).resolve().parents[2]
#: Commands the bench itself sends while measuring; never counted as a worker's.
_OWN_COMMANDS = frozenset({"info", "config|resetstat", "flushall", "ping", "client|setname"})


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def cpu_s_of(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` so far (0 without one)."""
    return 0.0 if pid is None else _cpu_s(psutil.Process(pid))


def _unused_log_path(log_dir: Path, name: str) -> Path:
    """`name.log`, or `name.2.log`, `name.3.log`, … for the next process of that name: every
    round of a figure starts its worker under the same name, and a log written over by the
    next round loses what the round of interest showed (a lease loss, a stall)."""
    path = log_dir / f"{name}.log"
    number = 1
    while path.exists():
        number += 1
        path = log_dir / f"{name}.{number}.log"
    return path


class Proc:
    """One child process with its own log, measured by the kernel's CPU accounting."""

    def __init__(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str], log_dir: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **env}
        self.log_path = _unused_log_path(log_dir, name)
        self.popen: subprocess.Popen[bytes] | None = None
        self._ps: psutil.Process | None = None

    def start(self) -> Proc:
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._ps = psutil.Process(self.popen.pid)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def cpu_s(self) -> float:
        """User + system CPU seconds of this process so far (0 once it is gone)."""
        if self._ps is None:
            return 0.0
        try:
            return _cpu_s(self._ps)
        except psutil.Error:
            return 0.0

    def rss_mb(self) -> float:
        assert self._ps is not None
        return float(self._ps.memory_info().rss) / 2**20

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, mark: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while mark not in self.log_text():
            if not self.alive:
                raise RuntimeError(f"{self.name} exited:\n{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready:\n{self.log_text()[-3000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """kill -9: no cleanup, no release, no ack."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
            assert self.popen is not None
            self.popen.wait(10)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.popen is None or not self.alive:
            return
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Bench:
    """The shared servers of one benchmark session, plus helpers to wipe and read them."""

    root: Path
    nats_server: NatsServer
    redis_server: RedisServer
    fake: Proc
    fake_url: str
    api_key: str
    key_file: Path
    trust: TrustFiles
    subjects: Subjects = field(default_factory=Subjects)
    procs: list[Proc] = field(default_factory=list)

    @classmethod
    def start(cls, parent: Path | None = None) -> Bench:
        """Start the servers in a fresh directory (kept afterwards: it holds every log)."""
        root = Path(tempfile.mkdtemp(prefix="aip-bench-", dir=parent))
        nats_server = NatsServer(root=root / "nats")
        nats_server.start()
        # AOF with a once-a-second fsync, as a production Redis would run; `always` would
        # measure the disk, not the clients.
        redis_server = RedisServer(root=root / "redis", appendfsync="everysec")
        redis_server.start()
        api_key = "bench-" + secrets.token_hex(16)
        key_file = root / "hermes.key"
        key_file.write_text(api_key)
        os.chmod(key_file, 0o600)
        trust_dir = root / "trust"
        trust_dir.mkdir(exist_ok=True)
        trust = write_trust_files(trust_dir)
        fake = Proc(
            "fake-hermes",
            [sys.executable, "-m", "tests.bench.fake_server", "--port", "0",
             "--api-key-file", str(key_file)],
            env={},
            log_dir=root,
        ).start()
        fake.wait_for_log("listening on", 20.0)
        url = fake.log_text().split("listening on", 1)[1].split()[0]
        return cls(root, nats_server, redis_server, fake, url, api_key, key_file, trust)

    @property
    def nats_url(self) -> str:
        return self.nats_server.url

    @property
    def redis_url(self) -> str:
        return self.redis_server.url

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.fake.stop(5)
        self.nats_server.close()
        self.redis_server.close()

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> Proc:
        proc = Proc(name, argv, env=env, log_dir=self.root).start()
        self.procs.append(proc)
        return proc

    def reap(self, timeout_s: float = 10.0) -> None:
        """Stop every worker a measurement left behind."""
        for proc in self.procs:
            proc.stop(timeout_s)
        self.procs.clear()

    def worker_env(self, **extra: str) -> dict[str, str]:
        """`AIPD_*` settings of our worker against this session's servers."""
        return {
            "AIPD_NATS_URL": self.nats_url,
            "AIPD_REDIS_URL": self.redis_url,
            "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={self.fake_url}",
            "AIPD_HERMES_API_KEY_FILE": str(self.key_file),
            "AIPD_LOG_FORMAT": "json",
            "AIPD_LOG_LEVEL": "info",
            **self.trust.environment(),
            **extra,
        }

    # --- wiping between measurements -------------------------------------------------

    async def wipe(
        self, *, ack_wait_s: float = 30.0, endpoints: Sequence[str] = (ENDPOINT,)
    ) -> None:
        """Empty every stream, key and counter so the next measurement starts from zero."""
        nc = await nats.connect(self.nats_url)
        try:
            js = nc.jetstream()
            for stream in await js.streams_info():
                with contextlib.suppress(NotFoundError):
                    await js.delete_stream(stream.config.name)
            await provision(
                js, self.subjects, list(endpoints),
                StreamPolicy(ack_wait_s=ack_wait_s, max_ack_pending=100_000),
            )
        finally:
            await nc.close()
        r = self.redis()
        try:
            await r.flushall()
            await r.config_resetstat()
        finally:
            await r.aclose()
        async with FakeHermesControl(self.fake_url) as control:
            await control.restart()
            await control.reset()

    def redis(self) -> Any:
        return aredis.from_url(self.redis_url)

    async def redis_executed(self) -> int:
        """Commands Redis executed since the last reset (scripts included), not the bench's."""
        r = self.redis()
        try:
            stats = await r.info("commandstats")
        finally:
            await r.aclose()
        total = 0
        for name, value in stats.items():
            command = name.removeprefix("cmdstat_")
            if command not in _OWN_COMMANDS:
                total += int(value["calls"])
        return total

    async def http_counts(self) -> dict[str, int]:
        async with FakeHermesControl(self.fake_url) as control:
            snapshot = await control.stats()
        return dict(snapshot.routes)
