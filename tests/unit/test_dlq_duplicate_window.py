"""The DLQ keeps its own, longer duplicate window (subjects/streams.py): an Action's
retry-exhausted entry (worker/pipeline/exhausted.py) is written again under the same
`Nats-Msg-Id` whenever a redelivery republishes its stored result, which may come long after
the first when the result's publication kept failing. With the other streams' window at
0.5 s here, a second publication of one entry id a second later is still stored once on the
DLQ, while the results stream, on the short window, stores both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import DAY_S, StreamPolicy
from worker.testing.services import ServiceHandle

ENDPOINT = "h1"
SHORT_S = 0.5


@pytest.fixture
async def nc(nats_server: ServiceHandle) -> AsyncIterator[Client]:
    client = await nats.connect(nats_server.url)
    policy = StreamPolicy(ack_wait_s=5.0, duplicate_window_s=SHORT_S)
    await provision(client.jetstream(), Subjects(), [ENDPOINT], policy)
    yield client
    await client.drain()


async def _twice(nc: Client, subject: str, msg_id: str) -> tuple[bool, bool]:
    js = nc.jetstream()
    first = await js.publish(subject, b"{}", headers={"Nats-Msg-Id": msg_id})
    await asyncio.sleep(SHORT_S * 2)
    second = await js.publish(subject, b"{}", headers={"Nats-Msg-Id": msg_id})
    return bool(first.duplicate), bool(second.duplicate)


async def test_the_dlq_remembers_an_entry_id_past_the_other_streams_window(nc: Client) -> None:
    subjects = Subjects()
    js = nc.jetstream()
    dlq = await js.stream_info(subjects.stream_name("dlq"))
    assert dlq.config.duplicate_window == pytest.approx(DAY_S)
    results = await js.stream_info(subjects.stream_name("results"))
    assert results.config.duplicate_window == pytest.approx(SHORT_S)

    assert await _twice(nc, subjects.dlq(ENDPOINT), "dlq_" + "a" * 32) == (False, True)
    assert (await js.stream_info(subjects.stream_name("dlq"))).state.messages == 1
    result_subject = subjects.results(ENDPOINT, "act_" + "b" * 32)
    assert await _twice(nc, result_subject, "res_" + "b" * 32) == (False, False)
