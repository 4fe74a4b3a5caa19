"""Serve an ASGI app with uvicorn inside a process that owns its signals (the gateway, the
console): bind first, so a busy port is a SettingsError naming its setting; wait until it
serves; stop it within a bound, forcing it when connections linger."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from worker.dependencies import port_in_use
from worker.tasks import stop_tasks

_STARTUP_TIMEOUT_S = 10.0


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the host process owns its signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Served:
    """One app listening on one socket; `port` is the one bound (useful with port 0)."""

    def __init__(self, server: QuietServer, task: asyncio.Task[None], port: int) -> None:
        self.server = server
        self.task = task
        self.port = port

    @classmethod
    async def start(
        cls, app: Any, *, host: str, port: int, backlog: int, port_settings: str, **config: Any
    ) -> Served:
        """Bind `host:port` and serve `app` (`config`: more `uvicorn.Config` options)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            raise port_in_use(exc, host=host, port=port, settings=port_settings) from None
        bound = int(sock.getsockname()[1])
        server = QuietServer(
            uvicorn.Config(
                app,
                log_config=None,
                log_level="warning",
                access_log=False,
                ws="none",
                timeout_graceful_shutdown=2,
                backlog=backlog,
                **config,
            )
        )
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        async with asyncio.timeout(_STARTUP_TIMEOUT_S):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the HTTP server stopped during startup")
                await asyncio.sleep(0.01)
        return cls(server, task, bound)

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, let requests finish within `timeout_s`, then force it."""
        self.server.should_exit = True
        finished, _ = await asyncio.wait({self.task}, timeout=timeout_s)
        if not finished:
            self.server.force_exit = True
            await stop_tasks([self.task], timeout_s)
