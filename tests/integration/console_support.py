"""A console process over a test Stack: its tokens file, and `python -m worker console` started
as a user starts it (the stack's `AIPD_*` environment), stopped at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.integration.stack import Stack
from tests.integration.test_escalations import resolve_as_approver
from worker.gateway.principals import token_sha256
from worker.testing._procs import free_port
from worker.testing.identities import TENANT_A, TENANT_B

#: Each token's scope.
ALL = "console-token-all"
ONLY_A = "console-token-tenant-a"
ONLY_B = "console-token-tenant-b"
EXPIRED = "console-token-expired"


def write_tokens(path: Path) -> Path:
    """An owner-only tokens file: one token per scope, and one that has expired."""
    far = int(time.time() * 1000) + 3_600_000
    records = [
        {
            "token_sha256": token_sha256(ALL),
            "principal_id": "ops:root",
            "tenant_id": "*",
            "expires_at_unix_ms": far,
        },
        {
            "token_sha256": token_sha256(ONLY_A),
            "principal_id": "ops:a",
            "tenant_id": TENANT_A,
            "expires_at_unix_ms": far,
        },
        {
            "token_sha256": token_sha256(ONLY_B),
            "principal_id": "ops:b",
            "tenant_id": TENANT_B,
            "expires_at_unix_ms": far,
        },
        {
            "token_sha256": token_sha256(EXPIRED),
            "principal_id": "ops:old",
            "tenant_id": "*",
            "expires_at_unix_ms": 1,
        },
    ]
    path.write_text(json.dumps(records))
    path.chmod(0o600)
    return path


@dataclass
class ConsoleProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    async def get(
        self, path: str, token: str | None = ALL, *, allow_redirects: bool = False
    ) -> tuple[int, str, aiohttp.typedefs.LooseHeaders]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                self.url + path, headers=headers, allow_redirects=allow_redirects
            ) as response,
        ):
            return response.status, await response.text(), response.headers


@contextlib.asynccontextmanager
async def console_process(stack: Stack, **env: str) -> AsyncIterator[ConsoleProcess]:
    """`python -m worker console` on a free port with the stack's settings and a tokens file."""
    port = free_port()
    tokens = write_tokens(stack.root / "console-tokens.json")
    log = stack.root / "console.log"
    environment = {
        **os.environ,
        **stack.env,
        "AIPD_CONSOLE_PORT": str(port),
        "AIPD_CONSOLE_TOKENS_FILE": str(tokens),
        "AIPD_LOG_FORMAT": "human",
        **env,
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "console"],
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    console = ConsoleProcess(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the console exited {proc.returncode}: {console.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError):
                status, _, _ = await console.get("/health", None)
                if status == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"the console never served: {console.log_tail()}")
            await asyncio.sleep(0.1)
        yield console
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)


async def answer_once(stack: Stack, escalation_id: str) -> None:
    """Resolve an approval escalation as its approver would, with the CLI (`once`)."""
    code, _, err = await resolve_as_approver(stack, escalation_id)
    assert code == 0, err
