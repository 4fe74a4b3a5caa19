"""The cancel subject against the AIP rules, through a live worker: a Cancel Envelope written
by hand and signed with PyNaCl (tests/aip_actions.py, nothing of `worker.wire`), and the
answers read as plain JSON and verified with PyNaCl against the worker's key
(shared/reference/aip-1.0-wire.md §1.8, §2.2, §2.6, §7.6).

AIP answers a Cancel with the Action's ActionResult (`cancelled` once the cancel settles it,
or the terminal result it already had) or an `aip.core.v1.error` Envelope; a forged,
unsigned, or other principal's Cancel is refused and cancels nothing, and bad input gets a
typed error, never a crash.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from typing import Any

import nacl.signing

from schemas.result import ResultStatus
from tests.aip_actions import (
    cancel_envelope,
    canonical,
    did_of,
    key_of_nkey_seed,
    sign,
)
from tests.aip_wire import envelope, extension
from tests.integration.stack import ENDPOINT, Stack
from worker.testing.identities import USER_B, USER_UNTENANTED
from worker.testing.scenario import SLOW_REPLY

POST_RUNS = "POST /v1/runs"
STOP = "POST /v1/runs/{run_id}/stop"
OWNER = {"id": USER_UNTENANTED, "kind": "human"}


def _worker_key(stack: Stack) -> nacl.signing.SigningKey:
    return key_of_nkey_seed(stack.trust.worker_seed_file.read_bytes())


def _verified_by(answer: dict[str, Any], key: nacl.signing.SigningKey) -> None:
    """§2.2: `security.did` and `from.did` name the key, whose Ed25519 signature covers the
    canonical Envelope without `security.signature` (PyNaCl raises otherwise)."""
    assert answer["security"]["did"] == answer["from"]["did"] == did_of(key)
    covered = copy.deepcopy(answer)
    signature = base64.b64decode(covered["security"].pop("signature"))
    key.verify_key.verify(canonical(covered), signature)


def _answers(answer: dict[str, Any], cancel: dict[str, Any]) -> None:
    """The reply recipe (§2.6): bound to the Cancel, from the worker."""
    assert answer["in_response_to"] == cancel["message_id"]
    assert answer["to"] == cancel["from"]
    assert answer["correlation_id"] == cancel["correlation_id"]
    assert {k: answer["from"][k] for k in ("id", "kind")} == {
        "id": f"agent:hermes_operator:{ENDPOINT}",
        "kind": "agent",
    }


async def _ask(stack: Stack, data: bytes, timeout: float = 30) -> dict[str, Any]:
    reply = await stack.nc.request(stack.subjects.cancel(ENDPOINT), data, timeout=timeout)
    return envelope(reply.data)


def _error(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["message_type"] == "aip.core.v1.error", answer
    error: dict[str, Any] = answer["body"]["error"]["error"]
    return error


async def _running(stack: Stack) -> None:
    assert stack.fake is not None
    while stack.fake.stats().count(POST_RUNS) == 0:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


async def test_a_signed_cancel_envelope_cancels_a_running_objective_and_is_answered_with_its_result(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action, handle = await stack.operator(f"{SLOW_REPLY} stop me by the rules")
    await _running(stack)
    gateway = key_of_nkey_seed(stack.trust.seed)
    cancel = sign(cancel_envelope(action.id, reason="changed my mind"), gateway, OWNER)
    answer = await _ask(stack, canonical(cancel))
    assert answer["message_type"] == "aip.core.v1.action_result", answer
    _answers(answer, cancel)
    _verified_by(answer, _worker_key(stack))
    body = answer["body"]["action_result"]
    assert (body["action_id"], body["status"]) == (action.id, "cancelled")
    assert extension(answer)["endpoint_id"] == ENDPOINT
    # What the worker found: the intent recorded, the operator binding cancelling.
    assert extension(answer)["cancel"] == {"accepted": True, "state": "cancelling"}
    # The same outcome as the result the worker published on the results subject.
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.CANCELLED
    assert stack.fake is not None
    assert stack.fake.stats().count(STOP) == 1
    # Asked again, the Action has ended: its terminal result at once, bound to this Cancel.
    again = sign(cancel_envelope(action.id), gateway, OWNER)
    answer = await _ask(stack, canonical(again))
    _answers(answer, again)
    _verified_by(answer, _worker_key(stack))
    assert answer["body"]["action_result"]["status"] == "cancelled"
    assert extension(answer)["cancel"]["accepted"] is False


async def test_a_cancel_of_a_finished_action_returns_its_terminal_result(stack: Stack) -> None:
    await stack.spawn("w1")
    action = stack.action("models")
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    cancel = sign(
        cancel_envelope(action.id, wait_ms=0), key_of_nkey_seed(stack.trust.seed), OWNER
    )
    answer = await _ask(stack, canonical(cancel))
    assert answer["message_type"] == "aip.core.v1.action_result", answer
    _answers(answer, cancel)
    _verified_by(answer, _worker_key(stack))
    assert answer["body"]["action_result"]["status"] == "completed"
    assert answer["body"]["action_result"].get("output") == result.output


async def test_a_signed_cancel_sent_again_is_refused_as_a_replay(stack: Stack) -> None:
    """Each request Envelope's `message_id` is claimed once (AIP gateways do the same): a
    captured signed Cancel sent again within its `sent_at` window gets
    `connector_host.replay`, not the Action's result."""
    await stack.spawn("w1")
    action = stack.action("models")
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED
    cancel = sign(
        cancel_envelope(action.id, wait_ms=0), key_of_nkey_seed(stack.trust.seed), OWNER
    )
    first = await _ask(stack, canonical(cancel))
    assert first["message_type"] == "aip.core.v1.action_result", first
    again = await _ask(stack, canonical(cancel))
    _answers(again, cancel)
    _verified_by(again, _worker_key(stack))
    error = _error(again)
    assert (error["code"], error["retryable"]) == ("connector_host.replay", False)
    assert "action_result" not in again["body"]


async def test_forged_unsigned_and_other_principals_cancels_are_refused_and_change_nothing(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action, handle = await stack.operator(f"{SLOW_REPLY} nobody may stop this")
    await _running(stack)
    gateway = key_of_nkey_seed(stack.trust.seed)
    untrusted = nacl.signing.SigningKey.generate()
    unsigned = cancel_envelope(action.id)
    unsigned["from"] = dict(OWNER)
    tampered = sign(cancel_envelope(action.id), gateway, OWNER)
    tampered["body"]["cancel"]["reason"] = "added after signing"
    cases = {
        "unsigned": (unsigned, "connector_host.authentication"),
        "untrusted key": (
            sign(cancel_envelope(action.id), untrusted, OWNER),
            "connector_host.authentication",
        ),
        "altered after signing": (tampered, "connector_host.authentication"),
        "another principal": (
            sign(cancel_envelope(action.id), gateway, {"id": USER_B, "kind": "human"}),
            "connector_host.approval_authorization_conflict",
        ),
        "unknown principal": (
            sign(cancel_envelope(action.id), gateway, {"id": "user:nobody", "kind": "human"}),
            "connector_host.authentication",
        ),
    }
    for name, (cancel, code) in cases.items():
        answer = await _ask(stack, canonical(cancel))
        error = _error(answer)
        assert (error["code"], error["retryable"]) == (code, False), name
        assert extension(answer)["cancel"]["accepted"] is False, name
        assert answer["in_response_to"] == cancel["message_id"], name
        _verified_by(answer, _worker_key(stack))
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert stack.fake is not None
    assert stack.fake.stats().count(STOP) == 0


async def test_bad_cancel_input_gets_a_typed_error_and_the_worker_serves_on(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    action = stack.action("models")
    gateway = key_of_nkey_seed(stack.trust.seed)
    unknown_field = cancel_envelope(action.id)
    unknown_field["body"]["cancel"]["action_id"] = action.id
    wrong_body_key = cancel_envelope(action.id)
    wrong_body_key["body"] = {"action": wrong_body_key["body"]["cancel"]}
    session = cancel_envelope(action.id)
    session["body"]["cancel"]["target"] = {"session": "sess_" + "0" * 32}
    bad_id = cancel_envelope(action.id + "\n")
    other_type = cancel_envelope(action.id)
    other_type["message_type"] = "aip.core.v1.action"
    other_type["body"] = {"action": other_type["body"]["cancel"]}
    inputs: dict[str, tuple[bytes, str]] = {
        "not JSON": (b"cancel act_123", "envelope.decode.invalid"),
        "a repeated key": (
            canonical(sign(cancel_envelope(action.id), gateway, OWNER)).replace(
                b'{"aip_version":"1.0",', b'{"aip_version":"1.0","aip_version":"1.0",'
            ),
            "envelope.decode.invalid",
        ),
        "unknown body field": (
            canonical(sign(unknown_field, gateway, OWNER)),
            "schema.envelope.invalid",
        ),
        "wrong body key": (
            canonical(sign(wrong_body_key, gateway, OWNER)),
            "schema.envelope.invalid",
        ),
        "session target": (canonical(sign(session, gateway, OWNER)), "schema.envelope.invalid"),
        "malformed action id": (canonical(sign(bad_id, gateway, OWNER)), "schema.envelope.invalid"),
        "an Action Envelope": (
            canonical(sign(other_type, gateway, OWNER)),
            "schema.envelope.invalid",
        ),
    }
    for name, (data, code) in inputs.items():
        answer = await _ask(stack, data)
        error = _error(answer)
        assert (error["code"], error["category"], error["retryable"]) == (
            code,
            "permanent",
            False,
        ), name
        _verified_by(answer, _worker_key(stack))
    # A stale Cancel (sent long ago) is refused as a replay.
    stale = cancel_envelope(action.id)
    stale["sent_at"] = "2020-01-01T00:00:00Z"
    error = _error(await _ask(stack, canonical(sign(stale, gateway, OWNER))))
    assert error["code"] == "connector_host.replay"
    # The worker is still there and runs work.
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED


async def test_a_cancel_waiting_for_its_action_holds_up_no_other_cancel(stack: Stack) -> None:
    """The answer waits for the settle (bounded by `wait_ms`) off the subscription every
    cancel of the endpoint shares: a Cancel of an Action nobody holds waits out its wait,
    and meanwhile a Cancel of a finished Action is answered at once."""
    await stack.spawn("w1")
    finished = stack.action("models")
    assert (await (await stack.publish(finished)).result(timeout_s=30)).status is (
        ResultStatus.COMPLETED
    )
    gateway = key_of_nkey_seed(stack.trust.seed)
    never = stack.action("models")  # never published: no worker will hold it
    waiting = asyncio.get_running_loop().create_task(
        _ask(stack, canonical(sign(cancel_envelope(never.id, wait_ms=4000), gateway, OWNER)))
    )
    await asyncio.sleep(0.5)
    started = asyncio.get_running_loop().time()
    quick = await _ask(stack, canonical(sign(cancel_envelope(finished.id), gateway, OWNER)))
    assert asyncio.get_running_loop().time() - started < 2.0
    assert quick["body"]["action_result"]["status"] == "completed"
    assert not waiting.done()
    answer = await waiting
    error = _error(answer)
    assert (error["code"], error["retryable"]) == ("connector_host.not_ready", True)
    assert extension(answer)["cancel"] == {"accepted": True, "state": "pending"}
