"""The native NATS binding `aip.native.nats.v1` driven by an independent AIP client.

Real NATS and Redis, a worker serving endpoint h1 over the fake Hermes, and a
`python -m worker gateway` process with a trusted-signers file. The client builds every
request from the AIP rules alone (tests/aip_actions.py: dicts, canonical JSON, PyNaCl,
did:key by hand), sends it as a core NATS request on the sanitised subject, and checks every
answer's schema (jsonschema against schemas/json/ where one exists), its signature (PyNaCl
over the canonical bytes, by the gateway key) and its correlation (the reply recipe).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import nacl.signing
import pytest
from nats.aio.client import Client as NATS

from tests.aip_actions import canonical, did_of, key_of_nkey_seed, sign
from worker.gateway.service import namespaced_action_id  # the bus id, to count results
from worker.testing.fake_hermes.faults import RouteDelay
from worker.testing.gateway import MCP_ISSUER

from .conftest import H1, GatewayStack

pytestmark = pytest.mark.asyncio

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"
#: `example.com` sanitised: the reference's rule (§3.1).
PREFIX = "aip.v1.example_com.aip-hermes-worker.v1"
CALLER = {"id": H1, "kind": "agent"}
MODELS = "cap:hermes_agent:h1:models"


def now(delta_s: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def frame(message_type: str, body_key: str, body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "aip_version": "1.0",
        "message_type": message_type,
        "message_id": "msg_" + secrets.token_hex(16),
        "sent_at": now(),
        "correlation_id": "corr_" + secrets.token_hex(8),
        "session_id": "sess_" + secrets.token_hex(8),
        "body": {body_key: body},
        **extra,
    }


def action(mode: str | None, *, timeout_ms: int = 20_000) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "act_" + secrets.token_hex(16),
        "capability_id": MODELS,
        "input": {},
        "timeout_ms": timeout_ms,
        # What the wire says of identity is never believed: the binding's is used.
        "identity": {"service_account": {"id": "service:someone-else", "kind": "service"}},
    }
    if mode is not None:
        body["mode"] = mode
    return frame("aip.core.v1.action", "action", body)


def status_request(action_id: str) -> dict[str, Any]:
    """An ActionStatusRequest as upstream serializes it: its flags always written (§1.7)."""
    return {
        "action_id": action_id,
        "include_result": True,
        "include_receipts": False,
        "include_chunks": False,
    }


def subject(message_type: str) -> str:
    return f"{PREFIX}.{message_type.replace('.', '_')}"


async def ask(nc: NATS, envelope: dict[str, Any], *, bare: bool = False) -> dict[str, Any]:
    payload = envelope if bare else {"envelope": envelope}
    msg = await nc.request(
        subject(str(envelope.get("message_type", "x"))), json.dumps(payload).encode(), timeout=30
    )
    answer = json.loads(msg.data)["envelope"]
    headers = msg.headers or {}
    assert headers["AIP-Version"] == "1.0"
    assert headers["AIP-Message-Type"] == answer["message_type"]
    assert headers["AIP-Message-Id"] == answer["message_id"]
    assert headers.get("AIP-Correlation-Id") == answer.get("correlation_id")
    return answer


def check_signed(answer: dict[str, Any], gateway: nacl.signing.VerifyKey) -> None:
    """§2.2 by hand: the did names the gateway key and the signature is over the canonical
    Envelope without `security.signature`."""
    did = answer["security"]["did"]
    assert answer["from"]["did"] == did
    unsigned = copy.deepcopy(answer)
    signature = base64.b64decode(unsigned["security"].pop("signature"))
    gateway.verify(canonical(unsigned), signature)


def check_answer(
    answer: dict[str, Any],
    request: dict[str, Any],
    gateway_key: nacl.signing.SigningKey,
    message_type: str,
) -> dict[str, Any]:
    """Signature, reply recipe, schema; the payload."""
    check_signed(answer, gateway_key.verify_key)
    assert answer["security"]["did"] == did_of(gateway_key)
    assert answer["message_type"] == message_type, answer["body"]
    assert answer["in_response_to"] == request["message_id"]
    assert answer["message_id"] != request["message_id"]
    assert answer["correlation_id"] == request["correlation_id"]
    assert answer["session_id"] == request["session_id"]
    assert {k: v for k, v in answer["to"].items() if k != "did"} == {
        k: v for k, v in request["from"].items() if k != "did"
    }
    validator = schema_validator(message_type)
    if validator is not None:
        validator.validate(answer)
    (payload,) = answer["body"].values()
    assert isinstance(payload, dict)
    return payload


@functools.cache
def schema_validator(message_type: str) -> Any:
    """The schemas/json/ schema of an answer type, compiled once (a burst checks a thousand
    answers); None where there is none."""
    schema_file = SCHEMAS / f"{message_type}.json"
    if not schema_file.exists():
        return None
    schema = json.loads(schema_file.read_text())
    # The workers' own result Envelope must carry our extension (who settled it, under
    # which fence); the binding's answer is the plain AIP ActionResult, so only that
    # requirement is lifted: the frame and body are held to the schema as is.
    schema["required"] = [name for name in schema["required"] if name != "extensions"]
    return jsonschema.validators.validator_for(schema)(schema)


def error_code(answer: dict[str, Any]) -> str:
    assert answer["message_type"] == "aip.core.v1.error"
    schema_validator("aip.core.v1.error").validate(answer)
    return str(answer["body"]["error"]["error"]["code"])


async def actions_last_seq(gs: GatewayStack) -> int:
    js = gs.stack.nc.jetstream()
    stream = await js.find_stream_name_by_subject("aip.hermes.h1.actions")
    return int((await js.stream_info(stream)).state.last_seq)


async def results_of(gs: GatewayStack, bus_action_id: str) -> int:
    """How many results the worker published for one Action (all of them, from the start)."""
    js = gs.stack.nc.jetstream()
    found = 0
    sub = await js.subscribe(f"aip.hermes.h1.results.{bus_action_id}", ordered_consumer=True)
    try:
        while True:
            try:
                await sub.next_msg(timeout=1.0)
            except Exception:
                break
            found += 1
    finally:
        await sub.unsubscribe()
    return found


async def serve_native(
    gstack: GatewayStack,
    tmp_path: Path,
    *,
    request_timeout_ms: int = 25_000,
    more_signers: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[GatewayStack, nacl.signing.SigningKey, nacl.signing.SigningKey]:
    """The stack with a gateway serving the binding; the caller's key (bound to h1's
    principal, the identity the worker's directory knows) and the gateway's key.
    `more_signers`: further lines of the trusted signers file; `env`: more gateway settings."""
    caller = nacl.signing.SigningKey.generate()
    signers = tmp_path / "aip-signers.txt"
    signers.write_text(
        "# the GetAIP runtime that routes to this pool\n"
        f"{did_of(caller)} {H1} kind=agent revision=1 issuer={MCP_ISSUER}\n"
        + "".join(f"{line}\n" for line in more_signers or [])
    )
    signers.chmod(0o600)
    await gstack.start_gateway(
        "g1",
        AIPD_AIP_TRUSTED_SIGNERS_FILE=str(signers),
        AIPD_AIP_TRUST_DOMAIN="example.com",
        AIPD_AIP_REQUEST_TIMEOUT_MS=str(request_timeout_ms),
        **(env or {}),
    )
    gateway = key_of_nkey_seed(gstack.stack.trust.seed_file.read_bytes())
    return gstack, caller, gateway


@pytest.fixture
async def native(
    gstack: GatewayStack, tmp_path: Path
) -> tuple[GatewayStack, nacl.signing.SigningKey, nacl.signing.SigningKey]:
    return await serve_native(gstack, tmp_path)


async def test_sync_async_manifest_heartbeat(
    native: tuple[GatewayStack, nacl.signing.SigningKey, nacl.signing.SigningKey],
) -> None:
    gs, caller, gateway = native
    nc = gs.stack.nc

    # sync (mode absent: sync) → the completed action_result of a real worker run
    request = sign(action(None), caller, CALLER)
    answer = await ask(nc, request)
    result = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert result["action_id"] == request["body"]["action"]["id"]
    assert result["status"] == "completed", result
    assert "data" in result["output"] or result["output"]
    done = request["body"]["action"]["id"]

    # its status (with the result) and its result, read back by the requester's Action id
    request = sign(
        frame(
            "aip.lifecycle.v1.action_status_request",
            "action_status_request",
            status_request(done),
        ),
        caller,
        CALLER,
    )
    status = check_answer(
        await ask(nc, request), request, gateway, "aip.lifecycle.v1.action_status"
    )
    assert status["state"] == "completed"
    assert status["result_status"] == "completed"
    assert status["result"] == result
    request = sign(
        frame(
            "aip.lifecycle.v1.action_result_request",
            "action_result_request",
            {"action_id": done, "include_receipt": False, "include_terminal_events": False},
        ),
        caller,
        CALLER,
    )
    again = check_answer(await ask(nc, request), request, gateway, "aip.core.v1.action_result")
    assert again == result

    # async → ack queued, and the Action runs once (one result on the bus)
    request = sign(action("async"), caller, CALLER)
    answer = await ask(nc, request, bare=True)
    ack = check_answer(answer, request, gateway, "aip.core.v1.ack")
    assert ack == {"action_id": request["body"]["action"]["id"], "status": "queued"}
    bus = namespaced_action_id(H1, None, request["body"]["action"]["id"])
    for _ in range(100):
        if await results_of(gs, bus):
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    assert await results_of(gs, bus) == 1

    # manifest_request → the pool's manifest, listing h1's capabilities and this binding
    request = sign(
        frame("aip.discovery.v1.manifest_request", "manifest_request", {}), caller, CALLER
    )
    answer = await ask(nc, request)
    manifest = check_answer(answer, request, gateway, "aip.discovery.v1.manifest_response")
    assert MODELS in {c["id"] for c in manifest["capabilities"]}
    assert "aip.native.nats.v1" in manifest["profiles"]
    assert manifest["compatibility"]["native_nats"]["subject"] == subject("aip.core.v1.action")

    # heartbeat → heartbeat_ack
    request = sign(frame("aip.core.v1.heartbeat", "heartbeat", {"sequence": 7}), caller, CALLER)
    answer = await ask(nc, request)
    beat = check_answer(answer, request, gateway, "aip.core.v1.heartbeat_ack")
    assert beat["sequence"] == 7
    assert beat["received_at"].endswith("Z")


async def test_refused_requests_answer_errors_and_enqueue_nothing(
    native: tuple[GatewayStack, nacl.signing.SigningKey, nacl.signing.SigningKey],
) -> None:
    gs, caller, gateway = native
    nc = gs.stack.nc
    before = await actions_last_seq(gs)
    stranger = nacl.signing.SigningKey.generate()

    cases: list[tuple[str, dict[str, Any], str]] = []
    unsigned = action("sync")
    unsigned["from"] = CALLER
    cases.append(("unsigned", unsigned, "auth.signature.invalid"))
    wrong_key = sign(action("sync"), caller, CALLER)
    wrong_key["body"]["action"]["input"] = {"changed": True}  # signature no longer matches
    cases.append(("tampered", wrong_key, "auth.signature.invalid"))
    forged = sign(action("sync"), stranger, CALLER)
    forged["security"]["did"] = did_of(caller)  # names the trusted did, signed by another
    forged["from"]["did"] = did_of(caller)
    cases.append(("wrong key", forged, "auth.signature.invalid"))
    cases.append(("untrusted did", sign(action("sync"), stranger, CALLER), "auth.unverified_actor"))
    cases.append(
        (
            "from is not the bound principal",
            sign(action("sync"), caller, {"id": "agent:other", "kind": "agent"}),
            "auth.claim_mismatch",
        )
    )
    stale = action("sync")
    stale["sent_at"] = now(-400)
    cases.append(("stale sent_at", sign(stale, caller, CALLER), "replay.message_id"))
    future = action("sync")
    future["sent_at"] = now(120)
    cases.append(("future sent_at", sign(future, caller, CALLER), "replay.message_id"))
    invalid = action("sync")
    invalid["body"]["action"]["mode"] = "sometimes"
    cases.append(("schema-invalid", sign(invalid, caller, CALLER), "schema.envelope.invalid"))
    ack = frame("aip.core.v1.ack", "ack", {"action_id": "act_" + "0" * 32, "status": "accepted"})
    cases.append(("unserved type", sign(ack, caller, CALLER), "capability.unsupported"))
    unknown = frame(
        "aip.lifecycle.v1.action_status_request",
        "action_status_request",
        status_request("act_" + "0" * 32),
    )
    cases.append(("unknown action", sign(unknown, caller, CALLER), "action.not_found"))

    for name, request, code in cases:
        answer = await ask(nc, request)
        assert error_code(answer) == code, (name, answer["body"])
        check_signed(answer, gateway.verify_key)
        assert answer["in_response_to"] == request["message_id"], name
        assert answer["correlation_id"] == request["correlation_id"], name

    # A replayed message id: the first is answered (heartbeat), the same bytes again refused.
    beat = sign(frame("aip.core.v1.heartbeat", "heartbeat", {"sequence": 1}), caller, CALLER)
    assert (await ask(nc, beat))["message_type"] == "aip.core.v1.heartbeat_ack"
    assert error_code(await ask(nc, beat)) == "replay.message_id"
    replayed_action = sign(action("async"), caller, CALLER)
    replayed_action["message_id"] = beat["message_id"]
    replayed_action = sign(replayed_action, caller, CALLER)
    assert error_code(await ask(nc, replayed_action)) == "replay.message_id"

    # Not JSON, and not an Envelope: answered, the responder goes on.
    msg = await nc.request(subject("aip.core.v1.action"), b"{not json", timeout=10)
    assert error_code(json.loads(msg.data)["envelope"]) == "envelope.decode.invalid"
    msg = await nc.request(subject("aip.core.v1.action"), b'{"envelope": 3}', timeout=10)
    assert error_code(json.loads(msg.data)["envelope"]) == "schema.envelope.invalid"
    # No reply subject: dropped (logged); the next request is still answered.
    await nc.publish(subject("aip.core.v1.heartbeat"), json.dumps({"envelope": beat}).encode())
    await nc.flush()

    assert await actions_last_seq(gs) == before  # nothing enqueued
    request = sign(frame("aip.core.v1.heartbeat", "heartbeat", {"sequence": 2}), caller, CALLER)
    assert (await ask(nc, request))["message_type"] == "aip.core.v1.heartbeat_ack"
    log = "".join(proc.log_tail() for proc in gs.gateways)
    assert "has no reply subject: dropped" in log


async def test_sync_past_the_request_timeout_is_accepted_then_read_by_a_retry(
    gstack: GatewayStack, tmp_path: Path
) -> None:
    """A sync Action still running when the requester's timeout nears is answered `ack`
    `accepted` (it is on its work queue), and the same Action sent again under a new
    message id and correlation id gets its one result."""
    gs, caller, gateway = await serve_native(gstack, tmp_path, request_timeout_ms=3_000)
    assert gs.stack.fake is not None
    gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=5.0))
    first = action("sync")
    request = sign(first, caller, CALLER)
    answer = await ask(gs.stack.nc, request)
    ack = check_answer(answer, request, gateway, "aip.core.v1.ack")
    assert ack["action_id"] == first["body"]["action"]["id"]
    assert ack["status"] == "accepted"
    await asyncio.sleep(6.0)
    again = copy.deepcopy(first)
    again["message_id"] = "msg_" + secrets.token_hex(16)
    again["correlation_id"] = "corr_" + secrets.token_hex(8)
    again["sent_at"] = now()
    request = sign(again, caller, CALLER)
    answer = await ask(gs.stack.nc, request)
    result = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert result["action_id"] == first["body"]["action"]["id"]
    assert result["status"] == "completed", result
    assert await results_of(gs, namespaced_action_id(H1, None, result["action_id"])) == 1

    # cancel of a running async Action → its terminal action_result, cancelled
    gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=8.0))  # one request
    running = action("async")
    request = sign(running, caller, CALLER)
    ack = check_answer(await ask(gs.stack.nc, request), request, gateway, "aip.core.v1.ack")
    assert ack["status"] == "queued"
    await asyncio.sleep(0.5)
    cancel = frame(
        "aip.core.v1.cancel",
        "cancel",
        {"target": {"action": running["body"]["action"]["id"]}, "reason": "changed mind"},
    )
    request = sign(cancel, caller, CALLER)
    answer = await ask(gs.stack.nc, request)
    cancelled = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert cancelled["action_id"] == running["body"]["action"]["id"]
    assert cancelled["status"] == "cancelled", cancelled
