"""The fail-closed router policy a DelegationRequest must pass before anything is started.

Spec "Route first-class delegation" and the connector overview's "Router Policy", in order:

1. the delegate principal names this endpoint (`connector_host.route_mismatch`);
2. delegation is enabled, with both explicit allowlists (`operator_policy`);
3. the child's capability id and every requested scope match the allowlists (textual
   `starts_with`; `*` opts one dimension into everything);
4. the chain is valid: shorter than `max_delegation_depth`, ends with the delegator, repeats
   no principal and does not already contain the delegate (no self-hop, no cycle);
5. the child carries the same delegation contract (id and chain) and is issued to the
   delegate itself, in the verified tenant (`tenant_mismatch`);
6. the child is not itself a Hermes operator Action: recursive delegation through the model
   is what the spec forbids exposing.

Identity (the delegator against the identity directory), the endpoint's tenant binding and
the durable approval are checked by the trust layer (`worker.delegation.handler`).
"""

from __future__ import annotations

import re

from schemas.delegation import AGENT_KIND, DELEGATE_PREFIX, DelegationRequest
from schemas.errors import ErrorCode
from worker.endpoints import Endpoint
from worker.errors import ConnectorError
from worker.operator.policy import HermesOperatorPolicy

_HERMES_OPERATOR = re.compile(r"cap:hermes_agent:[^:]+:operator")


def _policy(message: str) -> ConnectorError:
    return ConnectorError(ErrorCode.OPERATOR_POLICY, f"delegation refused: {message}")


def delegate_endpoint(request: DelegationRequest) -> str:
    return request.delegate.removeprefix(DELEGATE_PREFIX)


def check_route_policy(
    request: DelegationRequest, endpoint: Endpoint, policy: HermesOperatorPolicy
) -> None:
    """Raise the typed refusal of the first rule `request` breaks; nothing was sent then."""
    if delegate_endpoint(request) != endpoint.id:
        raise ConnectorError(
            ErrorCode.HOST_ROUTE_MISMATCH,
            f"delegate {request.delegate!r} does not name endpoint {endpoint.id!r}",
        )
    policy.validate()
    if not policy.delegation_enabled:
        raise _policy(
            "first-class delegation is disabled (AIPD_HERMES_OPERATOR_DELEGATION_ENABLED)"
        )
    child = request.action
    if _HERMES_OPERATOR.fullmatch(child.capability):
        raise _policy("a Hermes operator Action cannot be delegated to the operator")
    if not policy.allows_capability(child.capability):
        raise _policy(f"capability {child.capability!r} is outside the capability allowlist")
    for scope in request.scopes:
        if not policy.allows_scope(scope):
            raise _policy(f"scope {scope!r} is outside the scope allowlist")
    _check_chain(request, policy)
    contract = child.delegation
    if contract is None or contract.delegation_id != request.delegation_id:
        raise _policy("the child Action does not carry this delegation's id")
    if contract.chain != request.chain:
        raise _policy("the child Action's delegation chain differs from the request's")
    if child.identity.principal_id != request.delegate:
        raise _policy("the child Action is not issued to the delegate principal")
    if child.identity.principal_kind != AGENT_KIND:
        raise _policy("the delegate must be an Agent principal (principal_kind agent)")


def _check_chain(request: DelegationRequest, policy: HermesOperatorPolicy) -> None:
    chain = request.chain
    if len(chain) >= policy.max_delegation_depth:
        raise _policy(
            f"the chain has {len(chain)} hops; the depth limit is "
            f"{policy.max_delegation_depth} (it must stay below it)"
        )
    if chain[-1] != request.delegator.principal_id:
        raise _policy("the chain is discontinuous: it does not end with the delegator")
    if len(set(chain)) != len(chain):
        raise _policy("the chain repeats a principal (a cycle)")
    if request.delegate in chain:
        raise _policy("the delegate is already in the chain (a self-hop or a cycle)")


def check_child_tenant(
    request: DelegationRequest, endpoint: Endpoint, verified_tenant: str | None
) -> None:
    """The child runs in the delegator's verified tenant, which is the endpoint's when bound."""
    expected = endpoint.descriptor.tenant_id or verified_tenant
    if request.action.identity.tenant_id != expected:
        raise ConnectorError(
            ErrorCode.TENANT_MISMATCH,
            "the child Action's tenant is not the verified tenant of this delegation",
        )
