"""The fail-closed router policy and the exact `aip_call` payload (spec items 7 and 8)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from schemas.errors import EnvelopeRejected, ErrorCode
from worker.delegation.action_id import delegation_action_id
from worker.delegation.entry import internal_action
from worker.delegation.payload import (
    DELEGATION_INSTRUCTIONS,
    PAYLOAD_KIND,
    aip_call_arguments,
    delegated_payload,
)
from worker.delegation.router import check_child_tenant, check_route_policy
from worker.endpoints import Endpoint, EndpointDescriptor
from worker.errors import ConnectorError
from worker.fingerprints import operator_fingerprint
from worker.operator.policy import BUILTIN_INSTRUCTIONS, HermesOperatorPolicy
from worker.secret_files import Secret
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.delegations import decode_delegation, encode_delegation

from .support import CHILD_CAPABILITY, DELEGATOR, enabled_policy, make_request


def endpoint(endpoint_id: str = "h1", tenant_id: str | None = None) -> Endpoint:
    return Endpoint(
        descriptor=EndpointDescriptor(
            id=endpoint_id, url="http://127.0.0.1:1", tenant_id=tenant_id
        ),
        api_key=Secret("k" * 32),
    )


def refusal(request: Any, policy: HermesOperatorPolicy, ep: Endpoint | None = None) -> str:
    with pytest.raises(ConnectorError) as caught:
        check_route_policy(request, ep or endpoint(), policy)
    return caught.value.code.value + ": " + caught.value.message


def test_a_valid_request_passes_the_router_policy() -> None:
    check_route_policy(make_request(), endpoint(), enabled_policy())


def test_delegation_is_refused_while_disabled_even_with_allowlists() -> None:
    policy = HermesOperatorPolicy(
        capability_prefixes=("cap:support_sandbox:",), scope_prefixes=("support.",)
    )
    assert refusal(make_request(), policy).startswith("connector.hermes_agent.operator_policy")
    assert "disabled" in refusal(make_request(), HermesOperatorPolicy())


@pytest.mark.parametrize(
    ("policy_changes", "why"),
    [
        ({"capability_prefixes": ("cap:billing:",)}, "capability allowlist"),
        ({"scope_prefixes": ("billing.",)}, "scope allowlist"),
        ({"max_delegation_depth": 1}, "depth limit"),
    ],
)
def test_allowlists_and_depth_are_enforced(policy_changes: dict[str, Any], why: str) -> None:
    message = refusal(make_request(), enabled_policy(**policy_changes))
    assert message.startswith("connector.hermes_agent.operator_policy")
    assert why in message


def test_star_opts_one_dimension_into_everything() -> None:
    policy = enabled_policy(capability_prefixes=("*",), scope_prefixes=("*",))
    check_route_policy(make_request(), endpoint(), policy)


def test_the_delegate_must_name_the_endpoint_it_was_delivered_to() -> None:
    message = refusal(make_request("h2"), enabled_policy(), endpoint("h1"))
    assert message.startswith("connector_host.route_mismatch")


@pytest.mark.parametrize(
    ("chain", "why"),
    [
        (["user:root", "user:other"], "discontinuous"),
        ([DELEGATOR, "user:x", DELEGATOR], "repeats"),
        (["agent:hermes_operator:h1", DELEGATOR], "self-hop"),
    ],
)
def test_invalid_chains_are_refused(chain: list[str], why: str) -> None:
    assert why in refusal(make_request(chain=chain), enabled_policy())


def test_the_child_must_carry_the_same_delegation_contract() -> None:
    request = make_request()
    other_id = msgspec.structs.replace(
        request.action,
        delegation=msgspec.structs.replace(request.action.delegation, delegation_id="dlg-x"),
    )
    assert "delegation's id" in refusal(
        msgspec.structs.replace(request, action=other_id), enabled_policy()
    )
    other_chain = msgspec.structs.replace(
        request.action,
        delegation=msgspec.structs.replace(request.action.delegation, chain=["user:else"]),
    )
    assert "chain differs" in refusal(
        msgspec.structs.replace(request, action=other_chain), enabled_policy()
    )


def test_the_child_must_be_issued_to_the_delegate() -> None:
    request = make_request()
    child = msgspec.structs.replace(
        request.action,
        identity=msgspec.structs.replace(request.action.identity, principal_id="agent:other"),
    )
    assert "delegate principal" in refusal(
        msgspec.structs.replace(request, action=child), enabled_policy()
    )


def test_the_delegate_must_be_an_agent_principal() -> None:
    request = make_request()
    child = msgspec.structs.replace(
        request.action,
        identity=msgspec.structs.replace(request.action.identity, principal_kind="user"),
    )
    assert "Agent principal" in refusal(
        msgspec.structs.replace(request, action=child), enabled_policy()
    )


def test_a_hermes_operator_child_is_never_delegated_to_the_operator() -> None:
    request = make_request(capability="cap:hermes_agent:h1:operator")
    policy = enabled_policy(capability_prefixes=("*",))
    assert "cannot be delegated" in refusal(request, policy)


def test_child_tenant_follows_the_endpoint_binding_or_the_verified_tenant() -> None:
    check_child_tenant(make_request(tenant_id="tenant-a"), endpoint(), "tenant-a")
    check_child_tenant(make_request(tenant_id="tenant-a"), endpoint(tenant_id="tenant-a"), None)
    for request, ep, verified in (
        (make_request(tenant_id="tenant-b"), endpoint(), "tenant-a"),
        (make_request(tenant_id="tenant-b"), endpoint(tenant_id="tenant-a"), "tenant-a"),
        (make_request(tenant_id=None), endpoint(tenant_id="tenant-a"), "tenant-a"),
    ):
        with pytest.raises(ConnectorError) as caught:
            check_child_tenant(request, ep, verified)
        assert caught.value.code is ErrorCode.TENANT_MISMATCH


def test_aip_call_arguments_are_the_exact_child_in_the_reference_shape() -> None:
    """The reference `aip_call` takes the AIP Action's fields at the top level (upstream
    aip-mcp-server): `action_id`, `capability_id`, `input`, `mode` (`streaming` spelt as AIP
    spells it); our facts with no AIP field ride in our extension key."""
    request = make_request()
    child = request.action
    arguments = aip_call_arguments(child)
    reference = {
        "capability_id", "input", "action_id", "mode", "idempotency_key", "timeout_ms",
        "conversation", "memory_context", "delegation_chain", "federation", "callback",
        "observability", "compliance", "approval", "transaction", "context",
    }  # fmt: skip
    assert set(arguments) - {"extensions"} <= reference
    assert arguments["action_id"] == child.id
    assert arguments["capability_id"] == CHILD_CAPABILITY
    assert arguments["input"] == child.input
    assert (
        arguments["mode"]
        == {"sync": "sync", "async": "async", "stream": "streaming"}[child.mode.value]
    )
    assert "identity" not in arguments
    assert "id" not in arguments
    ours = arguments["extensions"]["org.aip-hermes-worker"]
    assert ours["created_at_unix_ms"] == child.created_at_unix_ms
    assert child.delegation is not None
    assert ours["delegation"]["delegation_id"] == child.delegation.delegation_id


def test_the_model_facing_payload_holds_the_arguments_and_governed_instructions() -> None:
    request = make_request()
    policy = enabled_policy(model="deployment/route")
    body = json.loads(delegated_payload(policy, request, "aip-operator-act_x"))
    assert body["session_id"] == "aip-operator-act_x"
    assert body["model"] == "deployment/route"
    assert body["instructions"] == BUILTIN_INSTRUCTIONS + DELEGATION_INSTRUCTIONS
    assert "exactly once" in body["instructions"]
    provider_input = json.loads(body["input"])
    assert provider_input["kind"] == PAYLOAD_KIND
    assert provider_input["aip_call_arguments"] == aip_call_arguments(request.action)
    # No identity travels to the model: the authenticated MCP transport supplies it.
    assert not _keys_named(provider_input, {"identity", "principal_kind", "credential_revision"})
    assert request.delegator.authentication_issuer not in body["input"]


def _keys_named(value: Any, names: set[str]) -> set[str]:
    """Every key in `names` found anywhere in a JSON value."""
    if isinstance(value, dict):
        found = names & set(value)
        for item in value.values():
            found |= _keys_named(item, names)
        return found
    if isinstance(value, list):
        return set().union(*(_keys_named(item, names) for item in value)) if value else set()
    return set()


def test_an_oversize_delegation_input_is_refused_before_any_binding() -> None:
    request = make_request(child_input={"blob": "x" * 4096})
    with pytest.raises(ConnectorError) as caught:
        delegated_payload(enabled_policy(max_input_bytes=1024), request, "s")
    assert caught.value.code is ErrorCode.CONFIGURATION_OR_INPUT


def test_the_delegation_action_id_is_stable_and_collides_on_reuse() -> None:
    request = make_request()
    action = internal_action(request, "h1")
    assert action.id == delegation_action_id(request.delegation_id)
    assert action.id != request.action.id
    assert internal_action(request, "h1").id == action.id
    assert action.delegation is not None
    assert action.delegation.chain == request.chain
    other_child = msgspec.structs.replace(
        request, action=msgspec.structs.replace(request.action, input={"case_id": "other"})
    )
    assert internal_action(other_child, "h1").id == action.id
    assert operator_fingerprint("h1", internal_action(other_child, "h1")) != operator_fingerprint(
        "h1", action
    )
    assert operator_fingerprint("h2", action) != operator_fingerprint("h1", action)


def test_the_wire_type_is_strict() -> None:
    request = make_request()
    sealed = encode_delegation(request, signer=None, sender=GATEWAY_SENDER)
    assert decode_delegation(sealed, max_bytes=1 << 20)[0] == request
    envelope = json.loads(sealed)
    body = envelope["body"]["delegation_request"]

    def changed(**fields: Any) -> dict[str, Any]:
        return {**envelope, "body": {"delegation_request": {**body, **fields}}}

    child = body["child_action"]
    for broken in (
        changed(scope=""),
        changed(child_action={**child, "delegation_chain": []}),
        changed(delegate={"id": "user:alice", "kind": "agent"}),
        changed(delegate={**body["delegate"], "kind": "human"}),
        changed(unknown=1),
        changed(child_action={**child, "capability_id": "support:case.get"}),
        changed(child_action={**child, "id": body["parent_action_id"]}),
        changed(metadata={"scopes": ["another"]}),
        {**envelope, "message_type": "aip.core.v1.action"},
        {**envelope, "extensions": {"org.aip-hermes-worker": {"received": {}}}},
    ):
        with pytest.raises(EnvelopeRejected):
            decode_delegation(json.dumps(broken).encode(), max_bytes=1 << 20)
