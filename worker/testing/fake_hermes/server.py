"""`FakeHermes`: run the fake in-process on a loopback port, as an async context manager."""

from __future__ import annotations

import dataclasses
from types import TracebackType

from aiohttp import web

from worker.testing.fake_hermes.app import build_app
from worker.testing.fake_hermes.config import FakeConfig
from worker.testing.fake_hermes.faults import Faults
from worker.testing.fake_hermes.mcp import McpTool
from worker.testing.fake_hermes.state import FakeState
from worker.testing.fake_hermes.stats import RecordedRequest, StatsSnapshot

#: How long shutdown waits for handlers; hanging fault requests are released before that.
SHUTDOWN_TIMEOUT_S = 1.0


class FakeHermes:
    """A fake Hermes 0.19.0 API server.

    ```python
    async with FakeHermes(api_key="k" * 32) as fake:
        fake.faults.add(StartDrop(input_contains="boom"))
        ...  # point the client at fake.url
        assert fake.stats().count("POST /v1/runs") == 1
    ```
    """

    def __init__(
        self,
        api_key: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: FakeConfig | None = None,
    ) -> None:
        if config is None:
            if api_key is None:
                raise ValueError("FakeHermes needs an api_key or a config")
            config = FakeConfig(api_key=api_key)
        elif api_key is not None:
            config = dataclasses.replace(config, api_key=api_key)
        self.config = config
        self.host = host
        self._port = port
        self.state = FakeState.new(config)
        self._runner: web.AppRunner | None = None

    @property
    def api_key(self) -> str:
        """The bearer key clients must send."""
        return self.config.api_key

    @property
    def port(self) -> int:
        """The bound port (known once started)."""
        return self._port

    @property
    def url(self) -> str:
        """`http://host:port`, the base URL for a client."""
        if self._runner is None:
            raise RuntimeError("FakeHermes is not started")
        return f"http://{self.host}:{self._port}"

    @property
    def faults(self) -> Faults:
        """The armed faults; add or clear them at any time."""
        return self.state.faults

    @property
    def mcp_tools(self) -> dict[str, McpTool]:
        """MCP tools the agent may call by name (`aip_call` for delegation); see `mcp`."""
        return self.state.runs.mcp_tools

    def stats(self) -> StatsSnapshot:
        """Request counts so far."""
        return self.state.stats.snapshot()

    def requests(self) -> list[RecordedRequest]:
        """Recent requests, oldest first."""
        return self.state.stats.requests()

    def reset(self) -> None:
        """Clear stats, the request log and every fault."""
        self.state.stats.clear()
        self.state.faults.clear()

    async def restart(self) -> None:
        """Behave like a Hermes restart: runs, open streams and the idempotency cache vanish."""
        self.state.restart()

    async def start(self) -> None:
        """Bind and serve."""
        runner = web.AppRunner(
            build_app(self.state),
            handler_cancellation=True,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            access_log=None,
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port)
        await site.start()
        self._port = runner.addresses[0][1]
        self._runner = runner

    async def close(self) -> None:
        """Stop serving; in-flight streams are cut."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            self.state.connections.cut_all()
            await runner.cleanup()

    async def __aenter__(self) -> FakeHermes:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
