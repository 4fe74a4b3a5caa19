"""Escalations and receipts are believed only when a trusted worker signed them (issue 24,
finding 4 and the medium findings about receipts). Each test replays an attack against real
worker processes, NATS, Redis, the fake Hermes and the real `aip-hermes-worker` CLI:

* an escalation forged by someone with publish rights on the escalations subject, naming a
  real paused run with its prompt replaced by "ls -la (harmless)", is not listed, not shown,
  not resolvable and not counted by the `escalations_open` gauge;
* `escalations show` displays what the run's operator binding waits on, not the escalation's
  text;
* a receipt forged onto an Action's audit subject is excluded from `audit` and reported with
  its stream sequence; a malformed one is skipped and reported, and `audit` still prints the
  chain.
"""

from __future__ import annotations

import asyncio
import json
import secrets

import msgspec
from redis.asyncio import Redis

from schemas.audit import Receipt, ReceiptEvent
from schemas.escalation import Escalation, EscalationResolution, ResolutionKind
from schemas.result import ResultStatus
from tests.aip_wire import aip_receipt, receipt_envelope
from tests.integration.stack import ENDPOINT, Stack
from tests.integration.test_escalations import APPROVAL_POST, cli, escalations, resolve
from tests.integration.test_escalations_open import _scrape, open_count, value
from worker.aip.signing import AipSigner
from worker.commands.exit_codes import Exit
from worker.escalation.ledger import read_resolution
from worker.operator.binding import decode_binding
from worker.store.keys import binding_key
from worker.store.operator_store import OperatorStore
from worker.testing.identities import APPROVER_UNTENANTED
from worker.testing.scenario import NEEDS_APPROVAL
from worker.testing.services import free_port
from worker.trust.signing import generate_keypair
from worker.wire.escalations import encode_escalation, encode_resolution

HARMLESS = "ls -la (harmless)"


async def paused_run(stack: Stack, **env: str) -> Escalation:
    """A real operator run paused on an approval by a real worker; its one escalation."""
    await stack.spawn("w1", **env)
    source = stack.action("operator", {"objective": f"{NEEDS_APPROVAL} tidy the files"})
    await stack.approve(source)
    paused = await (await stack.publish(source)).result(timeout_s=60)
    assert paused.status is ResultStatus.REQUIRES_HUMAN, paused.error
    [escalation] = await escalations(stack)
    assert escalation.approval is not None
    return escalation


def forged_from(real: Escalation) -> Escalation:
    """What the attacker published: the real run and principal, a harmless-looking prompt."""
    assert real.approval is not None
    approval = msgspec.structs.replace(
        real.approval,
        prompt={"event": "approval.request", "description": HARMLESS, "command": HARMLESS},
    )
    return msgspec.structs.replace(
        real, escalation_id="esc_" + secrets.token_hex(16), approval=approval
    )


async def publish_forged(stack: Stack, forged: Escalation) -> None:
    """An escalation Envelope signed with a key no one trusts (an unsigned copy is refused
    the same way)."""
    untrusted = AipSigner.from_nkey_seed(generate_keypair().seed)
    await stack.nc.jetstream().publish(
        stack.subjects.escalations(ENDPOINT),
        encode_escalation(forged, signer=untrusted),
        headers={"Nats-Msg-Id": forged.escalation_id},
    )


async def test_a_forged_escalation_is_not_listed_counted_shown_or_resolvable(
    stack: Stack,
) -> None:
    port = free_port()
    real = await paused_run(
        stack, AIPD_METRICS_PORT=str(port), AIPD_ESCALATIONS_OPEN_REFRESH_MS="0"
    )
    forged = forged_from(real)
    await publish_forged(stack, forged)
    # An unsigned copy under another id too: both are what a worker credential can publish.
    unsigned = msgspec.structs.replace(forged, escalation_id="esc_" + secrets.token_hex(16))
    await stack.nc.jetstream().publish(
        stack.subjects.escalations(ENDPOINT),
        encode_escalation(unsigned, signer=None),
        headers={"Nats-Msg-Id": unsigned.escalation_id},
    )

    # And a forged resolution copy that would hide the real one as answered.
    hidden = EscalationResolution(
        escalation_id=real.escalation_id,
        action_id=real.action_id,
        endpoint_id=ENDPOINT,
        kind=ResolutionKind.ACKNOWLEDGED,
        resolved_by="ops:nobody",
        reason="nothing to do",
        resolved_at_unix_ms=real.raised_at_unix_ms + 1,
    )
    await stack.nc.jetstream().publish(
        stack.subjects.escalation_resolutions(ENDPOINT),
        encode_resolution(hidden, signer=None),
        headers={"Nats-Msg-Id": f"{real.escalation_id}:resolved"},
    )

    code, out, err = await cli(stack, "escalations", "list", "--endpoint", ENDPOINT, "--all")
    assert code == 0, err
    [listed] = out.splitlines()
    assert listed.startswith(f"{real.escalation_id} ")
    assert " open " in listed, listed  # Redis holds no resolution: the copy was forged
    assert forged.escalation_id not in out, out
    assert unsigned.escalation_id not in out, out
    assert HARMLESS not in out
    assert f"ignored {forged.escalation_id}: not signed by a trusted worker" in err, err
    assert f"ignored {unsigned.escalation_id}: not signed by a trusted worker" in err, err

    code, out, err = await cli(
        stack, "escalations", "show", forged.escalation_id, "--endpoint", ENDPOINT
    )
    assert code == 1, (out, err)
    assert out == ""
    assert "not signed by a trusted worker" in err, err

    key = str(stack.trust.approver_seed_files[APPROVER_UNTENANTED])
    code, out, err = await resolve(
        stack, forged.escalation_id, "--as", APPROVER_UNTENANTED, "--key", key,
        "--choice", "once", "--sign-key", str(stack.trust.seed_file),
    )  # fmt: skip
    assert code == Exit.REFUSED, (out, err)
    assert "not signed by a trusted worker" in err, err

    # Nothing was decided, recorded or sent: no resolution, no resume, no answer to Hermes.
    redis = Redis.from_url(stack.redis_url)
    try:
        assert await read_resolution(redis, forged.escalation_id) is None
    finally:
        await redis.aclose()
    assert [r for r in await escalations(stack) if r.escalation_id != real.escalation_id] == [
        forged,
        unsigned,
    ]  # the forgeries are on the stream, and ignored
    assert stack.fake is not None
    assert stack.fake.stats().count(APPROVAL_POST) == 0

    # The gauge of the real worker counts the real escalation only, and says why.
    text = await _scrape(port)
    assert open_count(text, "approval") == 1
    unverified = value(
        text, "aip_hermes_worker_errors_total", where="escalations_open", cause="unverified"
    )
    assert unverified is not None
    assert unverified >= 1


async def test_show_displays_what_the_runs_binding_waits_on_not_the_escalation_text(
    stack: Stack,
) -> None:
    real = await paused_run(stack)
    assert real.approval is not None
    redis = Redis.from_url(stack.redis_url)
    try:
        stored = await OperatorStore(redis).read(binding_key(real.approval.source_action_id))
    finally:
        await redis.aclose()
    assert stored.doc is not None
    binding = decode_binding(stored.doc)
    assert binding.pending_approval is not None

    code, out, err = await cli(
        stack, "escalations", "show", real.escalation_id, "--endpoint", ENDPOINT
    )
    assert code == 0, err
    shown = json.loads(out)
    pending = shown["pending"]
    assert pending["read"] == "ok"
    assert pending["from"].startswith(f"operator binding {binding_key(binding.action_id)}")
    assert pending["prompt"] == binding.pending_approval
    assert pending["status"] == "waiting_for_approval"
    assert pending["matches"] is True
    assert pending["approval_generation"] == real.approval.approval_generation
    assert "pointer only" in shown["note"]

    # `resolve` says what it answers, from the same binding, before it decides.
    key = str(stack.trust.approver_seed_files[APPROVER_UNTENANTED])
    code, out, err = await resolve(
        stack, real.escalation_id, "--as", APPROVER_UNTENANTED, "--key", key,
        "--choice", "once", "--sign-key", str(stack.trust.seed_file),
    )  # fmt: skip
    assert code == 0, err
    assert f"from its operator binding {binding_key(binding.action_id)}" in err, err
    assert json.dumps(binding.pending_approval["description"])[1:-1] in err, err
    resolution = msgspec.json.decode(out, type=EscalationResolution)
    assert resolution.resume_action_id is not None
    resumed = await stack.client.handle(ENDPOINT, resolution.resume_action_id).result(
        timeout_s=60
    )
    assert resumed.status is ResultStatus.COMPLETED, resumed.error


async def _settled_models_action(stack: Stack) -> str:
    await stack.spawn("w1")
    action = stack.action("models")
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    await stack.settled_and_acked(timeout_s=30)
    await asyncio.sleep(0.5)  # the receipts are published after the result, best effort
    return action.id


async def _last_audit_seq(stack: Stack) -> int:
    info = await stack.nc.jetstream().stream_info(stack.subjects.stream_name("audit"))
    assert info.state.last_seq
    return info.state.last_seq


async def test_a_forged_receipt_is_excluded_from_audit_and_reported(stack: Stack) -> None:
    action_id = await _settled_models_action(stack)
    code, before, err = await cli(stack, "audit", action_id, "--endpoint", ENDPOINT, "--json")
    assert code == 0, err
    real = [msgspec.json.decode(line, type=Receipt) for line in before.splitlines()]
    assert ReceiptEvent.SETTLED in {r.event for r in real}

    # What the gateway credential can append: a worker's "settled" decision it never took.
    forged = Receipt(
        receipt_id=f"{action_id}:settled:9:w-forged:0",
        event=ReceiptEvent.SETTLED,
        action_id=action_id,
        endpoint_id=ENDPOINT,
        worker_id="w-forged",
        fence=9,
        ts_unix_ms=real[-1].ts_unix_ms + 1,
        details={"status": "completed", "note": "nothing to see"},
    )
    payload = receipt_envelope(msgspec.to_builtins(forged), seed=None)
    await stack.nc.jetstream().publish(
        stack.subjects.audit(ENDPOINT, action_id),
        payload,
        headers={"Nats-Msg-Id": forged.receipt_id},
    )
    seq = await _last_audit_seq(stack)
    # A genuine receipt signed by a key no trust file names (an AIP signature, built by hand).
    copied = msgspec.structs.replace(real[0], receipt_id=real[0].receipt_id + ":copy")
    copied_payload = receipt_envelope(msgspec.to_builtins(copied), seed=99)
    await stack.nc.jetstream().publish(
        stack.subjects.audit(ENDPOINT, action_id),
        copied_payload,
        headers={"Nats-Msg-Id": copied.receipt_id},
    )

    code, out, err = await cli(stack, "audit", action_id, "--endpoint", ENDPOINT, "--json")
    assert code == 0, err
    shown = [msgspec.json.decode(line, type=Receipt) for line in out.splitlines()]
    assert shown == real
    assert "w-forged" not in out
    assert f"excluded audit seq {seq} ({forged.receipt_id}): unverified" in err, err
    assert f"({copied.receipt_id}): unverified" in err, err

    # Claiming a place in a real segment vouches for nothing: links are walked back from a
    # signed receipt only.
    linked = msgspec.structs.replace(
        forged,
        receipt_id=forged.receipt_id + ":linked",
        prev_sha256=aip_receipt(msgspec.to_builtins(real[-1]))["hash"],
    )
    await stack.nc.jetstream().publish(
        stack.subjects.audit(ENDPOINT, action_id),
        receipt_envelope(msgspec.to_builtins(linked), seed=None),
        headers={"Nats-Msg-Id": linked.receipt_id},
    )
    code, out, err = await cli(stack, "audit", action_id, "--endpoint", ENDPOINT, "--json")
    assert code == 0, err
    assert [msgspec.json.decode(line, type=Receipt) for line in out.splitlines()] == real
    assert f"({linked.receipt_id}): unverified" in err, err


async def test_a_receipt_stored_first_under_a_genuine_id_suppresses_nothing(
    stack: Stack,
) -> None:
    """Receipt ids are predictable (`{action}:{event}:{fence}:{worker}:{n}`). Before the
    Action runs, messages under the ids its `received` receipt can take are stored on its
    audit subject, each with that id as `Nats-Msg-Id`. Workers publish receipts with no
    dedupe id, so the genuine receipt is stored beside them, not dropped as their
    duplicate, and `audit` shows the chain the worker signed."""
    await stack.spawn("w1")
    action = stack.action("models")
    subject = stack.subjects.audit(ENDPOINT, action.id)
    for n in range(64):  # the worker's receipt counter starts at 0
        squatted = Receipt(
            receipt_id=f"{action.id}:received:0:w1:{n}",
            event=ReceiptEvent.RECEIVED,
            action_id=action.id,
            endpoint_id=ENDPOINT,
            worker_id="w1",
            fence=0,
            ts_unix_ms=1,
            details={"note": "squatting"},
        )
        await stack.nc.jetstream().publish(
            subject,
            receipt_envelope(msgspec.to_builtins(squatted), seed=None),
            headers={"Nats-Msg-Id": squatted.receipt_id},
        )
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    await stack.settled_and_acked(timeout_s=30)
    await asyncio.sleep(0.5)  # the receipts are published after the result, best effort
    code, out, err = await cli(stack, "audit", action.id, "--endpoint", ENDPOINT, "--json")
    assert code == 0, err
    shown = [msgspec.json.decode(line, type=Receipt) for line in out.splitlines()]
    received = [r for r in shown if r.event is ReceiptEvent.RECEIVED]
    assert len(received) == 1
    assert received[0].details.get("note") != "squatting"
    assert ReceiptEvent.SETTLED in {r.event for r in shown}
    assert err.count("unverified") >= 64


async def test_a_malformed_receipt_is_skipped_and_audit_still_prints_the_chain(
    stack: Stack,
) -> None:
    action_id = await _settled_models_action(stack)
    await stack.nc.jetstream().publish(
        stack.subjects.audit(ENDPOINT, action_id),
        b'{"receipt_id": 7, "event": "nonsense"}',
        headers={"Nats-Msg-Id": secrets.token_hex(8)},
    )
    seq = await _last_audit_seq(stack)
    code, out, err = await cli(stack, "audit", action_id, "--endpoint", ENDPOINT)
    assert code == 0, (out, err)
    assert "settled" in out, out
    assert "received" in out, out
    assert f"skipped audit seq {seq}: not a receipt" in err, err
