"""`dlq list | show | replay | discard` against real workers, NATS and the fake Hermes.

An Action is dead-lettered the way a publisher's mistake does it (its `Nats-Msg-Id` is not
its id: `connector_host.replay`, nothing recorded). `replay` publishes it again under a
new id, signed, and it runs exactly once by the fake Hermes' request log, however often
`replay` is run; the entry leaves the DLQ and its audit chain holds the `dlq_replayed`
receipt naming the new id. `discard` removes an entry with a `dlq_discarded` receipt.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from schemas.audit import ReceiptEvent
from schemas.result import ResultStatus
from tests.aip_wire import dead_letter_envelope
from tests.integration.stack import ENDPOINT, Stack

MODELS = "GET /v1/models"


async def cli(stack: Stack, *args: str) -> tuple[int, str, str]:
    """`python -m worker ARGS` with the workers' settings and the gateway's key."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", *args,
        env={
            **os.environ, **stack.env,
            "AIPD_GATEWAY_SIGNING_KEY_FILE": str(stack.trust.seed_file),
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _dead_letter(stack: Stack) -> tuple[str, str]:
    """Publish a `models` Action under another `Nats-Msg-Id`; its (action id, DLQ id)."""
    action = stack.action("models")
    before = len(await stack.dlq())
    await stack.publish(action, msg_id="not-its-own-id")
    for _ in range(200):
        entries = await stack.dlq()
        if len(entries) > before:
            _, headers = entries[-1]
            assert headers["code"] == "connector_host.replay", headers
            return action.id, headers["dlq_id"]
        await asyncio.sleep(0.1)
    raise AssertionError("the Action was not dead-lettered")


async def test_replay_runs_the_action_exactly_once_and_removes_the_entry(stack: Stack) -> None:
    assert stack.fake is not None
    await stack.spawn("w1")
    original_id, dlq_id = await _dead_letter(stack)
    assert stack.fake.stats().count(MODELS) == 0

    code, out, err = await cli(stack, "dlq", "list", "--endpoint", ENDPOINT, "--json")
    assert code == 0, err
    [listed] = [json.loads(line) for line in out.splitlines()]
    assert listed["dlq_id"] == dlq_id
    assert listed["code"] == "connector_host.replay"
    assert "Nats-Msg-Id" in listed["reason"]
    assert listed["signed_by"]

    code, out, err = await cli(stack, "dlq", "show", dlq_id, "--endpoint", ENDPOINT)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["envelope"]["body"]["action"]["id"] == original_id  # the AIP Envelope
    assert shown["replay"] == "replayable"

    code, out, err = await cli(
        stack, "dlq", "replay", dlq_id, "--endpoint", ENDPOINT,
        "--as", "ops:alice", "--reason", "publisher fixed its Nats-Msg-Id",
    )
    assert code == 0, err
    replay_id = out.strip()
    assert replay_id.startswith("act_")
    assert replay_id != original_id
    result = await stack.client.handle(ENDPOINT, replay_id).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert await stack.dlq() == []

    # Run again (as after a crash, or by a second person): nothing is left to replay.
    code, _, err = await cli(
        stack, "dlq", "replay", dlq_id, "--endpoint", ENDPOINT, "--as", "ops:bob",
        "--reason", "again",
    )
    assert code == 1
    assert f"no DLQ entry {dlq_id}" in err
    await asyncio.sleep(1.0)
    assert stack.fake.stats().count(MODELS) == 1
    assert len(await stack.results(replay_id)) == 1

    [replayed] = [
        r for r in await stack.receipts(dlq_id) if r.event is ReceiptEvent.DLQ_REPLAYED
    ]
    assert replayed.details["replay_action_id"] == replay_id
    assert replayed.details["original_action_id"] == original_id
    assert replayed.details["by"] == "ops:alice"
    code, out, err = await cli(
        stack, "audit", dlq_id, "--endpoint", ENDPOINT, "--json",
        "--trusted-gateway-keys", str(stack.trust.gateway_keys_file),
    )
    assert code == 0, err
    assert "dlq_replayed" in out, (out, err)


async def test_a_replay_interrupted_after_its_receipt_reuses_the_recorded_id(
    stack: Stack,
) -> None:
    """The receipt is filed before the publish: a replay that stopped after it (here: the
    entry could not be deleted, simulated by planting the receipt) publishes the same id."""
    from worker.commands.dlq_admin import file_receipt
    from worker.trust.signing import read_seed_file

    assert stack.fake is not None
    await stack.spawn("w1")
    _, dlq_id = await _dead_letter(stack)
    planted = "act_" + "5" * 32
    await file_receipt(
        stack.nc.jetstream(), stack.subjects, ENDPOINT, dlq_id, ReceiptEvent.DLQ_REPLAYED,
        read_seed_file(stack.trust.seed_file), replay_action_id=planted,
        original_action_id="x", code="c", by="ops:alice", reason="first try",
    )
    code, out, err = await cli(
        stack, "dlq", "replay", dlq_id, "--endpoint", ENDPOINT, "--as", "ops:alice",
        "--reason", "second try",
    )
    assert code == 0, err
    assert out.strip() == planted
    result = await stack.client.handle(ENDPOINT, planted).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert stack.fake.stats().count(MODELS) == 1


async def test_a_receipt_signed_by_another_key_is_not_believed(stack: Stack) -> None:
    from worker.commands.dlq_admin import file_receipt
    from worker.trust.signing import generate_keypair

    await stack.spawn("w1")
    _, dlq_id = await _dead_letter(stack)
    squatted = "act_" + "6" * 32
    other_seed = generate_keypair().seed
    await file_receipt(
        stack.nc.jetstream(), stack.subjects, ENDPOINT, dlq_id, ReceiptEvent.DLQ_REPLAYED,
        other_seed, replay_action_id=squatted, original_action_id="x", code="c",
        by="mallory", reason="squat",
    )
    code, out, err = await cli(
        stack, "dlq", "replay", dlq_id, "--endpoint", ENDPOINT, "--as", "ops:alice",
        "--reason", "fixed",
    )
    assert code == 0, err
    assert out.strip() != squatted


async def test_discard_removes_the_entry_with_a_receipt(stack: Stack) -> None:
    assert stack.fake is not None
    await stack.spawn("w1")
    _, dlq_id = await _dead_letter(stack)
    code, _, err = await cli(
        stack, "dlq", "discard", dlq_id, "--endpoint", ENDPOINT,
        "--as", "ops:alice", "--reason", "junk from a test publisher",
    )
    assert code == 0, err
    assert await stack.dlq() == []
    [discarded] = [
        r for r in await stack.receipts(dlq_id) if r.event is ReceiptEvent.DLQ_DISCARDED
    ]
    assert discarded.details["reason"] == "junk from a test publisher"
    code, _, err = await cli(
        stack, "dlq", "discard", dlq_id, "--endpoint", ENDPOINT, "--as", "a", "--reason", "b"
    )
    assert code == 1
    assert "no DLQ entry" in err
    assert "Traceback" not in err
    assert stack.fake.stats().count(MODELS) == 0


async def test_an_entry_not_signed_by_a_trusted_worker_is_never_shown(stack: Stack) -> None:
    """Junk, and a well-formed entry signed by a key no trust file names (built from the
    AIP rules by hand), are each reported and skipped; neither can be replayed."""
    forged = dead_letter_envelope(
        dlq_id="dlq_" + "7" * 32, endpoint_id=ENDPOINT, kept=b'{"id": "act_x"}', seed=99
    )
    for data in (b"{}", forged):
        await stack.nc.jetstream().publish(stack.subjects.dlq(ENDPOINT), data)
    code, out, err = await cli(stack, "dlq", "list", "--endpoint", ENDPOINT, "--json")
    assert code == 0, err
    assert out == ""
    assert err.count("not an entry a trusted worker signed") == 2, err
    assert "is not a trusted worker key" in err
    code, _, err = await cli(
        stack, "dlq", "replay", "dlq_" + "7" * 32, "--endpoint", ENDPOINT, "--as", "a",
        "--reason", "b",
    )
    assert code == 1
    assert "no DLQ entry" in err


async def test_configuration_mistakes_exit_2_with_one_line(stack: Stack, tmp_path: object) -> None:
    """No gateway key to sign the replay, no trusted worker keys: exit 2, one line."""
    dlq_id = "dlq_" + "8" * 32
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "dlq", "replay", dlq_id, "--endpoint", ENDPOINT,
        "--as", "a", "--reason", "b",
        env={k: v for k, v in {**os.environ, **stack.env}.items()
             if k != "AIPD_GATEWAY_SIGNING_KEY_FILE"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2, err
    assert err.decode().strip() == (
        "error: a replay is signed with the gateway's key: pass --sign-key or set "
        "AIPD_GATEWAY_SIGNING_KEY_FILE"
    )
    env = {k: v for k, v in {**os.environ, **stack.env}.items()
           if k != "AIPD_TRUSTED_WORKER_KEYS_FILE"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker", "dlq", "list", "--endpoint", ENDPOINT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2, err
    assert "set AIPD_TRUSTED_WORKER_KEYS_FILE" in err.decode()
    assert len(err.decode().strip().splitlines()) == 1
