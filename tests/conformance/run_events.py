"""Reading Hermes 0.19 structured runs over raw HTTP: shared by both conformance suites.

`POST /v1/runs`, the single-use `GET /v1/runs/{id}/events` stream (data lines and comments
only), status reads, and the reaction that answers an approval prompt as it arrives.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

Event = dict[str, Any]
React = Callable[[httpx.AsyncClient, str, Event], Awaitable[None]]
RUN_TIMEOUT_S = 30.0
#: What 0.19.0 puts before the first text delta that follows a tool call.
AFTER_TOOL = "\n\n"
RUN_ID = re.compile(r"^run_[0-9a-f]{32}$")


async def start_run(client: httpx.AsyncClient, text: str, **fields: Any) -> str:
    response = await client.post("/v1/runs", json={"input": text, **fields})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "started"
    assert RUN_ID.match(body["run_id"])
    run_id: str = body["run_id"]
    return run_id


async def read_events(
    client: httpx.AsyncClient, run_id: str, react: React | None = None
) -> tuple[list[Event], list[str]]:
    """The run's events and the SSE comment lines, reacting to each event as it arrives."""
    events: list[Event] = []
    comments: list[str] = []
    async with asyncio.timeout(RUN_TIMEOUT_S):
        async with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                assert line == "" or line.startswith(("data: ", ": ")), line
                if line.startswith(": "):
                    comments.append(line)
                if not line.startswith("data: "):
                    continue
                event: Event = json.loads(line.removeprefix("data: "))
                assert event["run_id"] == run_id
                assert isinstance(event["timestamp"], float)
                events.append(event)
                if react is not None:
                    await react(client, run_id, event)
    return events, comments


def names(events: list[Event]) -> list[str]:
    """Event names, each run of consecutive deltas shown once."""
    shown: list[str] = []
    for event in events:
        if not (shown and event["event"] == shown[-1] == "message.delta"):
            shown.append(event["event"])
    return shown


def text_of(events: list[Event]) -> str:
    return "".join(e["delta"] for e in events if e["event"] == "message.delta")


async def status_of(client: httpx.AsyncClient, run_id: str) -> Event:
    response = await client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: Event = response.json()
    return body


async def wait_status(client: httpx.AsyncClient, run_id: str, *wanted: str) -> Event:
    async with asyncio.timeout(RUN_TIMEOUT_S):
        while True:
            status = await status_of(client, run_id)
            if status["status"] in wanted:
                return status
            await asyncio.sleep(0.05)


def answer(choice: str, expected_choice: str | None = None) -> React:
    async def react(client: httpx.AsyncClient, run_id: str, event: Event) -> None:
        if event["event"] != "approval.request":
            return
        assert (await status_of(client, run_id))["status"] == "waiting_for_approval"
        response = await client.post(f"/v1/runs/{run_id}/approval", json={"choice": choice})
        assert response.status_code == 200, response.text
        assert response.json() == {
            "object": "hermes.run.approval_response",
            "run_id": run_id,
            "choice": expected_choice or choice,
            "resolved": 1,
        }

    return react
