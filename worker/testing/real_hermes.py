"""Run the real `hermes-agent==0.19.0` API server on loopback, driven by the project's fake LLM.

The fake Hermes can only be trusted while it agrees with the real server, so the conformance
suite runs the same tests against both. This module owns the real one: a cached virtual
environment (Hermes has its own pinned dependency tree and must not share the project's), a
private `HERMES_HOME` configured as `shared/reference/hermes-0.19.md` says, and a gateway
process that tests can restart (Hermes forgets every run when it restarts) and always stop.

First-class delegation needs Hermes to reach an MCP server (`mcp_servers=`: the AIP gateway,
`worker.gateway`): Hermes discovers MCP tools once, when its own gateway process starts, so
that server must be up before `RealHermes` starts (and before every `restart`).

Run one by hand with `python -m worker.testing.real_hermes --port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import aiohttp

from worker.hermes import PINNED_VERSION
from worker.testing._errors import HermesUnavailable as HermesUnavailable
from worker.testing._errors import ServiceStartError
from worker.testing._procs import free_port, port_accepts
from worker.testing.fake_llm import MODEL_ID, FakeLLM

HERMES_VERSION: Final = PINNED_VERSION
#: The API server needs aiohttp but hermes-agent does not depend on it; this pin is the one
#: the reference was observed with.
AIOHTTP_VERSION: Final = "3.14.1"
#: The `mcp` extra brings Hermes' MCP client (it pins `mcp==1.26.0`), which delegation needs.
REQUIREMENTS: Final = (f"hermes-agent[mcp]=={HERMES_VERSION}", f"aiohttp=={AIOHTTP_VERSION}")
VENV_ENV_VAR: Final = "AIPD_HERMES_VENV"
#: The file whose tail goes into every start error.
LOG_NAME: Final = "hermes-gateway.log"
#: Created in the terminal's working directory so `APPROVAL_COMMAND` has a file to chmod.
SCENARIO_FILE: Final = "aip-scenario-file.txt"
#: The MCP tools Hermes takes from a configured server by default (no resources, no prompts):
#: a delegated run needs only `aip_call`, so the model sees exactly `mcp__<name>__aip_call`.
#: `mcp_tools=` widens it (the connector overview's list is all six AIP tools).
MCP_TOOL_INCLUDE: Final = ("aip_call",)
#: Hermes names the model-facing tools `mcp__<name>__<tool>`: keep names plain.
_MCP_SERVER_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
#: Hermes' bounds on one MCP tool call and on connecting to the server (the tests' values).
MCP_TIMEOUT_S: Final = 30
MCP_CONNECT_TIMEOUT_S: Final = 10

_INSTALL_TIMEOUT_S: Final = 900.0
_LOCK_TIMEOUT_S: Final = 1200.0
_HEALTH_TIMEOUT_S: Final = 20.0
_STOP_GRACE_S: Final = 5.0
_PORT_ATTEMPTS: Final = 3
_LOG_TAIL_CHARS: Final = 4000
_START_MARK: Final = "=== aip-test-harness: start hermes gateway on port "
# Log lines after which 0.19.0 keeps running without ever listening: fail at once, not in 20 s.
_FATAL_LOG_LINES: Final = ("Refusing to start", "Could not bind", "aiohttp not installed")
# Variables that would override the HERMES_HOME files (the process environment wins over
# `.env`) or send loopback traffic through a proxy.
_SCRUBBED_PREFIXES: Final = ("HERMES_", "API_SERVER_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_")
_SCRUBBED_NAMES: Final = frozenset({"http_proxy", "https_proxy", "all_proxy", "no_proxy"})


class HermesStartError(ServiceStartError):
    """The installed gateway did not answer `/health`; the message ends with its log tail."""


def default_venv_dir() -> Path:
    """`$AIPD_HERMES_VENV`, else a per-user cache shared by every checkout and test process.

    The cache directory is named after the requirement set, so changing a pin installs a new
    venv beside the old one instead of deleting a venv another checkout may be running.
    """
    configured = os.environ.get(VENV_ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    digest = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:8]
    name = f"hermes-agent-{HERMES_VERSION}-{digest}"
    return Path.home() / ".cache" / "aip-hermes-worker" / name / "venv"


def ensure_hermes_venv() -> Path:
    """Install the pinned Hermes into the cached venv unless it is already there; return it.

    Blocking (about 45 s the first time, instant afterwards): call it from a thread in async
    code. A marker written after a verified install is what "already there" means, so an
    install killed half-way is redone; a file lock makes concurrent test processes wait for
    one installer instead of corrupting the venv together.
    """
    venv = default_venv_dir()
    if _installed(venv):
        return venv
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        with _install_lock(venv.parent / f"{venv.name}.lock"):
            if not _installed(venv):
                _install(venv)
    except OSError as exc:
        raise HermesUnavailable(f"cannot install into {venv}: {exc}") from exc
    return venv


def _marker(venv: Path) -> Path:
    return venv / "aip-hermes-installed.txt"


def _installed(venv: Path) -> bool:
    marker = _marker(venv)
    return (
        marker.is_file()
        and marker.read_text() == "\n".join(REQUIREMENTS)
        and (venv / "bin" / "hermes").is_file()
    )


@contextlib.contextmanager
def _install_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        deadline = time.monotonic() + _LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise HermesUnavailable(f"another process holds {path} too long") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _install(venv: Path) -> None:
    if not (3, 11) <= sys.version_info[:2] < (3, 14):
        raise HermesUnavailable(
            f"hermes-agent {HERMES_VERSION} needs Python >=3.11,<3.14, not {sys.version.split()[0]}"
        )
    shutil.rmtree(venv, ignore_errors=True)
    python = venv / "bin" / "python"
    steps = (
        ("create the venv", [sys.executable, "-m", "venv", str(venv)]),
        ("pip install", [str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS]),
        (
            "import the API server",
            [str(python), "-c", "import aiohttp, mcp, gateway.platforms.api_server"],
        ),
    )
    for step, argv in steps:
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(venv, ignore_errors=True)
            raise HermesUnavailable(f"{step} failed: {exc}") from exc
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = (done.stderr or done.stdout)[-_LOG_TAIL_CHARS:]
            raise HermesUnavailable(f"{step} exited {done.returncode}:\n{tail}")
    _marker(venv).write_text("\n".join(REQUIREMENTS))


def hermes_dotenv(api_key: str, host: str, port: int) -> str:
    """`$HERMES_HOME/.env`: the API server's switch, key and address (the process
    environment would override it; `RealHermes` scrubs those names from it)."""
    return (
        "API_SERVER_ENABLED=true\n"
        f"API_SERVER_KEY={api_key}\n"
        f"API_SERVER_HOST={host}\n"
        f"API_SERVER_PORT={port}\n"
    )


def hermes_config(
    *,
    llm_base_url: str,
    terminal_cwd: str,
    approval_timeout_s: int = 120,
    mcp_servers: Mapping[str, tuple[str, str]] | None = None,
    mcp_tools: Sequence[str] = MCP_TOOL_INCLUDE,
    mcp_timeout_s: int = MCP_TIMEOUT_S,
    mcp_connect_timeout_s: int = MCP_CONNECT_TIMEOUT_S,
) -> dict[str, Any]:
    """The `config.yaml` document every real Hermes here runs with (as `hermes-0.19.md` says).

    One function, so the compose image's config (compose/hermes/config.yaml, the same
    document with the compose network's addresses) is checked against it and cannot drift
    from the configuration the real-Hermes tests prove. `mcp_servers` maps a server name to
    its (Streamable HTTP URL, bearer token).
    """
    document: dict[str, Any] = {
        "model": {
            "provider": "custom",
            "default": MODEL_ID,
            "base_url": llm_base_url,
            "api_key": "unused",
            # At least 64000, and set, so Hermes does not probe the model for it.
            "context_length": 131072,
        },
        # `manual`: the default `smart` first asks the LLM for a verdict.
        "approvals": {"mode": "manual", "timeout": approval_timeout_s},
        "terminal": {"backend": "local", "cwd": terminal_cwd},
        # Otherwise Hermes tries to download a scanner binary.
        "security": {"tirith_enabled": False},
    }
    if mcp_servers:
        document["mcp_servers"] = {
            name: {
                "url": url,
                "headers": {"Authorization": f"Bearer {token}"},
                "timeout": mcp_timeout_s,
                "connect_timeout": mcp_connect_timeout_s,
                # The spec's profile: AIP tools never run concurrently.
                "supports_parallel_tool_calls": False,
                "tools": {"include": list(mcp_tools), "resources": False, "prompts": False},
            }
            for name, (url, token) in mcp_servers.items()
        }
    return document


#: Process groups of gateways still running, for the exit sweep.
_LIVE_GROUPS: set[int] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Last resort when a test run ends without its fixtures finalizing."""
    for pgid in list(_LIVE_GROUPS):
        _signal_group(pgid, signal.SIGKILL)


class RealHermes:
    """One real Hermes gateway with its own home, port, key and fake LLM.

    `async with RealHermes(tmp) as hermes:` installs (or reuses) the venv, starts the fake LLM
    and the gateway, and returns once `GET /health` answers as 0.19.0. The gateway process can
    stay alive while nothing listens (a refused key, a port clash), so readiness is the port
    answering, never the process existing.

    `mcp_servers` maps a server name to the (Streamable HTTP URL, bearer token) of an MCP
    server whose `aip_call` tool the model may call, as `mcp__<name>__aip_call`. Hermes lists
    MCP tools only while the gateway starts: start those servers first, and keep them up
    across `restart`.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        api_key: str | None = None,
        approval_timeout_s: int = 120,
        mcp_servers: Mapping[str, tuple[str, str]] | None = None,
        mcp_tools: Sequence[str] = MCP_TOOL_INCLUDE,
    ) -> None:
        for name in mcp_servers or {}:
            if not _MCP_SERVER_NAME.fullmatch(name):
                raise ValueError(f"MCP server name {name!r} is not [a-z0-9][a-z0-9_-]*")
        self.workdir = Path(workdir)
        self.home = self.workdir / "hermes-home"
        #: The terminal tool's working directory; tool commands run here.
        self.scratch = self.workdir / "scratch"
        self.log_path = self.workdir / LOG_NAME
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(32)
        if len(self.api_key) < 16:
            raise ValueError("Hermes refuses API keys shorter than 16 characters")
        self._port = port
        self._approval_timeout_s = approval_timeout_s
        self._mcp_servers = dict(mcp_servers or {})
        #: The MCP tools Hermes takes from each server (`tools.include`).
        self._mcp_tools = tuple(mcp_tools)
        self._hermes: Path | None = None
        self._llm: FakeLLM | None = None
        self._process: asyncio.subprocess.Process | None = None

    @property
    def port(self) -> int:
        """The API server's port (chosen at start when none was given)."""
        if self._port is None:
            raise RuntimeError("RealHermes is not started")
        return self._port

    @property
    def url(self) -> str:
        """The API server's base URL, without a trailing slash."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def llm(self) -> FakeLLM:
        """The fake LLM this Hermes talks to (its `calls` show what Hermes sent)."""
        if self._llm is None:
            raise RuntimeError("RealHermes is not started")
        return self._llm

    @property
    def pid(self) -> int | None:
        """The gateway's process id while it runs."""
        return self._process.pid if self._process is not None else None

    async def __aenter__(self) -> RealHermes:
        venv = await asyncio.to_thread(ensure_hermes_venv)
        self._hermes = venv / "bin" / "hermes"
        self._llm = FakeLLM()
        await self._llm.start()
        try:
            await self._first_start()
        except BaseException:
            await self._llm.stop()
            raise
        return self

    async def _first_start(self) -> None:
        """Start on the caller's port, or on a free one, choosing again if it was just taken."""
        chosen = self._port is None
        for attempt in range(_PORT_ATTEMPTS):
            if chosen:
                self._port = free_port()
            self._write_home()
            try:
                await self._start()
                return
            except HermesStartError as exc:
                if not (chosen and exc.port_clash and attempt + 1 < _PORT_ATTEMPTS):
                    raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._stop()
        finally:
            await self.llm.stop()

    async def restart(self) -> None:
        """Stop the gateway and start it again on the same home and port.

        Runs live only in the gateway's memory, so afterwards every earlier run id is 404.
        """
        await self._stop()
        await self._start()

    def _write_home(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        (self.scratch / SCENARIO_FILE).touch()
        env_file = self.home / ".env"
        env_file.write_text(hermes_dotenv(self.api_key, "127.0.0.1", self.port))
        env_file.chmod(0o600)
        config = self.home / "config.yaml"
        document = hermes_config(
            llm_base_url=self.llm.base_url,
            terminal_cwd=str(self.scratch),
            approval_timeout_s=self._approval_timeout_s,
            mcp_servers=self._mcp_servers,
            mcp_tools=self._mcp_tools,
        )
        # JSON is YAML: Hermes' yaml loader reads exactly this document.
        config.write_text(json.dumps(document, indent=2) + "\n")
        config.chmod(0o600)  # it may hold MCP bearer tokens

    def _environment(self) -> dict[str, str]:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(_SCRUBBED_PREFIXES) and name.lower() not in _SCRUBBED_NAMES
        }
        env["HERMES_HOME"] = str(self.home)
        return env

    async def _start(self) -> None:
        assert self._hermes is not None, "set by __aenter__"
        if port_accepts(self.port):
            raise HermesStartError(f"port {self.port} is already in use", port_clash=True)
        with self.log_path.open("ab") as log:
            log.write(f"{_START_MARK}{self.port}\n".encode())
            log.flush()
            # A new session makes the gateway the leader of its own process group, so stopping
            # it also stops the shell commands its terminal tool started.
            self._process = await asyncio.create_subprocess_exec(
                str(self._hermes),
                "gateway",
                "run",
                "-v",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.scratch,
                env=self._environment(),
                start_new_session=True,
            )
        _LIVE_GROUPS.add(self._process.pid)
        try:
            await self._wait_healthy(self._process)
        except BaseException:
            await self._stop()
            raise

    async def _wait_healthy(self, process: asyncio.subprocess.Process) -> None:
        deadline = time.monotonic() + _HEALTH_TIMEOUT_S
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    raise self._start_error(f"hermes gateway exited {process.returncode}")
                fatal = next((line for line in _FATAL_LOG_LINES if line in self.log_tail()), None)
                if fatal is not None:
                    raise self._start_error(f"hermes gateway logged {fatal!r}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{self.url}/health") as response:
                        if response.status == 200:
                            body = await response.json()
                            if body.get("version") != HERMES_VERSION:
                                raise self._start_error(f"{self.url} is not Hermes: {body}")
                            return
                await asyncio.sleep(0.1)
        raise self._start_error(f"hermes gateway gave no /health in {_HEALTH_TIMEOUT_S:.0f} s")

    async def _stop(self) -> None:
        """SIGTERM the gateway's process group, SIGKILL it if it lingers.

        A run blocked in an LLM stream keeps 0.19.0 alive well past its own drain timeout, so
        the grace period is short and the kill unconditional.
        """
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), _STOP_GRACE_S)
            except TimeoutError:
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        # Tool commands outlive their gateway in the same group; end them too.
        _signal_group(process.pid, signal.SIGKILL)
        _LIVE_GROUPS.discard(process.pid)

    def log_tail(self) -> str:
        """The end of the gateway log since its latest start."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text.rsplit(_START_MARK, 1)[-1][-_LOG_TAIL_CHARS:]

    def _start_error(self, message: str) -> HermesStartError:
        tail = self.log_tail()
        return HermesStartError(
            f"{message}; log {self.log_path}", log_tail=tail, port_clash="Could not bind" in tail
        )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _serve(workdir: Path, port: int | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with RealHermes(workdir, port=port) as hermes:
        key_file = workdir / "api-key"
        key_file.write_text(hermes.api_key)
        key_file.chmod(0o600)
        print(f"url {hermes.url}", flush=True)
        print(f"api key file {key_file}", flush=True)
        print(f"log {hermes.log_path}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve one real Hermes until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(description="Run the real Hermes 0.19.0 with the fake LLM.")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="default: a new directory under /tmp"
    )
    args = parser.parse_args(argv)
    workdir = args.workdir
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="real-hermes-"))
    try:
        asyncio.run(_serve(workdir, args.port))
    except HermesUnavailable as exc:
        sys.exit(f"hermes unavailable: {exc.reason}")


if __name__ == "__main__":
    main()
