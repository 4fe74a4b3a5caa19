"""Worker processes for tests: real `python -m worker run` subprocesses a test can kill
(and gateway processes, `python -m worker gateway`, the same way).

Chaos tests need a worker that dies like a production one (kill -9, SIGSTOP, a fault point
that calls `os._exit`), so workers under test are never threads or in-process tasks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

READY_MARK = "bound to consumer"


class WorkerProcess:
    """One `aip-hermes-worker run` process with its own log file."""

    def __init__(
        self,
        *,
        worker_id: str,
        env: Mapping[str, str],
        log_dir: Path,
        fault_points: str | None = None,
        command: Sequence[str] = ("run",),
        ready_mark: str = READY_MARK,
        module: str = "worker",
    ) -> None:
        self.worker_id = worker_id
        #: The module `python -m` runs: `worker`, or a harness entry that wraps it (the
        #: chaos campaign's `tests.chaos.launcher`, which adds clock skew and mutations).
        self.module = module
        #: The `python -m worker` subcommand: `run` for a worker, `gateway` for the gateway.
        self.command = tuple(command)
        self.ready_mark = ready_mark
        self.env = dict(env)
        self.env["AIPD_WORKER_ID"] = worker_id
        self.env.setdefault("AIPD_LOG_FORMAT", "json")
        if fault_points:
            self.env["AIPD_FAULT_POINTS"] = fault_points
        self.log_path = log_dir / f"{worker_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ready_s: float = 20.0) -> WorkerProcess:
        log = self.log_path.open("ab")
        full_env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.command],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        if wait_ready_s:
            self.wait_ready(wait_ready_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready_mark in self.log_text():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.worker_id} exited:\n{self.log_tail()}")
            time.sleep(0.05)
        raise TimeoutError(f"worker {self.worker_id} not ready in {timeout_s}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no cleanup, no lease release, no ack."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
            assert self.proc is not None
            self.proc.wait(5)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait for the graceful drain; returns the exit code."""
        if self.proc is None:
            return 0
        if self.alive:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            return self.proc.wait(5)

    def wait_exit(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])
