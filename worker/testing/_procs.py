"""Owning a server process: ports, process group, log file, signals, cleanup.

Chaos tests need to do to a server what production does to it: SIGKILL it, freeze it with
SIGSTOP, bring it back on the same port with the same data. `ProcessService` gives every
server kind those operations once; subclasses only say how to launch it and how to tell it is
ready. Each server runs in its own session (hence its own process group), so a signal also
reaches children such as Redis's AOF-rewrite fork, and no signal reaches the test runner.
Every live service is registered for an `atexit` sweep, so a crashed or interrupted test run
does not leave servers behind.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import contextlib
import inspect
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self, TypeVar

from worker.testing._errors import ServiceStartError

#: Every server binds the loopback address only; tests never expose a port to the network.
HOST = "127.0.0.1"

_POLL_S = 0.05
_STOP_TIMEOUT_S = 10.0
_LOG_TAIL_LINES = 40
_START_MARK = "=== aip-test-harness: start "
_PORT_ATTEMPTS = 3

_LIVE: set[ProcessService] = set()


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports that are free right now.

    The sockets are held open together so the kernel cannot hand out one port twice; its
    choice is random, so a port is rarely taken again in the moment before the server binds.
    """
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((HOST, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """One loopback port that is free right now."""
    return free_ports(1)[0]


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses every connection while the block runs: bound, never
    listening, so no other process can take it. A test of "nothing answers there" needs
    this, not `free_port`: a parallel test's server or proxy can bind a free port between
    the choice and the connect, and answer (or accept and hang up) in its stead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        yield int(sock.getsockname()[1])


def port_accepts(port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on the loopback port."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    condition: Callable[[], bool], *, timeout: float, what: str, poll: float = _POLL_S
) -> None:
    """Poll `condition` until it holds; raise TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(poll)


T = TypeVar("T")


async def eventually(
    check: Callable[[], T | Awaitable[T]], *, within: float, what: str, poll: float = _POLL_S
) -> T:
    """`wait_until` inside an event loop: poll `check` (a plain function or a coroutine
    function) until it returns something true within `within` seconds, and return that;
    raise TimeoutError naming `what` otherwise. The loop runs between polls, so what is
    awaited can make progress."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {within:.1f}s waiting for {what}")
        await asyncio.sleep(poll)


class ProcessService(abc.ABC):
    """A server process the test owns: start, stop, kill, pause, resume, restart, close.

    Ports and the data directory are fixed when the object is made, so `restart()` brings the
    server back where clients and peers expect it, with its data. Use it as a context manager
    or call `close()`; both stop the process and delete the temp directory.
    """

    #: Shown in errors, e.g. "nats-server".
    kind = "server"

    def __init__(self, *, root: Path | None, start_timeout: float, ports_fixed: bool) -> None:
        self._owns_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix=f"aip-{self.kind}-")) if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._starts = 0
        # Ports the caller chose (cluster peers refer to them) are never re-chosen.
        self._ports_fixed = ports_fixed
        _LIVE.add(self)

    @property
    def log_path(self) -> Path:
        """The server's stdout and stderr, across restarts (each start is marked)."""
        return self.root / "server.log"

    @property
    def pid(self) -> int | None:
        """The process id while a process exists (also while it is paused)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the process exists (paused counts as running)."""
        return self.pid is not None

    @property
    def paused(self) -> bool:
        """Whether the process is stopped with SIGSTOP."""
        return self.running and self._paused

    @property
    def controllable(self) -> bool:
        """Always true: the harness owns this process."""
        return True

    @abc.abstractmethod
    def _argv(self) -> list[str]:
        """The command line that launches the server in the foreground."""

    @abc.abstractmethod
    def _probe(self) -> bool:
        """One readiness check; False (or an OSError) means not ready yet."""

    @abc.abstractmethod
    def _choose_ports(self) -> None:
        """Pick fresh free ports (only called when the caller did not fix them)."""

    @abc.abstractmethod
    def _prepare(self) -> None:
        """Write config files and directories before each launch."""

    def start(self, *, wait: bool = True) -> None:
        """Launch the server; with `wait`, return only once it is ready.

        If the first launch loses its port to another process in the moment between choosing
        and binding it, fresh ports are chosen and the launch retried.
        """
        if self.running:
            raise RuntimeError(f"{self.kind} is already running (pid {self.pid})")
        for attempt in range(_PORT_ATTEMPTS):
            self._spawn()
            if not wait:
                return
            try:
                self.wait_ready()
                return
            except ServiceStartError as exc:
                self._reap(signal.SIGKILL)
                retry = exc.port_clash and not self._ports_fixed and attempt + 1 < _PORT_ATTEMPTS
                if not retry:
                    raise
                self._choose_ports()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the server answers its readiness probe, failing fast if it exits."""
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise self._start_error(f"{self.kind} exited during start (code {code})")
            try:
                if self._probe():
                    self._ports_fixed = True
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise self._start_error(f"{self.kind} not ready after {limit:.1f}s")
            time.sleep(_POLL_S)

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Graceful stop: SIGTERM (and SIGCONT if paused), SIGKILL if it outlives `timeout`."""
        self._reap(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """Crash the server with SIGKILL, as a power cut or OOM kill would."""
        self._reap(signal.SIGKILL)

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: connections stay open but nothing is answered.

        Returns only once every thread has stopped: delivery is asynchronous, and a request
        sent in that moment would still be answered (seen in about 1 in 15 tries).
        """
        self._signal(signal.SIGSTOP)
        self._paused = True
        self._wait_threads(stopped=True)

    def resume(self) -> None:
        """Unfreeze a paused server with SIGCONT (returns once its threads run again)."""
        self._signal(signal.SIGCONT)
        self._paused = False
        self._wait_threads(stopped=False)

    def restart(self, *, wait: bool = True) -> None:
        """Stop if running, then start on the same ports with the same data directory."""
        if self.running:
            self.stop()
        self.start(wait=wait)

    def close(self) -> None:
        """Kill the process if any and delete the temp directory; safe to call twice."""
        self._reap(signal.SIGKILL)
        _LIVE.discard(self)
        if self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines the server wrote since its latest start."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        since_start = text.rsplit(_START_MARK, 1)[-1].split("\n", 1)[-1]
        return "\n".join(since_start.splitlines()[-lines:])

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn(self) -> None:
        self._prepare()
        argv = self._argv()
        self._starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"{_START_MARK}{self._starts}: {' '.join(argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                argv,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._paused = False

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"{self.kind} is not running")
        os.killpg(self._proc.pid, sig)

    def _wait_threads(self, *, stopped: bool) -> None:
        pid = self.pid
        # /proc is Linux; elsewhere the signal's own (small) delay is accepted.
        tasks = Path(f"/proc/{pid}/task")
        if pid is None or not tasks.is_dir():
            return
        wait_until(
            lambda: all(state == stopped for state in _thread_stop_states(tasks)),
            timeout=_STOP_TIMEOUT_S,
            what=f"{self.kind} threads to {'stop' if stopped else 'continue'}",
            poll=0.002,
        )

    def _reap(self, sig: signal.Signals, timeout: float = _STOP_TIMEOUT_S) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            _killpg(proc.pid, sig)
            if self._paused:
                # A stopped process keeps SIGTERM pending until it is continued.
                _killpg(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Forked children (an AOF rewrite) share the group and must not outlive the server.
        _killpg(proc.pid, signal.SIGKILL)
        self._proc = None
        self._paused = False

    def _start_error(self, message: str) -> ServiceStartError:
        tail = self.log_tail()
        clash = "address already in use" in tail.lower()
        return ServiceStartError(f"{message}; log {self.log_path}", log_tail=tail, port_clash=clash)


def _thread_stop_states(tasks: Path) -> list[bool]:
    """For each thread under /proc/<pid>/task, whether it is stopped (state T)."""
    states = []
    for stat in tasks.glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the thread exited meanwhile
        states.append(fields[0] in ("T", "t"))
    return states


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@atexit.register
def _close_all() -> None:
    """Last-resort cleanup when a test run ends without its fixtures finalizing."""
    for service in list(_LIVE):
        service.close()


def close_all_on_sigterm() -> None:
    """Make SIGTERM (a CI job timeout, `timeout(1)`) clean up servers as a normal exit does.

    Python's default SIGTERM action ends the process without running `atexit`, which would
    orphan every server. The handler is installed only over that default and only from the
    main thread; after cleaning up it restores the default and re-raises, so the exit status
    still says "terminated".
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        _close_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


class ServiceGroup(abc.ABC):
    """Several servers started and stopped as one (a cluster): start, close, `with`."""

    nodes: Sequence[ProcessService]

    @abc.abstractmethod
    def start(self) -> None:
        """Start every node and wait until the group works as a whole."""

    def close(self) -> None:
        """Kill every node and delete their directories."""
        for node in self.nodes:
            node.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
