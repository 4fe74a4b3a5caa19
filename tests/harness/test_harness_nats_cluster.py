"""The NATS cluster handle: an R3 stream stays available when its leader is killed."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError

from worker.testing.services import NatsCluster, NatsServer, wait_until


@pytest.mark.chaos
async def test_r3_stream_stays_available_after_its_leader_is_killed(
    nats_cluster: NatsCluster,
) -> None:
    meta = nats_cluster.meta_leader()
    assert meta in nats_cluster.nodes
    assert all(node.meta_leader() == meta.server_name for node in nats_cluster.nodes)

    nc = await nats.connect(
        servers=nats_cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1
    )
    try:
        js = nc.jetstream()
        await js.add_stream(name="R3", subjects=["r3.>"], num_replicas=3)
        await _publish_once_elected(js, "r3.0", b"m0")
        await js.publish("r3.1", b"m1")
        leader = await asyncio.to_thread(nats_cluster.stream_leader, "R3")
        info = await js.stream_info("R3")
        assert info.cluster is not None
        assert info.cluster.leader == leader.server_name

        leader.kill()
        successor = await asyncio.to_thread(nats_cluster.stream_leader, "R3", "$G", 20.0)

        assert successor is not leader
        await js.publish("r3.2", b"m2", timeout=5.0)
        info = await js.stream_info("R3")
        assert info.state.messages == 3
        assert info.cluster is not None
        assert info.cluster.leader == successor.server_name

        await asyncio.to_thread(leader.restart)
        await asyncio.to_thread(
            wait_until,
            lambda: _stored(leader, "R3") == 3,
            timeout=10.0,
            what="the restarted node to catch up",
        )
    finally:
        await nc.close()


async def _publish_once_elected(
    js: JetStreamContext, subject: str, payload: bytes, within_s: float = 10.0
) -> None:
    """The first publish to a new R3 stream, sent again while nobody answers for it yet.

    The first publish right after `add_stream` got a 503 (no responders: nothing answered
    for the stream yet) once in a clean-clone CI run on nats-server 2.15.1, under the
    suite's load; not reproduced alone (0 of 40 new R3 streams on 2.15.1 and on 2.9.10,
    with two busy loops beside). A 503 means nothing stored the message, so sending it
    again stores it once.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            await js.publish(subject, payload)
            return
        except NoStreamResponseError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def _stored(node: NatsServer, stream: str) -> int:
    """How many messages `node`'s own replica of `stream` holds (0 if it has none yet)."""
    report = node.jsz({"accounts": "true", "streams": "true"})
    for details in report.get("account_details") or []:
        for info in details.get("stream_detail") or []:
            if info["name"] == stream:
                return int(info["state"]["messages"])
    return 0
