"""Nobody reads what is not theirs through the gateway (issue 24, items 1 and 6).

Each test replays an attack against real processes: NATS, Redis, a worker process serving
h1 over the fake Hermes, `python -m worker gateway` reached over MCP, and `AipClient`. The
victim's Actions are published straight to the bus, as any publisher's are; the attacker
is an MCP principal who knows the victim's Action id (ids are shown in channel messages).
Endpoint h9 has a work queue but no worker, so what appears on its results subject is only
what the test publishes there (a trusted worker's signature made with the stack's key).

The module's tests share one deployment (conftest's `gs_shared`), each test seeing it as fresh
for what it checks.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from schemas.action import Action
from schemas.chunk import ChunkKind, make_chunk
from schemas.ids import new_action_id
from schemas.result import ActionResult, ResultStatus
from subjects.grammar import envelope_msg_id
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.aip_wire import receipt_fields
from worker.client import AipClient, UnverifiedResponse
from worker.testing._procs import free_port
from worker.testing.gateway import call_tool, principal_entry, write_principals_file
from worker.testing.identities import TENANT_A, write_json
from worker.trust.responses import ResponseSigner
from worker.wire.chunks import encode_chunk
from worker.wire.results import encode_result

from .conftest import (
    AGENT_TOKEN,
    AUDIT_STREAM,
    H1,
    H1_TOKEN,
    OTHER_TENANT_TOKEN,
    GatewayStack,
)
from .test_gateway_tools import (
    NOT_FOUND,
    aip_call,
    bus_id,
    contract,
    delegated,
    models_reads,
    records,
)

# The module's deployment lives across its tests, so they run on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")

H9_MODELS = "cap:hermes_agent:h9:models"
#: A forged delegation block: a chain no signed DelegationRequest ever carried.
FORGED_DELEGATION = {"delegation_id": "dlg-forged", "chain": ["user:root", "agent:admin"]}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest_asyncio.fixture(loop_scope="session")
async def gs_up(gs_shared: GatewayStack) -> GatewayStack:
    """This module's tests share the module's deployment (conftest `gs_shared`)."""
    return gs_shared


async def queue_entries(gs: GatewayStack) -> list[bytes]:
    """What the test enqueued on the runtime queue."""
    return await gs.enqueued_in_this_test()


async def unknown_id_message(gs: GatewayStack, token: str) -> tuple[str, str]:
    """What the gateway answers `token` for an id that does not exist: (message, that id)."""
    unknown = new_action_id()
    answer = await call_tool(gs.url, token, "aip_action_status", {"action_id": unknown})
    assert answer.error_code == NOT_FOUND
    return str(answer.document["error"]["message"]), unknown


def h9_action(gs: GatewayStack) -> tuple[Action, bytes]:
    """A user's Action for h9 and its exact envelope bytes."""
    identity = gs.stack.action("models").identity  # the stack's untenanted user
    action = gs.stack.client.build_action(
        endpoint_id="h9",
        operation="models",
        input={},
        principal_id=identity.principal_id,
        principal_kind=identity.principal_kind,
        authentication_issuer=identity.authentication_issuer,
        credential_revision=identity.credential_revision,
    )
    return action, gs.stack.trust.seal_action(action)


async def publish_h9(gs: GatewayStack, payload: bytes, action_id: str) -> None:
    """The victim's envelope on h9's work queue, as a signed publisher sends it."""
    headers = {"Nats-Msg-Id": envelope_msg_id(action_id, payload)}
    await gs.stack.nc.jetstream().publish(gs.stack.subjects.actions("h9"), payload, headers=headers)


def signed_h9_result(
    gs: GatewayStack, action_id: str, envelope_sha256: str | None, **output: Any
) -> bytes:
    """A result Envelope of h9's, signed by the trusted worker key."""
    signer = ResponseSigner.load(gs.stack.trust.worker_seed_file)
    return encode_result(
        ActionResult(
            action_id=action_id,
            capability=H9_MODELS,
            endpoint_id="h9",
            status=ResultStatus.COMPLETED,
            output=dict(output),
            settled_by="w-h9",
            fence=1,
            settled_at_unix_ms=time.time_ns() // 1_000_000,
            action_sha256=envelope_sha256,
        ),
        action=None,
        signer=signer.aip,
        endpoint_id="h9",
    )


async def publish_worker_signed(gs: GatewayStack, action_id: str, payload: bytes) -> None:
    """`payload` (a result Envelope the trusted worker key signed) on h9's results subject
    of `action_id`."""
    await gs.stack.nc.jetstream().publish(gs.stack.subjects.results("h9", action_id), payload)


@pytest_asyncio.fixture(loop_scope="session")
async def with_h9(gs_up: GatewayStack) -> GatewayStack:
    await provision(
        gs_up.stack.nc.jetstream(), gs_up.stack.subjects, ["h9"], StreamPolicy(ack_wait_s=3.0)
    )
    return gs_up


# --- item 1: a child's result is bound to the envelope the gateway dispatched ----------


async def test_aip_call_with_another_principals_action_id_gets_a_child_of_its_own(
    gs_up: GatewayStack,
) -> None:
    """The issue's attack: `aip_call` naming a victim's settled Action id, `input: {}`. The
    id the caller supplies is namespaced, so the caller's child is another Action; the
    victim's result is neither returned nor recorded, and nothing lands under its id."""
    gs = gs_up
    victim = gs.stack.action("models")
    settled = await (await gs.stack.publish(victim)).result(timeout_s=20)
    assert settled.status is ResultStatus.COMPLETED

    arguments = contract(action_id=victim.id, input={})
    answer = await aip_call(gs, H1_TOKEN, arguments)
    assert not answer.is_error, answer.document
    own_id = bus_id(arguments)
    assert own_id != victim.id
    own = await records(gs, own_id)
    assert own.queue is not None
    assert own.queue.owner_principal_id == H1
    assert own.lifecycle is not None
    assert own.lifecycle.result is not None
    assert answer.document == own.lifecycle.result.output
    # Nothing of the caller's exists under the victim's id, and the victim's one result
    # is still the only one there.
    assert (await records(gs, victim.id)).queue is None
    assert [r.settled_at_unix_ms for r in await gs.stack.results(victim.id)] == [
        settled.settled_at_unix_ms
    ]
    # The caller's id names the caller's own child: its result, never the victim's.
    later = await call_tool(gs.url, H1_TOKEN, "aip_action_result", {"action_id": victim.id})
    assert later.body["output"] == own.lifecycle.result.output
    assert settled.settled_at_unix_ms != own.lifecycle.result.settled_at_unix_ms
    # The same caller naming the same id again gets its own child back (idempotency).
    again = await aip_call(gs, H1_TOKEN, arguments)
    assert again.aip["action_id"] == victim.id
    assert again.aip["duplicate"] is True
    assert (await records(gs, own_id)).queue == own.queue


async def test_a_protocol_id_whose_result_is_on_the_bus_is_refused_like_an_unknown_id(
    gs_up: GatewayStack,
) -> None:
    """A delegated child keeps its protocol-assigned id; naming a victim's settled id that
    way is refused before anything is enqueued, with the answer an unknown id gets."""
    gs = gs_up
    victim = gs.stack.action("models")
    await (await gs.stack.publish(victim)).result(timeout_s=20)
    reads = models_reads(gs)

    answer = await aip_call(
        gs, H1_TOKEN, contract(action_id=victim.id, input={}, **delegated(FORGED_DELEGATION))
    )
    assert answer.is_error, answer.document
    assert answer.error_code == NOT_FOUND
    error = answer.document["error"]
    assert (error["retryable"], error["uncertain_outcome"]) == (False, False)
    message, unknown = await unknown_id_message(gs, H1_TOKEN)
    assert error["message"].replace(victim.id, "X") == message.replace(unknown, "X")
    assert await queue_entries(gs) == []
    assert len(await gs.stack.results(victim.id)) == 1
    assert models_reads(gs) == reads
    # The refused call left no receipt on the victim's audit chain either.
    await asyncio.sleep(0.3)
    events = {r.event.value for r in await gs.stack.client.receipts("h1", victim.id)}
    assert "settled" in events
    assert "tool_call" not in events


async def test_only_a_delegate_principal_makes_a_delegated_child(gs_up: GatewayStack) -> None:
    """A delegated child keeps the id its DelegationRequest assigned, so a principal that is
    no delegate naming `delegation` could take that id before the delegate's run calls it
    (the resolver then refuses the entry and the delegation fails). Such a call is refused
    before anything is enqueued, whatever the id's state (no oracle); the delegate's own
    call with the same contract is taken."""
    gs = gs_up
    child_id = new_action_id()
    arguments = contract(action_id=child_id, input={}, **delegated(FORGED_DELEGATION))
    refused = await aip_call(gs, AGENT_TOKEN, arguments)
    assert refused.is_error, refused.document
    assert "delegate principal" in refused.document["error"]["message"]
    assert await queue_entries(gs) == []
    taken = await aip_call(gs, H1_TOKEN, {**arguments, "mode": "async"})
    assert not taken.is_error, taken.document
    assert taken.document["action_id"] == child_id
    # A delegated child keeps its protocol-assigned id on the bus.
    assert (await records(gs, child_id)).queue is not None


async def test_an_id_held_on_the_work_queue_lends_the_caller_no_result(
    with_h9: GatewayStack,
) -> None:
    """The victim's envelope holds the id on the work queue, not settled yet. Since the
    dedupe id is bound to the envelope's bytes (issue 27), the caller's child is not a
    duplicate of it (neither pre-empts the other); what the caller can never get is the
    victim's answer: the victim's genuine signed result names the victim's envelope, not
    the caller's, and is not recorded as the caller's."""
    gs = with_h9
    actions = gs.stack.subjects.stream_name("actions")
    before = (await gs.stack.nc.jetstream().stream_info(actions)).state.last_seq
    victim, payload = h9_action(gs)
    await publish_h9(gs, payload, victim.id)

    answer = await aip_call(
        gs,
        H1_TOKEN,
        contract(
            action_id=victim.id,
            capability_id=H9_MODELS,
            input={},
            mode="async",
            **delegated(FORGED_DELEGATION),
        ),
    )
    assert not answer.is_error, answer.document
    assert answer.document["ack"]["status"] == "accepted"
    stream = await gs.stack.nc.jetstream().stream_info(actions)
    # Both envelopes stored: no dedupe slot was squatted.
    assert stream.state.last_seq == before + 2

    genuine = signed_h9_result(gs, victim.id, sha256_hex(payload), secret="victim-only")
    await publish_worker_signed(gs, victim.id, genuine)
    await asyncio.sleep(1.5)  # a follower or recovery sweep would have seen it by now
    stored = await call_tool(gs.url, H1_TOKEN, "aip_action_result", {"action_id": victim.id})
    assert "victim-only" not in json.dumps(stored.document)
    assert stored.document["message_type"] == "aip.lifecycle.v1.action_status"
    assert stored.body["state"] != "completed"


async def test_a_protocol_id_whose_chunks_are_streaming_is_refused_before_enqueue(
    with_h9: GatewayStack,
) -> None:
    """The victim's Action is executing (its chunks are on the bus, no result yet) and its
    envelope is past the duplicate window (published here without a `Nats-Msg-Id`): the
    gateway's publish would be stored, and `aip_action_events` would pass the victim's
    chunks through. The id is refused before anything is enqueued."""
    gs = with_h9
    victim, payload = h9_action(gs)
    await gs.stack.nc.jetstream().publish(gs.stack.subjects.actions("h9"), payload)
    chunk = make_chunk(
        ChunkKind.DATA,
        action_id=victim.id,
        endpoint_id="h9",
        seq=0,
        ts_unix_ms=time.time_ns() // 1_000_000,
        payload={"text": "victim-only"},
    )
    await gs.stack.nc.jetstream().publish(
        gs.stack.subjects.chunks("h9", victim.id), encode_chunk(chunk)
    )
    arguments = contract(
        action_id=victim.id,
        capability_id=H9_MODELS,
        input={},
        mode="async",
        **delegated(FORGED_DELEGATION),
    )
    answer = await aip_call(gs, H1_TOKEN, arguments)
    events = await call_tool(gs.url, H1_TOKEN, "aip_action_events", {"action_id": victim.id})
    assert "victim-only" not in json.dumps(events.document)
    assert answer.is_error, answer.document
    assert answer.error_code == NOT_FOUND
    assert await queue_entries(gs) == []


async def test_aip_client_refuses_a_signed_result_of_another_envelope(
    with_h9: GatewayStack,
) -> None:
    """`AipClient.result()` believes only a result naming its Action id and the hash of
    the envelope it published: a trusted worker's genuine result of another Action copied
    onto the subject, or one naming this id but another envelope, is not this Action's."""
    gs = with_h9
    other = gs.stack.action("models")
    await (await gs.stack.publish(other)).result(timeout_s=20)
    (copied, copied_headers) = (
        await gs.stack.stream_messages_with_headers(
            "results", gs.stack.subjects.results("h1", other.id)
        )
    )[0]

    client = AipClient(
        gs.stack.nc,
        sign_key=gs.stack.trust.seed_file,
        trusted_worker_keys=gs.stack.trust.worker_keys_file,
    )
    action, payload = h9_action(gs)
    handle = await client.publish(action)
    results = gs.stack.subjects.results("h9", action.id)
    signature = {k: v for k, v in copied_headers.items() if k.startswith("Aip-")}
    await gs.stack.nc.jetstream().publish(results, copied, headers=signature)
    with pytest.raises(UnverifiedResponse):
        await handle.result(timeout_s=2.0)
    await publish_worker_signed(
        gs, action.id, signed_h9_result(gs, action.id, sha256_hex(b"another envelope"), x=1)
    )
    with pytest.raises(UnverifiedResponse):
        await handle.result(timeout_s=2.0)
    with pytest.raises(UnverifiedResponse):
        await client.stored_result("h9", action.id, envelope_sha256=sha256_hex(payload))

    await publish_worker_signed(
        gs, action.id, signed_h9_result(gs, action.id, sha256_hex(payload), models=["m1"])
    )
    result = await handle.result(timeout_s=5.0)
    assert result.action_id == action.id
    assert result.output == {"models": ["m1"]}


# --- item 6: per-principal allowlists, no caller-supplied delegation --------------------


async def start_limited_gateway(gs: GatewayStack, tmp: Path) -> tuple[str, dict[str, str]]:
    """A second gateway whose principals carry allowlists; its URL and their tokens."""
    tokens = {
        "models_only": "tok-models-only-" + "1" * 24,
        "h2_only": "tok-h2-only-" + "2" * 28,
    }
    directory = tmp / "limited"
    directory.mkdir()
    principals = write_principals_file(
        directory,
        [
            principal_entry(
                tokens["models_only"], H1, capability_prefixes=["cap:hermes_agent:h1:models"]
            ),
            principal_entry(tokens["h2_only"], H1, endpoints=["h2"]),
        ],
    )
    port = free_port()
    await gs.start_gateway("g-limited", port=port, AIPD_MCP_PRINCIPALS_FILE=str(principals))
    return f"http://127.0.0.1:{port}/mcp", tokens


async def test_a_principals_allowlists_are_checked_before_enqueue_and_shape_the_listing(
    gs_up: GatewayStack, tmp_path: Path
) -> None:
    gs = gs_up
    url, tokens = await start_limited_gateway(gs, tmp_path)

    listed = await call_tool(url, tokens["models_only"], "aip_capabilities")
    assert not listed.is_error, listed.document
    assert {c["id"] for c in listed.document["capabilities"]} == {"cap:hermes_agent:h1:models"}
    other_endpoint = await call_tool(url, tokens["h2_only"], "aip_capabilities")
    assert other_endpoint.document["capabilities"] == []

    refused = [
        await call_tool(
            url,
            tokens["models_only"],
            "aip_call",
            contract(capability_id="cap:hermes_agent:h1:health"),
        ),
        await call_tool(url, tokens["h2_only"], "aip_call", contract()),
    ]
    for answer in refused:
        assert answer.is_error, answer.document
        assert answer.error_code == "connector_host.route_mismatch"
        error = answer.document["error"]
        assert (error["retryable"], error["uncertain_outcome"]) == (False, False)
    assert await queue_entries(gs) == []
    assert models_reads(gs) == 0
    # What the allowlist names still runs.
    allowed = await call_tool(url, tokens["models_only"], "aip_call", contract())
    assert not allowed.is_error, allowed.document
    assert allowed.aip["status"] == "completed"


async def test_a_caller_supplied_delegation_chain_never_reaches_hermes(
    gs_up: GatewayStack,
) -> None:
    gs = gs_up
    assert gs.stack.fake is not None
    for arguments in (
        contract(**delegated(FORGED_DELEGATION)),
        {k: v for k, v in contract(**delegated(FORGED_DELEGATION)).items() if k != "action_id"},
    ):
        answer = await aip_call(gs, H1_TOKEN, arguments)
        assert not answer.is_error, answer.document
        assert answer.aip["status"] == "completed"
    sent = [r for r in gs.stack.fake.requests() if r.route == "GET /v1/models"]
    assert len(sent) == 2
    for request in sent:
        names = {name.lower() for name in request.headers}
        assert "x-aip-delegation-chain" not in names, request.headers
        assert "user:root" not in json.dumps(request.headers)


# --- a tenant-bound endpoint refuses another tenant at the gateway -----------------------


async def test_a_tenant_mismatched_route_is_refused_before_enqueue(gs_up: GatewayStack) -> None:
    gs = gs_up
    await provision(
        gs.stack.nc.jetstream(), gs.stack.subjects, ["ha"], StreamPolicy(ack_wait_s=3.0)
    )
    assert gs.stack.fake is not None
    endpoints = write_json(
        gs.stack.root / "endpoints-ha.json",
        [{"id": "ha", "url": gs.stack.fake.url, "tenant_id": TENANT_A}],
        mode=0o600,
    )
    await gs.stack.spawn(
        "w-ha", AIPD_HERMES_ENDPOINTS="", AIPD_HERMES_ENDPOINTS_FILE=str(endpoints)
    )
    for token in (OTHER_TENANT_TOKEN, H1_TOKEN):  # tenant B, and no tenant at all
        answer = await aip_call(gs, token, contract(capability_id="cap:hermes_agent:ha:models"))
        assert answer.is_error, answer.document
        assert answer.error_code == "connector.hermes_agent.tenant_mismatch"
        error = answer.document["error"]
        assert (error["retryable"], error["uncertain_outcome"]) == (False, False)
    assert await queue_entries(gs) == []
    assert models_reads(gs) == 0
    received = await gs.stored_in_this_test(AUDIT_STREAM, "aip.hermes.ha.audit.*")
    assert [r for r in received if receipt_fields(r)["event"] != "tool_call"] == []
