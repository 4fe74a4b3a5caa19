"""Poison envelopes and work-queue hygiene, through a live worker.

A message that fails before its lease fails the same way on every redelivery: it goes to
the DLQ once, and is never nak'd forever (an `act_<32 hex>\\n` id was redelivered to every
worker about once a second). An Action that squats another one's `Nats-Msg-Id` is refused
and visible; Actions for subjects no endpoint serves are not stored at all; a repeated
JSON key is refused. Each test counts deliveries on the work consumer after a quiet spell,
which a redelivery loop (nak delay 200 ms here) would have filled.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import nats
import pytest
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NoStreamResponseError

from schemas.audit import ReceiptEvent
from schemas.errors import EnvelopeRejected
from schemas.result import ResultStatus
from subjects.grammar import Subjects, envelope_msg_id
from subjects.provision import Change, provision
from subjects.streams import StreamPolicy
from tests.integration.stack import ENDPOINT, Stack, provision_streams
from worker.bus.audit import AuditLog
from worker.bus.publisher import BusPublisher
from worker.client import AipClient
from worker.testing.services import ServiceHandle

MODELS = "GET /v1/models"
#: Long enough for a nak'd message (200 ms nak delay) to come back many times.
QUIET_S = 3.0


async def _signed_raw(stack: Stack, payload: bytes, msg_id: str) -> None:
    """Publish Action Envelope bytes (signed inside, or not) under `msg_id`."""
    headers = {"Nats-Msg-Id": msg_id}
    await stack.nc.jetstream().publish(stack.subjects.actions(ENDPOINT), payload, headers=headers)


async def test_a_newline_id_and_a_repeated_key_are_dead_lettered_once_and_work_goes_on(
    stack: Stack,
) -> None:
    worker = await stack.spawn("w1")
    before = stack.action("models")
    assert (await (await stack.publish(before)).result(timeout_s=20)).status.value == "completed"
    newline = stack.action("models")
    document = stack.envelope_document(newline)
    document["body"]["action"]["id"] += "\n"  # signed by the gateway: only the id is wrong
    newline_payload = stack.sign_document(document)
    await _signed_raw(stack, newline_payload, newline.id)
    repeated = stack.action("models")
    sealed = stack.trust.seal_action(repeated)
    repeated_payload = sealed.replace(b'"mode":"async"', b'"mode":"sync","mode":"async"', 1)
    assert repeated_payload != sealed
    await _signed_raw(stack, repeated_payload, repeated.id)
    after = stack.action("models")
    assert (await (await stack.publish(after)).result(timeout_s=20)).status.value == "completed"

    await asyncio.sleep(QUIET_S)
    info = await stack.settled_and_acked()
    assert info.delivered.consumer_seq == 4  # each of the four delivered exactly once
    assert info.num_redelivered == 0
    dead = await stack.dlq()
    assert [body for body, _ in dead] == [newline_payload, repeated_payload]
    assert [h["code"] for _, h in dead] == ["schema.envelope.invalid", "envelope.decode.invalid"]
    assert "repeats a key" in dead[1][1]["reason"]
    assert stack.fake.stats().count(MODELS) == 2
    for action in (before, after):  # receipts of other Actions kept flowing
        events = [r.event for r in await stack.receipts(action.id)]
        assert ReceiptEvent.RECEIVED in events
        assert ReceiptEvent.SETTLED in events
    assert await stack.receipts(repeated.id) == []
    log = worker.log_text()
    assert "redelivering later" not in log
    assert "Traceback" not in log
    assert worker.alive


async def test_an_unexpected_failure_before_the_lease_is_dead_lettered_once(
    stack: Stack,
) -> None:
    poison = stack.action("models")
    # A bug this one envelope triggers after decoding, before any lease: before, the
    # delivery was nak'd and came back to every worker, forever.
    worker = await stack.spawn("w1", fault_points=f"after_decode=raise@{poison.id}")
    await stack.publish(poison)
    good = await (await stack.publish(stack.action("models"))).result(timeout_s=20)
    assert good.status is ResultStatus.COMPLETED
    await asyncio.sleep(QUIET_S)
    info = await stack.settled_and_acked()
    assert info.delivered.consumer_seq == 2
    assert info.num_redelivered == 0
    [(body, headers)] = await stack.dlq()
    assert body == stack.trust.seal_action(poison)
    assert headers["code"] == "connector_host.execution"
    assert "FaultRaised" in headers["reason"]
    assert worker.log_text().count("failed before its lease") == 1
    assert stack.fake.stats().count(MODELS) == 1
    assert await stack.results(poison.id) == []


async def test_the_client_refuses_the_ids_the_worker_would_refuse(stack: Stack) -> None:
    bad = stack.client.build_action(
        endpoint_id=ENDPOINT,
        operation="models",
        input={},
        principal_id="user:demo",
        action_id="act_" + "a" * 32 + "\n",
    )
    with pytest.raises(EnvelopeRejected) as refused:
        await stack.client.publish(bad)
    assert refused.value.code.value == "schema.envelope.invalid"
    info = await stack.nc.jetstream().stream_info(stack.subjects.stream_name("actions"))
    assert info.state.messages == 0


async def test_the_client_and_cli_refuse_an_envelope_over_the_deployments_limit(
    stack: Stack,
) -> None:
    """A deployment whose workers take envelopes up to AIPD_MAX_ENVELOPE_BYTES (here 2 KiB):
    the client checks that limit, not the 1 MiB default, so it never publishes an Action the
    workers would dead-letter for its size."""
    input = {"text": "x" * 4096}  # ~4 KiB: under the default, over this deployment's limit
    limited = AipClient(stack.nc, sign_key=stack.client.sign_key, max_envelope_bytes=2048)
    big = limited.build_action(
        endpoint_id=ENDPOINT, operation="models", input=input, principal_id="user:demo"
    )
    with pytest.raises(EnvelopeRejected) as refused:
        await limited.publish(big)
    assert refused.value.code.value == "envelope.decode.invalid"  # refused before parsing
    assert "2048-byte limit" in refused.value.reason

    submitted = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "worker", "submit", "--nats-url", stack.nats_url,
         "--endpoint", ENDPOINT, "--operation", "models", "--principal", "user:demo",
         "--input", json.dumps(input), "--sign-key", str(stack.trust.seed_file)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "AIPD_MAX_ENVELOPE_BYTES": "2048"},
    )  # fmt: skip
    assert submitted.returncode == 6, submitted.stderr  # Exit.REFUSED, nothing sent
    assert "2048-byte limit" in submitted.stderr
    info = await stack.nc.jetstream().stream_info(stack.subjects.stream_name("actions"))
    assert info.state.messages == 0


async def test_an_action_squatting_another_actions_id_cannot_pre_empt_it(
    stack: Stack,
) -> None:
    """Issue 27: the dedupe id is bound to the envelope's bytes, so a squatter publishing
    first under the victim's Action id (its old `Nats-Msg-Id`) takes no dedupe slot of the
    victim's: the squatter is dead-lettered, the victim is stored and runs once."""
    await stack.spawn("w1")
    victim = stack.action("models")
    squatter = stack.action("models")
    await stack.publish(squatter, msg_id=victim.id)  # signed, valid, but Msg-Id = victim's id
    handle = await stack.client.publish(victim)
    assert not handle.duplicate
    assert (await handle.result(timeout_s=20)).status is ResultStatus.COMPLETED
    await stack.settled_and_acked()
    [(_, headers)] = await stack.dlq()
    assert headers["code"] == "connector_host.replay"
    assert victim.id in headers["reason"]
    chain = [r.event for r in await stack.receipts(squatter.id)]
    assert chain == [ReceiptEvent.DEAD_LETTERED]
    assert len(await stack.results(victim.id)) == 1
    assert stack.fake.stats().count(MODELS) == 1


async def test_actions_for_subjects_no_endpoint_serves_are_never_stored(stack: Stack) -> None:
    js = stack.nc.jetstream()
    action = stack.action("models")
    payload = stack.trust.seal_action(action)
    headers = {"Nats-Msg-Id": envelope_msg_id(action.id, payload)}
    for subject in (
        "aip.hermes.*.actions",
        "aip.hermes.unconfigured.actions",
        "aip.hermes.*.delegations",
        "aip.hermes.unconfigured.delegations",
    ):
        with pytest.raises(NoStreamResponseError):
            await js.publish(subject, payload, headers=headers)
    for kind in ("actions", "delegations"):
        info = await js.stream_info(stack.subjects.stream_name(kind))
        assert info.state.messages == 0
        assert info.config.subjects == [f"aip.hermes.{ENDPOINT}.{kind}"]


async def test_provision_narrows_a_wildcard_work_queue_and_keeps_other_pools_endpoints(
    nats_server: ServiceHandle,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(  # as every earlier release provisioned it
            StreamConfig(
                name="AIP_HERMES_ACTIONS",
                subjects=["aip.hermes.*.actions"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=120.0,
            )
        )
        first = await provision(js, Subjects(), ["h1"], StreamPolicy())
        [actions] = [i for i in first if i.name == "AIP_HERMES_ACTIONS"]
        assert actions.change is Change.UPDATED
        await provision(js, Subjects(), ["h2"], StreamPolicy())  # another pool's endpoints
        info = await js.stream_info("AIP_HERMES_ACTIONS")
        assert info.config.subjects == ["aip.hermes.h1.actions", "aip.hermes.h2.actions"]
        again = await provision(js, Subjects(), ["h1", "h2"], StreamPolicy())
        assert {i.change for i in again} == {Change.UNCHANGED}
    finally:
        await nc.close()


async def test_the_audit_sender_survives_a_receipt_it_cannot_send(
    nats_server: ServiceHandle,
) -> None:
    await provision_streams(nats_server.url)
    nc = await nats.connect(nats_server.url)
    try:
        audit = AuditLog(BusPublisher(nc.jetstream(), Subjects(), nc=nc), "w-test")
        good = "act_" + "b" * 32
        audit.emit(ReceiptEvent.RECEIVED, action_id="act_" + "a" * 32 + "\n", endpoint_id=ENDPOINT)
        audit.emit(ReceiptEvent.RECEIVED, action_id=good, endpoint_id=ENDPOINT)
        audit.emit(ReceiptEvent.SETTLED, action_id=good, endpoint_id=ENDPOINT)
        await audit.drain()
        await nc.flush()
        receipts = await AipClient(nc).receipts(ENDPOINT, good)
        assert [r.event for r in receipts] == [ReceiptEvent.RECEIVED, ReceiptEvent.SETTLED]
    finally:
        await nc.close()
