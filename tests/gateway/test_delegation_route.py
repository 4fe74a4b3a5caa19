"""The delegation route (docs/aip.md "Delegation route"; aip-1.0-wire.md §3.4) driven as a
GetAIP runtime drives it: one signed `aip.agent.v1.delegation_request` as a core NATS request
on the route's subject, one signed answer.

The requester is independent of the project's codec (tests/aip_actions.py: dicts, canonical
JSON, PyNaCl, did:key by hand); every answer is checked as getaip-server checks a peer's
(§2.6): signed by the peer DID (the gateway key), `from` the peer principal, `to` the
requester, `correlation_id` equal, `in_response_to` the request's `message_id`, the ids of
the request in the DelegationResult, and its schema (jsonschema against schemas/json/).
Behind the gateway: real NATS and Redis, a worker serving h1 with delegation enabled, whose
(fake) Hermes operator calls `aip_call` on the gateway over MCP for the child, which the
gateway routes to the echo capability on the bus; the real-Hermes test puts the real Hermes
0.19.0 in the operator's place and a worker-served Hermes capability as the child.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import nacl.signing
import pytest
from nats.aio.client import Client as NATS

from tests.aip_actions import delegation_request_envelope, did_of, key_of_nkey_seed, sign
from tests.delegation.conftest import CHILD_PREFIX, delegation_stack
from tests.delegation.support import real_hermes_to_a_worker
from tests.integration.stack import Stack
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import GatewayRuntime
from worker.testing.runtime_faults import RuntimeFault
from worker.testing.services import ServiceHandle

from .test_native_nats import SCHEMAS, check_signed, error_code

pytestmark = pytest.mark.asyncio

#: A free subject, as `--delegation-nats-route` names one (not the `aip.v1…` grammar).
SUBJECT = "getaip.delegation.hermes"
#: The runtime's signing principal (its trusted-signers line).
RUNTIME = {"id": "service:getaip-server", "kind": "service"}
#: What the runtime's route config names as PEER_ID.
PEER = {"id": "service:aip-hermes-worker", "kind": "service"}
POST_RUNS = "POST /v1/runs"


@dataclass
class Route:
    stack: Stack
    fake: FakeHermes | None
    runtime: nacl.signing.SigningKey
    gateway: nacl.signing.SigningKey
    gateway_runtime: GatewayRuntime | None = None

    @property
    def nc(self) -> NATS:
        return self.stack.nc

    async def ask(self, envelope: dict[str, Any], *, timeout_s: float = 30) -> dict[str, Any]:
        msg = await self.nc.request(
            SUBJECT, json.dumps({"envelope": envelope}).encode(), timeout=timeout_s
        )
        answer: dict[str, Any] = json.loads(msg.data)["envelope"]
        assert (msg.headers or {})["AIP-Message-Type"] == answer["message_type"]
        return answer

    def check_peer(self, answer: dict[str, Any], request: dict[str, Any]) -> None:
        """getaip-server's peer checks on the answer (§2.6, §3.4); `to` is the requester
        when the request named one (an unsigned request names none)."""
        check_signed(answer, self.gateway.verify_key)
        assert answer["security"]["did"] == did_of(self.gateway)
        assert {k: v for k, v in answer["from"].items() if k != "did"} == PEER
        if "from" in request:
            assert {k: v for k, v in answer["to"].items() if k != "did"} == RUNTIME
        else:
            assert "to" not in answer
        assert answer["correlation_id"] == request["correlation_id"]
        assert answer["in_response_to"] == request["message_id"]
        assert answer["message_id"] != request["message_id"]

    def result(self, answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        """The checked DelegationResult of an answer."""
        self.check_peer(answer, request)
        assert answer["message_type"] == "aip.agent.v1.delegation_result", answer["body"]
        schema = json.loads((SCHEMAS / "aip.agent.v1.delegation_result.json").read_text())
        jsonschema.validate(answer, schema)
        asked = request["body"]["delegation_request"]
        result: dict[str, Any] = answer["body"]["delegation_result"]
        assert result["delegation_id"] == asked["delegation_id"]
        assert result["parent_action_id"] == asked["parent_action_id"]
        assert result["child_action_id"] == asked["child_action"]["id"]
        return result

    async def delegations_stored(self, endpoint: str = "h1") -> int:
        js = self.nc.jetstream()
        stream = await js.find_stream_name_by_subject(f"aip.hermes.{endpoint}.delegations")
        return int((await js.stream_info(stream)).state.last_seq)


def signers_file(tmp_path: Path, runtime: nacl.signing.SigningKey) -> Path:
    path = tmp_path / "aip-signers.txt"
    path.write_text(f"# the GetAIP runtime\n{did_of(runtime)} {RUNTIME['id']} kind=service\n")
    path.chmod(0o600)
    return path


@contextlib.asynccontextmanager
async def open_route(
    tmp_path: Path, nats_url: str, redis_url: str, **gateway_settings: Any
) -> AsyncIterator[Route]:
    runtime = nacl.signing.SigningKey.generate()
    async with delegation_stack(
        tmp_path,
        nats_url,
        redis_url,
        # The runtime asks for no approval record of ours: the child's prefix is exempt.
        worker_env={"AIPD_HERMES_OPERATOR_DELEGATION_APPROVAL_EXEMPT_PREFIXES": CHILD_PREFIX},
        aip_trusted_signers_file=signers_file(tmp_path, runtime),
        aip_delegation_subject=SUBJECT,
        **gateway_settings,
    ) as ds:
        await ds.stack.spawn("w1")
        gateway = key_of_nkey_seed(ds.stack.trust.seed_file.read_bytes())
        yield Route(ds.stack, ds.fake, runtime, gateway, ds.runtime)


@pytest.fixture
async def route(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[Route]:
    async with open_route(tmp_path, nats_server.url, redis_server.url) as opened:
        yield opened


def asked_again(request: dict[str, Any], runtime: nacl.signing.SigningKey) -> dict[str, Any]:
    """The same delegation under a new message id (and a new correlation id)."""
    again = {k: v for k, v in request.items() if k not in ("security", "from")}
    again["message_id"] = "msg_" + secrets.token_hex(16)
    again["correlation_id"] = "corr_" + secrets.token_hex(16)
    return sign(again, runtime, RUNTIME)


async def test_a_delegation_through_the_route_answers_the_childs_verified_result(
    route: Route,
) -> None:
    request = sign(delegation_request_envelope(), route.runtime, RUNTIME)
    jsonschema.validate(
        request, json.loads((SCHEMAS / "aip.agent.v1.delegation_request.json").read_text())
    )
    result = route.result(await route.ask(request), request)
    assert result["status"] == "completed", result
    child = request["body"]["delegation_request"]["child_action"]
    assert result["result"]["action_id"] == child["id"]
    assert result["result"]["status"] == "completed"
    # The echo capability's answer: the child ran with its exact input, once.
    assert result["result"]["output"] == {
        "echo": child["input"],
        "capability": child["capability_id"],
    }
    assert route.fake is not None
    assert route.fake.stats().count(POST_RUNS) == 1

    # The same delegation asked again (a new message id): its stored result, no new run.
    again = asked_again(request, route.runtime)
    stored = await route.delegations_stored()
    assert route.result(await route.ask(again), again) == result
    assert await route.delegations_stored() == stored
    assert route.fake.stats().count(POST_RUNS) == 1


async def test_refusals_are_signed_errors_and_enqueue_nothing(route: Route) -> None:
    before = await route.delegations_stored()

    async def refused(request: dict[str, Any], code: str) -> None:
        answer = await route.ask(request)
        route.check_peer(answer, request)
        assert error_code(answer) == code, answer["body"]

    # unsigned
    await refused(delegation_request_envelope(), "auth.signature.invalid")
    # signed by a key no trusted-signers line names
    stranger = nacl.signing.SigningKey.generate()
    await refused(sign(delegation_request_envelope(), stranger, RUNTIME), "auth.unverified_actor")
    # schema-invalid: our old field name `scopes` in the body
    envelope = delegation_request_envelope()
    envelope["body"]["delegation_request"]["scopes"] = ["support.read"]
    await refused(sign(envelope, route.runtime, RUNTIME), "schema.envelope.invalid")
    # a child capability no route serves
    unknown = sign(
        delegation_request_envelope(capability="cap:nowhere:thing.get"), route.runtime, RUNTIME
    )
    await refused(unknown, "capability.unsupported")
    # the same message again: its id was claimed
    await refused(unknown, "replay.message_id")
    # a delegate whose endpoint takes no delegations here
    await refused(
        sign(delegation_request_envelope(endpoint="h9"), route.runtime, RUNTIME),
        "delegation.target_mismatch",
    )
    # another message type on the route's subject
    other = delegation_request_envelope()
    other["message_type"] = "aip.core.v1.heartbeat"
    other["body"] = {"heartbeat": {"sequence": 1}}
    await refused(sign(other, route.runtime, RUNTIME), "capability.unsupported")
    # no reply subject: nowhere to answer, nothing done
    valid = sign(delegation_request_envelope(), route.runtime, RUNTIME)
    await route.nc.publish(SUBJECT, json.dumps({"envelope": valid}).encode())
    await route.nc.flush()
    await asyncio.sleep(1.0)

    assert await route.delegations_stored() == before
    assert route.fake is not None
    assert route.fake.stats().count(POST_RUNS) == 0


async def test_past_the_timeout_accepted_then_the_same_delegation_reads_its_result(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> None:
    async with open_route(
        tmp_path, nats_server.url, redis_server.url, aip_delegation_timeout_ms=2_000
    ) as route:
        assert route.gateway_runtime is not None
        assert route.fake is not None
        # The child's records stay `running`: the delegation cannot end yet.
        route.gateway_runtime.fault = RuntimeFault.NEVER_SETTLES
        request = sign(delegation_request_envelope(), route.runtime, RUNTIME)
        pending = route.result(await route.ask(request), request)
        assert pending["status"] == "accepted"
        assert "result" not in pending
        assert "error" not in pending
        stored = await route.delegations_stored()
        # The records settle (the recovery sweep writes them); asking again with the same
        # body, later and under new ids, publishes nothing new and ends with the result.
        route.gateway_runtime.fault = RuntimeFault.NONE
        for _ in range(30):
            again = asked_again(request, route.runtime)
            answer = route.result(await route.ask(again), again)
            if answer["status"] != "accepted":
                break
            await asyncio.sleep(0.5)
        assert answer["status"] == "completed", answer
        child = request["body"]["delegation_request"]["child_action"]
        assert answer["result"]["action_id"] == child["id"]
        assert route.fake.stats().count(POST_RUNS) == 1
        # Every later ask published the first request's bytes: deduplicated by JetStream.
        assert await route.delegations_stored() == stored
        # Another body under the same delegation_id is refused.
        other = json.loads(json.dumps(request))
        other["body"]["delegation_request"]["child_action"]["input"] = {"case_id": "other"}
        other = asked_again(other, route.runtime)
        assert error_code(await route.ask(other)) == "action.invalid_input"


# --- the real Hermes --------------------------------------------------------------------


@pytest.mark.real_hermes
async def test_a_real_hermes_run_delegated_through_the_route(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> None:
    """The real Hermes 0.19.0 is h1's operator: it calls `aip_call` once for the child
    `cap:hermes_agent:h2:models`, which a second worker executes against its own (fake)
    Hermes; the route answers with that child's verified result."""
    runtime = nacl.signing.SigningKey.generate()
    child_capability = "cap:hermes_agent:h2:models"
    async with real_hermes_to_a_worker(
        tmp_path,
        nats_server.url,
        redis_server.url,
        child_capability,
        aip_trusted_signers_file=signers_file(tmp_path, runtime),
        aip_delegation_subject=SUBJECT,
        aip_delegation_timeout_ms=110_000,
    ) as (stack, downstream, gateway_rt):
        gateway = key_of_nkey_seed(stack.trust.seed_file.read_bytes())
        route = Route(stack, None, runtime, gateway)
        request = sign(
            delegation_request_envelope(capability=child_capability, input={}), runtime, RUNTIME
        )
        result = route.result(await route.ask(request, timeout_s=120), request)
        assert result["status"] == "completed", result
        child_id = request["body"]["delegation_request"]["child_action"]["id"]
        executed = await stack.client.handle("h2", child_id).result(timeout_s=10)
        assert executed.settled_by == "w-h2"
        assert result["result"]["output"] == executed.output
        assert downstream.stats().count("GET /v1/models") == 1
        assert [call["action_id"] for call in gateway_rt.calls] == [child_id]
