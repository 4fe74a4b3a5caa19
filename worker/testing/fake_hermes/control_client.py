"""`FakeHermesControl`: drive the `/_fake/` routes of a fake running in another process."""

from __future__ import annotations

from types import TracebackType

import httpx

from worker.testing.fake_hermes.faults import Fault, decode_faults, encode_faults
from worker.testing.fake_hermes.stats import RecordedRequest, StatsSnapshot


class FakeHermesControl:
    """Async client for the control routes (no API key: they are unauthenticated)."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self._client = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=timeout)

    async def add_faults(self, *faults: Fault) -> None:
        """Arm faults, in order."""
        response = await self._client.post(
            "/_fake/faults",
            content=encode_faults(list(faults)),
            headers={"Content-Type": "application/json"},
        )
        response.raise_for_status()

    async def faults(self) -> list[Fault]:
        """The armed faults with their remaining `times`."""
        response = await self._client.get("/_fake/faults")
        response.raise_for_status()
        return decode_faults(response.content)

    async def clear_faults(self) -> None:
        """Disarm everything."""
        (await self._client.delete("/_fake/faults")).raise_for_status()

    async def stats(self) -> StatsSnapshot:
        """Request counts so far."""
        response = await self._client.get("/_fake/stats")
        response.raise_for_status()
        return StatsSnapshot.from_json(response.json())

    async def requests(self, route: str | None = None) -> list[RecordedRequest]:
        """Recent requests (optionally of one route template), oldest first."""
        params = {"route": route} if route is not None else {}
        response = await self._client.get("/_fake/requests", params=params)
        response.raise_for_status()
        return [RecordedRequest.from_json(row) for row in response.json()["requests"]]

    async def restart(self) -> None:
        """Make the fake forget every run, like a Hermes restart."""
        (await self._client.post("/_fake/restart")).raise_for_status()

    async def reset(self) -> None:
        """Clear stats, the request log and every fault."""
        (await self._client.post("/_fake/reset")).raise_for_status()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    async def __aenter__(self) -> FakeHermesControl:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
