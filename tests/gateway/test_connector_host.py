"""The connector host over native HTTP `aip.native.http.v1` (aip-1.0-wire.md §3.6, §3.7)
driven as a GetAIP central drives a remote connector.

Real NATS and Redis, a worker serving h1 over the fake Hermes, and a `python -m worker
gateway` process serving the host on its HTTP port. The test plays the central with a small
real HTTP server (aiohttp): it answers `/aip/v1/connector-control` with signed leases and
takes stream chunks on `/aip/v1/connector-callbacks`. Every request is built from the AIP
rules alone (tests/aip_actions.py: dicts, canonical JSON, PyNaCl, did:key by hand) and sent
with httpx; every answer's HTTP status, schema (jsonschema against schemas/json/),
signature (PyNaCl, the gateway key) and correlation are checked, and so is every chunk the
central receives.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import nacl.signing
import pytest
from aiohttp import web

from tests.aip_actions import canonical, did_of, key_of_nkey_seed, sign
from worker.aip.signing import AipSigner
from worker.errors import ControlFailed
from worker.gateway.connector_control import ConnectorControl
from worker.gateway.settings import GatewaySettings
from worker.testing._procs import free_port
from worker.testing.fake_hermes.faults import RouteDelay
from worker.testing.gateway import MCP_ISSUER
from worker.testing.scenario import SLOW_REPLY

from .conftest import H1, GatewayStack
from .test_native_nats import (
    SCHEMAS,
    actions_last_seq,
    check_answer,
    check_signed,
    frame,
    now,
    status_request,
)
from .test_native_streaming import FLOOD, FORGED, RUN_EVENTS, Forger, chain_breaks, flooded_run

pytestmark = pytest.mark.asyncio

#: The central speaks as the principal its did is bound to (h1's, which the workers'
#: identity directory knows).
CENTRAL = {"id": H1, "kind": "agent"}
#: Whom the central's callback chunks go to.
RECIPIENT = {"id": "service:getaip-central", "kind": "service"}
HOST = {"id": "service:aip-hermes-worker", "kind": "service"}
TENANT, INSTANCE, REPLICA, VERSION = "tenant-a", "inst-hermes-1", "replica-1", "hermes-v1"
CREDENTIAL = "cred-2"
MODELS = "cap:hermes_agent:h1:models"
CHAT_STREAM = "cap:hermes_agent:h1:chat_stream"
ROUTE_MISMATCH = "connector_host.route_mismatch"


@dataclass
class Central:
    """The GetAIP central's stand-in: signed connector-control answers, and the chunks."""

    gateway: nacl.signing.VerifyKey
    key: nacl.signing.SigningKey = field(default_factory=nacl.signing.SigningKey.generate)
    operations: list[str] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    idempotency_keys: list[str] = field(default_factory=list)
    url: str = ""
    #: How the control answers misbehave (unit tests of the host's checks of them).
    fault: str | None = None

    async def control(self, request: web.Request) -> web.Response:
        signed = await request.json()
        body = signed["request"]
        assert body["signer_did"] == did_of_verify(self.gateway)
        self.gateway.verify(canonical(body), base64.b64decode(signed["signature"]))
        operation = body["command"]["operation"]
        self.operations.append(operation)
        outcome: dict[str, Any] = {"status": "offline"}
        if operation != "offline":
            outcome = {
                "status": "lease",
                "lease": {"sequence": len(self.operations), "expires_at": now(30)},
            }
        if self.fault == "rejected":
            outcome = {
                "status": "rejected",
                "code": "connector_control.rejected",
                "message": "replica not provisioned",
                "retryable": False,
            }
        response = {
            "request_id": "msg_" + "0" * 32
            if self.fault == "other request"
            else body["request_id"],
            "issued_at": now(-120 if self.fault == "stale" else 0),
            "expires_at": now(-100 if self.fault == "stale" else 20),
            "signer_did": did_of(self.key),
            "outcome": outcome,
        }
        signer = nacl.signing.SigningKey.generate() if self.fault == "forged" else self.key
        signature = base64.b64encode(signer.sign(canonical(response)).signature).decode()
        return web.json_response({"response": response, "signature": signature})

    async def callback(self, request: web.Request) -> web.Response:
        self.chunks.append(json.loads(await request.read()))
        self.idempotency_keys.append(request.headers.get("Idempotency-Key", ""))
        return web.json_response({"accepted": True})


def did_of_verify(key: nacl.signing.VerifyKey) -> str:
    from tests.aip_actions import b58

    return "did:key:z" + b58(b"\xed\x01" + bytes(key))


@dataclass
class Hop:
    gs: GatewayStack
    central: Central
    central_key: nacl.signing.SigningKey
    gateway: nacl.signing.SigningKey
    client: httpx.AsyncClient

    @property
    def messages(self) -> str:
        return f"{self.gs.base_url}/aip/v1/messages"

    async def digest(self) -> str:
        answer = await self.client.get(f"{self.gs.base_url}/aip/v1/manifest")
        assert answer.status_code == 200, answer.text
        return "sha256:" + hashlib.sha256(canonical(answer.json())).hexdigest()

    async def post(self, envelope: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answer = await self.client.post(
            self.messages,
            content=json.dumps(envelope).encode(),
            headers={"content-type": "application/aip+json"},
            timeout=40,
        )
        assert answer.headers["content-type"] == "application/aip+json"
        document = answer.json()
        assert answer.headers["aip-message-id"] == document["message_id"]
        assert answer.headers["aip-message-type"] == document["message_type"]
        return answer.status_code, document


def route(action_id: str, capability: str, digest: str, mode: str = "sync") -> dict[str, Any]:
    """A pinned assignment (§3.6) as the central writes it into `security.connector_route`."""
    return {
        "action_id": action_id,
        "capability_id": capability,
        "tenant_id": TENANT,
        "instance_id": INSTANCE,
        "replica_id": REPLICA,
        "version_id": VERSION,
        "manifest_digest": digest,
        "catalog_revision": 3,
        "binding_policy_revision": 1,
        "credential_revision_ref": CREDENTIAL,
        "quota_policy_ref": "quota-default",
        "replica_health_revision": 1,
        "fence_token": "fence-" + secrets.token_hex(4),
        "original_mode": mode,
    }


def routed(
    message_type: str, body_key: str, body: dict[str, Any], pinned: dict[str, Any] | None
) -> dict[str, Any]:
    envelope = frame(message_type, body_key, body, to=HOST)
    if pinned is not None:
        envelope["security"] = {"connector_route": pinned}
    return envelope


def action(
    digest: str,
    *,
    mode: str = "sync",
    capability: str = MODELS,
    input: dict[str, Any] | None = None,
    callback: dict[str, Any] | None = None,
) -> dict[str, Any]:
    action_id = "act_" + secrets.token_hex(16)
    body: dict[str, Any] = {
        "id": action_id,
        "capability_id": capability,
        "input": input or {},
        "mode": mode,
        "timeout_ms": 20_000,
        "idempotency_key": "idem-" + action_id,
        "identity": {"tenant": {"id": TENANT}},
    }
    pinned = route(action_id, capability, digest, mode)
    if callback is not None:
        body["callback"] = callback
    return routed("aip.core.v1.action", "action", body, pinned)


POLICY = "sha256:" + "ab" * 32
POLICY_B = "sha256:" + "cd" * 32
TENANT_B = {"tenant": {"id": "tenant-b"}}


def approved_action(digest: str, *, approval_id: str | None = None) -> dict[str, Any]:
    """A read the central approved: the Action's `approval` (an ApprovalDecision) and, in
    its route, the central runtime's ApprovalRecord holding that decision (§3.6)."""
    envelope = action(digest)
    body = envelope["body"]["action"]
    approval = {
        "approval_id": approval_id or "appr_" + secrets.token_hex(16),
        "decision": "approved",
        "approver": {"id": "user:boss", "kind": "human"},
        "decided_at": now(),
        "policy_hash": POLICY,
    }
    body["approval"] = approval
    envelope["security"]["connector_route"]["approval_authorization"] = {
        "request": {
            "id": approval["approval_id"],
            "action_id": body["id"],
            "capability_id": body["capability_id"],
            "requester": CENTRAL,
            "subject": CENTRAL,
            "approver_selector": {"type": "principal", "id": "user:boss"},
            "reason": "a governed read",
            "identity": {"tenant": {"id": TENANT}},
            "policy_hash": POLICY,
        },
        "status": "approved",
        "decision": dict(approval),
        "decisions": [
            {
                "decision": dict(approval),
                "authority": {"principal_id": "user:boss", "tenant_id": TENANT, "revision": 1},
                "evidence_hash": hashlib.sha256(b"evidence").hexdigest(),
                "recorded_at": now(),
            }
        ],
        "created_at": now(),
        "updated_at": now(),
    }
    return envelope


def streamed(request: dict[str, Any], central: Central) -> dict[str, Any]:
    """`request` (a streaming Action) with exactly the central callback (§3.6)."""
    request["body"]["action"]["callback"] = {
        "profile": "aip.native.http.v1",
        "target": f"{central.url}/aip/v1/connector-callbacks",
        "metadata": {
            "connector_callback": request["security"]["connector_route"],
            "connector_callback_recipient": RECIPIENT,
        },
    }
    return request


def error_of(status: int, answer: dict[str, Any], gateway: nacl.signing.SigningKey) -> str:
    """The code of a signed, schema-valid error answer (its status checked by the caller)."""
    assert answer["message_type"] == "aip.core.v1.error", (status, answer["body"])
    jsonschema.validate(answer, json.loads((SCHEMAS / "aip.core.v1.error.json").read_text()))
    check_signed(answer, gateway.verify_key)
    error = answer["body"]["error"]["error"]
    assert error["source"]["binding"] == "aip.native.http.v1"
    return str(error["code"])


async def serve_central(central: Central) -> web.AppRunner:
    """The central's two paths on a free loopback port (`central.url`)."""
    app = web.Application()
    app.router.add_post("/aip/v1/connector-control", central.control)
    app.router.add_post("/aip/v1/connector-callbacks", central.callback)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    central.url = f"http://127.0.0.1:{port}"
    return runner


@pytest.fixture
async def hop(gstack: GatewayStack, tmp_path: Path) -> AsyncIterator[Hop]:
    """A central stand-in, and a gateway serving the host that registered with it."""
    gateway = key_of_nkey_seed(gstack.stack.trust.seed_file.read_bytes())
    central = Central(gateway.verify_key)
    runner = await serve_central(central)
    central_key = nacl.signing.SigningKey.generate()
    signers = tmp_path / "aip-signers.txt"
    signers.write_text(f"{did_of(central_key)} {H1} kind=agent revision=1 issuer={MCP_ISSUER}\n")
    signers.chmod(0o600)
    await gstack.start_gateway(
        "g1",
        AIPD_AIP_TRUSTED_SIGNERS_FILE=str(signers),
        AIPD_AIP_HOST_INSTANCE_ID=INSTANCE,
        AIPD_AIP_HOST_TENANT_ID=TENANT,
        AIPD_AIP_HOST_REPLICA_ID=REPLICA,
        AIPD_AIP_HOST_VERSION_ID=VERSION,
        AIPD_AIP_HOST_PUBLIC_URL=f"{gstack.base_url}/aip/v1/messages",
        AIPD_AIP_HOST_CREDENTIAL_REVISION=CREDENTIAL,
        AIPD_AIP_HOST_ACCEPTED_CREDENTIAL_REVISIONS="cred-1",
        AIPD_AIP_HOST_REVOKED_CREDENTIAL_REVISIONS="cred-0",
        AIPD_AIP_HOST_MAX_IN_FLIGHT="1",
        AIPD_AIP_HOST_HEARTBEAT_INTERVAL_MS="500",
        AIPD_AIP_CENTRAL_URL=central.url,
        AIPD_AIP_CENTRAL_DID=did_of(central.key),
    )
    for _ in range(100):
        if "heartbeat" in central.operations:
            break
        await asyncio.sleep(0.1)
    async with httpx.AsyncClient() as client:
        try:
            yield Hop(gstack, central, central_key, gateway, client)
        finally:
            gstack.stop()
            await runner.cleanup()


async def test_sync_async_lifecycle_stream_manifest_and_registration(hop: Hop) -> None:
    """The central's requests, each answered as the reference host answers it."""
    central, key, gateway = hop.central, hop.central_key, hop.gateway
    # Registration, then heartbeats, seen by the central (signed by the gateway's did).
    assert central.operations[0] == "register"
    assert "heartbeat" in central.operations
    ready = await hop.client.get(f"{hop.gs.base_url}/ready")
    assert (ready.status_code, ready.json()["checks"]["connector_host"]) == (200, True)

    # GET /aip/v1/manifest: the bare Manifest, naming this binding.
    manifest = (await hop.client.get(f"{hop.gs.base_url}/aip/v1/manifest")).json()
    assert MODELS in {c["id"] for c in manifest["capabilities"]}
    assert "aip.native.http.v1" in manifest["profiles"]
    digest = await hop.digest()

    # sync → 200, the completed action_result
    request = sign(action(digest), key, CENTRAL)
    status, answer = await hop.post(request)
    assert status == 200
    result = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert result["action_id"] == request["body"]["action"]["id"]
    assert result["status"] == "completed", result
    done = result["action_id"]

    # status and result of that Action, routed to it
    pinned = route(done, MODELS, digest)
    request = sign(
        routed(
            "aip.lifecycle.v1.action_status_request",
            "action_status_request",
            status_request(done),
            pinned,
        ),
        key,
        CENTRAL,
    )
    status, answer = await hop.post(request)
    assert status == 200
    state = check_answer(answer, request, gateway, "aip.lifecycle.v1.action_status")
    assert state["state"] == "completed"
    assert state["result"] == result
    request = sign(
        routed(
            "aip.lifecycle.v1.action_result_request",
            "action_result_request",
            {"action_id": done, "include_receipt": False, "include_terminal_events": False},
            pinned,
        ),
        key,
        CENTRAL,
    )
    status, answer = await hop.post(request)
    assert (status, check_answer(answer, request, gateway, "aip.core.v1.action_result")) == (
        200,
        result,
    )

    # a manifest_request over the hop
    request = sign(
        routed("aip.discovery.v1.manifest_request", "manifest_request", {}, None), key, CENTRAL
    )
    status, answer = await hop.post(request)
    assert status == 200
    served = check_answer(answer, request, gateway, "aip.discovery.v1.manifest_response")
    assert served["capabilities"] == manifest["capabilities"]

    # streaming → chunks to the central callback, signed, in sequence; then the result
    request = action(
        digest,
        mode="streaming",
        capability=CHAT_STREAM,
        input={"messages": [{"role": "user", "content": "stream me"}]},
    )
    callback_route: dict[str, Any] = request["security"]["connector_route"]
    request["body"]["action"]["callback"] = {
        "profile": "aip.native.http.v1",
        "target": f"{central.url}/aip/v1/connector-callbacks",
        "metadata": {
            "connector_callback": callback_route,
            "connector_callback_recipient": RECIPIENT,
        },
    }
    request = sign(request, key, CENTRAL)
    status, answer = await hop.post(request)
    assert status == 200, answer["body"]
    streamed = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert streamed["status"] == "completed", streamed
    schema = json.loads((SCHEMAS / "aip.core.v1.stream_chunk.json").read_text())
    schema["required"] = [name for name in schema["required"] if name != "extensions"]
    assert central.chunks, "no chunk reached the central"
    for index, chunk in enumerate(central.chunks):
        check_signed(chunk, gateway.verify_key)
        jsonschema.validate(chunk, schema)
        assert chunk["to"] == RECIPIENT
        assert chunk["security"]["connector_callback"] == callback_route
        assert chunk["correlation_id"] == request["correlation_id"]
        body = chunk["body"]["stream_chunk"]
        assert body["action_id"] == streamed["action_id"]
        assert body["sequence"] == index
        assert central.idempotency_keys[index] == chunk["message_id"]
    assert central.chunks[-1]["body"]["stream_chunk"]["kind"] == "done"

    # async → ack queued; cancel of it while it runs → its cancelled action_result
    assert hop.gs.stack.fake is not None
    hop.gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=8.0))
    request = sign(action(digest, mode="async"), key, CENTRAL)
    status, answer = await hop.post(request)
    ack = check_answer(answer, request, gateway, "aip.core.v1.ack")
    assert (status, ack["status"]) == (200, "queued")
    running = ack["action_id"]
    await asyncio.sleep(0.5)
    cancel = routed(
        "aip.core.v1.cancel",
        "cancel",
        {"target": {"action": running}, "reason": "cancelled by the AIP connector fleet runtime"},
        route(running, MODELS, digest, "async"),
    )
    request = sign(cancel, key, CENTRAL)
    status, answer = await hop.post(request)
    assert status == 200
    cancelled = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert (cancelled["action_id"], cancelled["status"]) == (running, "cancelled")


async def test_refusals_answer_the_reference_codes_and_statuses_and_enqueue_nothing(
    hop: Hop,
) -> None:
    central_key, gateway = hop.central_key, hop.gateway
    digest = await hop.digest()
    before = await actions_last_seq(hop.gs)
    stranger = nacl.signing.SigningKey.generate()
    cases: list[tuple[str, dict[str, Any], int, str]] = []

    unsigned = action(digest)
    unsigned["from"] = CENTRAL
    cases.append(("unsigned", unsigned, 401, "connector_host.route_mismatch"))
    tampered = sign(action(digest), central_key, CENTRAL)
    tampered["body"]["action"]["input"] = {"changed": True}
    cases.append(("wrong signature", tampered, 401, "connector_host.route_mismatch"))
    cases.append(
        (
            "untrusted did",
            sign(action(digest), stranger, CENTRAL),
            401,
            "connector_host.route_mismatch",
        )
    )
    cases.append(
        (
            "from is not the signer's principal",
            sign(action(digest), central_key, {"id": "agent:other", "kind": "agent"}),
            401,
            "connector_host.route_mismatch",
        )
    )
    invalid = action(digest)
    invalid["body"]["action"]["mode"] = "sometimes"
    cases.append(
        ("schema-invalid", sign(invalid, central_key, CENTRAL), 400, "schema.envelope.invalid")
    )
    other_action = action(digest)
    other_action["security"]["connector_route"]["action_id"] = "act_" + "1" * 32
    cases.append(
        (
            "route names another Action",
            sign(other_action, central_key, CENTRAL),
            403,
            "connector_host.route_mismatch",
        )
    )
    for name, change in (
        ("tenant_id", "tenant-b"),
        ("replica_id", "replica-2"),
        ("manifest_digest", "sha256:" + "0" * 64),
        ("capability_id", "cap:hermes_agent:h1:chat"),
    ):
        wrong = action(digest)
        wrong["security"]["connector_route"][name] = change
        cases.append((f"route {name}", sign(wrong, central_key, CENTRAL), 403, ROUTE_MISMATCH))
    other_tenant = action(digest)
    other_tenant["body"]["action"]["identity"] = {"tenant": {"id": "tenant-b"}}
    cases.append(
        (
            "identity of another tenant",
            sign(other_tenant, central_key, CENTRAL),
            403,
            ROUTE_MISMATCH,
        )
    )
    unrouted = action(digest)
    del unrouted["security"]
    cases.append(("no route", sign(unrouted, central_key, CENTRAL), 403, ROUTE_MISMATCH))
    elsewhere = action(digest)
    elsewhere["to"] = {"id": "service:another-host", "kind": "service"}
    cases.append(("another recipient", sign(elsewhere, central_key, CENTRAL), 403, ROUTE_MISMATCH))
    with_callback = action(digest)
    with_callback["body"]["action"]["callback"] = {
        "profile": "aip.native.http.v1",
        "target": "https://client.example/hook",
    }
    cases.append(
        ("sync with a callback", sign(with_callback, central_key, CENTRAL), 403, ROUTE_MISMATCH)
    )
    stray_stream = action(digest, mode="streaming", capability=CHAT_STREAM)
    stray_stream["body"]["action"]["callback"] = {
        "profile": "aip.native.http.v1",
        "target": "https://client.example/aip/v1/connector-callbacks",
    }
    cases.append(
        (
            "stream to another callback",
            sign(stray_stream, central_key, CENTRAL),
            403,
            ROUTE_MISMATCH,
        )
    )
    for revision in ("cred-0", "cred-9"):
        pinned = action(digest)
        pinned["security"]["connector_route"]["credential_revision_ref"] = revision
        cases.append(
            (
                f"credential {revision}",
                sign(pinned, central_key, CENTRAL),
                403,
                "connector_host.credential_revision_denied",
            )
        )
    # The central's approval record (the reference runtime's ApprovalRecord) rides in the
    # route; every disagreement with the Action is a route mismatch (§3.6).
    approved = approved_action(digest)
    del approved["security"]["connector_route"]["approval_authorization"]
    cases.append(("approval without authorization", sign(approved, central_key, CENTRAL), 403,
                  ROUTE_MISMATCH))  # fmt: skip
    unused = approved_action(digest)
    del unused["body"]["action"]["approval"]
    cases.append(("authorization without approval", sign(unused, central_key, CENTRAL), 403,
                  ROUTE_MISMATCH))  # fmt: skip
    for what, spoil in (
        ("malformed", lambda record: record.pop("request")),
        ("pending", lambda record: record.update(status="pending")),
        ("another action", lambda record: record["request"].update(action_id="act_" + "4" * 32)),
        ("another tenant", lambda record: record["request"].update(identity=TENANT_B)),
        ("another policy", lambda record: record["request"].update(policy_hash=POLICY_B)),
        ("no decisions", lambda record: record.update(decisions=[])),
        ("a denial", lambda record: record["decisions"][0]["decision"].update(decision="denied")),
    ):
        spoiled = approved_action(digest)
        spoil(spoiled["security"]["connector_route"]["approval_authorization"])
        cases.append((f"authorization {what}", sign(spoiled, central_key, CENTRAL), 403,
                      ROUTE_MISMATCH))  # fmt: skip
    cancel_approved = routed(
        "aip.core.v1.cancel",
        "cancel",
        {"target": {"action": "act_" + "3" * 32}},
        route("act_" + "3" * 32, MODELS, digest)
        | {"approval_authorization": approved_action(digest)["security"]["connector_route"][
            "approval_authorization"]},
    )
    cases.append(("authorization on a cancel", sign(cancel_approved, central_key, CENTRAL), 403,
                  ROUTE_MISMATCH))  # fmt: skip
    cancel_other = routed(
        "aip.core.v1.cancel",
        "cancel",
        {"target": {"action": "act_" + "2" * 32}},
        route("act_" + "3" * 32, MODELS, digest),
    )
    cases.append(
        ("cancel of another Action", sign(cancel_other, central_key, CENTRAL), 403, ROUTE_MISMATCH)
    )

    for name, request, want_status, want_code in cases:
        status, answer = await hop.post(request)
        assert (status, error_of(status, answer, gateway)) == (want_status, want_code), name
        assert answer["in_response_to"] == request["message_id"], name
        assert answer["correlation_id"] == request["correlation_id"], name

    # A replayed message id: answered once, then 409 connector_host.replay.
    beat = sign(
        routed("aip.core.v1.heartbeat", "heartbeat", {"sequence": 1}, None), central_key, CENTRAL
    )
    status, answer = await hop.post(beat)
    assert (status, answer["message_type"]) == (200, "aip.core.v1.heartbeat_ack")
    status, answer = await hop.post(beat)
    assert (status, error_of(status, answer, gateway)) == (409, "connector_host.replay")
    replayed = action(digest)
    replayed["message_id"] = beat["message_id"]
    status, answer = await hop.post(sign(replayed, central_key, CENTRAL))
    assert (status, error_of(status, answer, gateway)) == (409, "connector_host.replay")

    assert await actions_last_seq(hop.gs) == before  # no refusal enqueued anything

    # A well-formed approval record passes the host and is imported; the same record again
    # (a retry with a new message id) is accepted, another record for that approval id is
    # a conflict, and nothing is enqueued for it.
    first = approved_action(digest)
    record = first["security"]["connector_route"]["approval_authorization"]
    status, answer = await hop.post(sign(first, central_key, CENTRAL))
    assert (status, answer["message_type"]) == (200, "aip.core.v1.action_result"), answer
    assert answer["body"]["action_result"]["status"] == "completed"  # a read: no quorum due
    retry = json.loads(json.dumps(first))
    retry["message_id"] = "msg_" + secrets.token_hex(16)
    status, answer = await hop.post(sign(retry, central_key, CENTRAL))
    assert (status, answer["message_type"]) == (200, "aip.core.v1.action_result"), answer
    assert answer["body"]["action_result"]["status"] == "completed"
    after_import = await actions_last_seq(hop.gs)
    rival = approved_action(digest, approval_id=record["request"]["id"])
    status, answer = await hop.post(sign(rival, central_key, CENTRAL))
    assert (status, error_of(status, answer, gateway)) == (
        403,
        "connector_host.approval_authorization_conflict",
    )
    assert await actions_last_seq(hop.gs) == after_import

    # Not JSON at all: 400, still a signed error Envelope.
    raw = await hop.client.post(hop.messages, content=b"{not json")
    assert raw.status_code == 400
    assert error_of(400, raw.json(), gateway) == "envelope.decode.invalid"

    assert await actions_last_seq(hop.gs) == after_import  # nothing more enqueued


async def test_full_then_draining_host_refuses_new_actions(hop: Hop) -> None:
    """One Action at a time (AIPD_AIP_HOST_MAX_IN_FLIGHT=1): a second is 429
    `connector_host.capacity`; once the gateway is told to stop it drains — a new Action is
    503 `connector_host.not_ready`, the running one still gets its result — and then tells
    the central it drains and goes offline."""
    central_key, gateway = hop.central_key, hop.gateway
    digest = await hop.digest()
    assert hop.gs.stack.fake is not None
    hop.gs.stack.fake.faults.add(RouteDelay(route="GET /v1/models", delay_s=3.0))
    first = sign(action(digest), central_key, CENTRAL)
    running = asyncio.ensure_future(hop.post(first))
    await asyncio.sleep(0.8)

    status, answer = await hop.post(sign(action(digest), central_key, CENTRAL))
    assert (status, error_of(status, answer, gateway)) == (429, "connector_host.capacity")
    error = answer["body"]["error"]["error"]
    assert (error["retryable"], error["retry_after_ms"]) == (True, 100)

    before = await actions_last_seq(hop.gs)
    (proc,) = hop.gs.gateways
    os.kill(proc.pid, signal.SIGTERM)
    await asyncio.sleep(0.5)
    request = sign(action(digest), central_key, CENTRAL)
    status, answer = await hop.post(request)
    assert (status, error_of(status, answer, gateway)) == (503, "connector_host.not_ready")
    error = answer["body"]["error"]["error"]
    assert (error["retryable"], error["retry_after_ms"]) == (True, 10_000)
    assert "draining" in error["message"]

    ready = await hop.client.get(f"{hop.gs.base_url}/ready")
    assert ready.status_code == 503
    assert ready.json()["checks"]["connector_host"] is False

    status, answer = await running
    result = check_answer(answer, first, gateway, "aip.core.v1.action_result")
    assert (status, result["status"]) == (200, "completed")
    assert await actions_last_seq(hop.gs) == before
    assert await asyncio.to_thread(proc.wait_exit, 15) is not None
    assert hop.central.operations[-2:] == ["drain", "offline"]
    assert hop.central.operations[0] == "register"


def host_settings(tmp_path: Path, **values: Any) -> GatewaySettings:
    """Gateway settings of a connector host (the files are named, never read here)."""
    base: dict[str, Any] = {
        "mcp_principals_file": tmp_path / "principals.json",
        "gateway_signing_key_file": tmp_path / "gateway.seed",
        "aip_trusted_signers_file": tmp_path / "signers.txt",
        "aip_host_instance_id": INSTANCE,
        "aip_host_tenant_id": TENANT,
        "aip_host_replica_id": REPLICA,
        "aip_host_public_url": "http://127.0.0.1:9/aip/v1/messages",
        "aip_central_url": "http://127.0.0.1:9",
        "aip_central_did": "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK",
    }
    return GatewaySettings(**{**base, **values})


async def test_a_long_stream_is_forwarded_whole_in_order_once_and_a_forged_link_never(
    hop: Hop,
) -> None:
    """The host forwards live (chunk follower, `Release.LIVE`): FLOOD and more chunks of one
    Action reach the central once each, in sequence order, the chain unbroken; then a chunk
    naming the child with a wrong previous hash, published while it streams, is never
    forwarded and is reported as a typed chain break of this binding; one that links is
    forwarded (it cannot be told apart live) and then reported, and nothing follows it."""
    central, key, gateway = hop.central, hop.central_key, hop.gateway
    digest = await hop.digest()
    run_id = await flooded_run(hop.gs)
    request = streamed(
        action(digest, mode="streaming", capability=RUN_EVENTS, input={"run_id": run_id}),
        central,
    )
    request = sign(request, key, CENTRAL)
    status, answer = await hop.post(request)
    assert status == 200, answer["body"]
    result = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert result["status"] == "completed", result
    chunks = [
        c for c in central.chunks if c["body"]["stream_chunk"]["action_id"] == result["action_id"]
    ]
    bodies = [c["body"]["stream_chunk"] for c in chunks]
    assert len(bodies) > FLOOD, len(bodies)
    assert [b["sequence"] for b in bodies] == list(range(len(bodies)))
    assert len({c["message_id"] for c in chunks}) == len(chunks)
    assert bodies[-1]["kind"] == "done"
    assert sum(b["kind"] == "data" for b in bodies) >= FLOOD
    assert await chain_breaks(hop.gs, "aip.native.http.v1") == {}

    request = streamed(
        action(
            digest,
            mode="streaming",
            capability=CHAT_STREAM,
            input={"messages": [{"role": "user", "content": SLOW_REPLY}]},
        ),
        central,
    )
    request = sign(request, key, CENTRAL)
    forger = Forger(hop.gs, request["body"]["action"]["id"])
    await forger.start()
    posting = asyncio.ensure_future(hop.post(request))
    forged_seq = await forger.forge()
    status, answer = await posting
    assert status == 200, answer["body"]
    result = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert result["status"] == "completed", result
    bodies = [
        c["body"]["stream_chunk"]
        for c in central.chunks
        if c["body"]["stream_chunk"]["action_id"] == result["action_id"]
    ]
    assert len(bodies) > forged_seq
    assert [b["sequence"] for b in bodies] == list(range(len(bodies)))
    assert FORGED not in json.dumps(bodies)
    assert bodies[-1]["kind"] == "done"
    assert await chain_breaks(hop.gs, "aip.native.http.v1") == {"off_chain": 1.0}

    # A forgery that links to the real chain, stored before the real next chunk: alone at
    # its seq when read, it is forwarded live; the real one makes a fork, and once the
    # signed result shows the forgery off its chain the forwarding stops there (the central
    # cannot be told to forget a chunk), reported `not_vouched`; the answer still comes.
    request = streamed(
        action(
            digest,
            mode="streaming",
            capability=CHAT_STREAM,
            input={"messages": [{"role": "user", "content": SLOW_REPLY}]},
        ),
        central,
    )
    request = sign(request, key, CENTRAL)
    forger = Forger(hop.gs, request["body"]["action"]["id"], linked=True)
    await forger.start()
    posting = asyncio.ensure_future(hop.post(request))
    forged_seq = await forger.forge()
    status, answer = await posting
    assert status == 200, answer["body"]
    result = check_answer(answer, request, gateway, "aip.core.v1.action_result")
    assert result["status"] == "completed", result
    bodies = [
        c["body"]["stream_chunk"]
        for c in central.chunks
        if c["body"]["stream_chunk"]["action_id"] == result["action_id"]
    ]
    assert [b["sequence"] for b in bodies] == list(range(forged_seq + 1))
    assert FORGED in json.dumps(bodies[-1])
    assert await chain_breaks(hop.gs, "aip.native.http.v1") == {
        "off_chain": 1.0,
        "not_vouched": 1.0,
    }


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        (None, None),
        ("forged", "not a signed answer"),
        ("other request", "another request"),
        ("stale", "outside its window"),
        ("rejected", "connector_control.rejected"),
        ("no manifest", "manifest is not readable"),
    ],
)
async def test_a_lease_counts_only_when_the_central_signed_it_for_this_request(
    tmp_path: Path, fault: str | None, why: str | None
) -> None:
    """Register against a central stand-in: a lease only from a signed, fresh answer to this
    very request; anything else leaves the host unleased (and so refusing Actions)."""
    seed = secrets.token_bytes(32)
    host_key = nacl.signing.SigningKey(seed)
    central = Central(host_key.verify_key, fault=fault)
    runner = await serve_central(central)
    try:
        settings = host_settings(
            tmp_path, aip_central_url=central.url, aip_central_did=did_of(central.key)
        )

        async def facts() -> tuple[str, int]:
            if fault == "no manifest":
                raise RuntimeError("no worker answered a manifest request")
            return "sha256:" + "a" * 64, 35

        control = ConnectorControl(
            settings,
            AipSigner.from_seed(seed),
            dict(HOST),
            in_flight=lambda: 0,
            manifest_facts=facts,
            healthy=lambda: True,
        )
        try:
            if why is None:
                await control.register()
                await control.heartbeat()
                assert control.lease_valid()
                assert central.operations == ["register", "heartbeat"]
            else:
                with pytest.raises(ControlFailed, match=why):
                    await control.register()
                assert not control.lease_valid()
        finally:
            await control.close()
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"aip_host_tenant_id": None}, "AIPD_AIP_HOST_TENANT_ID"),
        ({"aip_trusted_signers_file": None}, "AIPD_AIP_TRUSTED_SIGNERS_FILE"),
        ({"aip_central_did": None}, "AIPD_AIP_CENTRAL_DID"),
        ({"aip_central_url": "http://central.example"}, "AIPD_AIP_CENTRAL_URL must be https"),
        ({"aip_host_public_url": "https://h.example/aip"}, "must end in /aip/v1/messages"),
    ],
)
async def test_a_host_misconfiguration_refuses_the_start_naming_the_variable(
    tmp_path: Path, values: dict[str, Any], named: str
) -> None:
    host_settings(tmp_path)  # the base is valid
    with pytest.raises(ValueError, match=named):
        host_settings(tmp_path, **values)
