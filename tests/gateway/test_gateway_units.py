"""The gateway's pure parts: the route table, the principals file, the operator instructions."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from worker.delegation.payload import DELEGATION_INSTRUCTIONS
from worker.errors import RouteConfigError, TrustConfigError
from worker.gateway.mcp_app import TOOL_SCOPES
from worker.gateway.principals import Principals
from worker.gateway.routes import RouteTable
from worker.gateway.service import _serves_tenant
from worker.operator.policy import BUILTIN_INSTRUCTIONS
from worker.testing.gateway import principal_entry, write_principals_file


def test_the_builtin_instructions_name_exactly_the_tools_that_exist() -> None:
    named = set(re.findall(r"\baip_[a-z_]+", BUILTIN_INSTRUCTIONS)) - {"aip_operator_objective"}
    assert named == set(TOOL_SCOPES)
    assert "aip_delegate" not in TOOL_SCOPES
    delegated = set(re.findall(r"\baip_[a-z_]+", DELEGATION_INSTRUCTIONS))
    assert delegated - {"aip_delegated_call", "aip_call_arguments"} == {"aip_call"}


def test_the_builtin_route_reaches_the_endpoint_subjects() -> None:
    table = RouteTable.from_setting("aip", None)
    route = table.resolve("cap:hermes_agent:h2:models")
    assert route is not None
    assert route.endpoint_id == "h2"
    assert route.subjects.actions == "aip.hermes.h2.actions"
    assert route.subjects.results("act_" + "0" * 32) == "aip.hermes.h2.results.act_" + "0" * 32
    assert route.subjects.cancel == "aip.hermes.h2.cancel"
    assert table.resolve("cap:billing:invoice.pay") is None
    assert table.resolve("cap:hermes_agent:Bad Endpoint:models") is None


def test_configured_routes_merge_and_the_longest_prefix_wins() -> None:
    table = RouteTable.from_setting(
        "aip",
        '{"cap:support_sandbox:": "aip.sandbox", "cap:support_sandbox:case.": "aip.cases"}',
    )
    sandbox = table.resolve("cap:support_sandbox:ticket.get")
    case = table.resolve("cap:support_sandbox:case.get")
    assert sandbox is not None
    assert case is not None
    assert sandbox.subjects.actions == "aip.sandbox.actions"
    assert case.subjects.actions == "aip.cases.actions"
    assert sandbox.audit_endpoint == "_gateway"
    # null removes the built-in route.
    assert (
        RouteTable.from_setting("aip", '{"cap:hermes_agent:{endpoint}:": null}').resolve(
            "cap:hermes_agent:h1:models"
        )
        is None
    )


@pytest.mark.parametrize(
    "raw",
    [
        '{"billing:": "aip.billing"}',
        '{"cap:x:": "aip.>"}',
        '{"cap:x:": 3}',
        "[1]",
        "not json",
        '{"cap:x:": "aip.{endpoint}"}',
    ],
)
def test_a_bad_route_table_is_refused(raw: str) -> None:
    with pytest.raises(RouteConfigError):
        RouteTable.from_setting("aip", raw)


def test_the_principals_file_authenticates_hashes_and_refuses_unsafe_files(tmp_path: Path) -> None:
    path = write_principals_file(
        tmp_path,
        [
            principal_entry("good-token", "agent:a"),
            principal_entry("old", "agent:b", valid_for_ms=-1),
        ],
    )
    assert "good-token" not in path.read_text()
    principals = Principals.load(path)
    now = 1
    found = principals.authenticate("good-token", now_ms=now)
    assert found is not None
    assert found.principal_id == "agent:a"
    assert principals.authenticate("old", now_ms=2**62) is None
    assert principals.authenticate("other", now_ms=now) is None
    assert principals.authenticate(None, now_ms=now) is None
    for mode in (0o644, 0o620):
        os.chmod(path, mode)
        with pytest.raises(TrustConfigError):
            Principals.load(path)
    os.chmod(path, 0o600)
    path.write_text('[{"token_sha256": "zz", "principal_id": "a"}]')
    with pytest.raises(TrustConfigError, match="principal 0"):
        Principals.load(path)


def test_a_principals_allowlists_admit_only_what_they_name(tmp_path: Path) -> None:
    path = write_principals_file(
        tmp_path,
        [
            principal_entry(
                "limited",
                "agent:a",
                capability_prefixes=["cap:hermes_agent:h1:", "cap:support_sandbox:case."],
                endpoints=["h1"],
            ),
            principal_entry("open", "agent:b"),
        ],
    )
    principals = Principals.load(path)
    limited = principals.authenticate("limited", now_ms=1)
    unlimited = principals.authenticate("open", now_ms=1)
    assert limited is not None
    assert unlimited is not None
    assert limited.may_call("cap:hermes_agent:h1:models", "h1")
    assert limited.may_call("cap:support_sandbox:case.get", None)  # no endpoint: prefixes only
    assert not limited.may_call("cap:hermes_agent:h2:models", "h2")
    assert not limited.may_call("cap:support_sandbox:billing.pay", None)
    assert unlimited.may_call("cap:hermes_agent:h2:models", "h2")
    # The routes it is shown are those its prefixes can reach.
    assert limited.may_route("cap:hermes_agent:{endpoint}:")
    assert limited.may_route("cap:support_sandbox:")
    assert not limited.may_route("cap:billing:")
    assert unlimited.may_route("cap:billing:")
    for bad in ({"capability_prefixes": ["notcap"]}, {"endpoints": ["Bad Endpoint"]}):
        path.write_text(json.dumps([{**principal_entry("x", "agent:x"), **bad}]), encoding="utf-8")
        with pytest.raises(TrustConfigError, match="principal 0"):
            Principals.load(path)


def _manifest(tenant_id: str | None, ours: dict[str, object]) -> dict[str, object]:
    """The parts of an AIP manifest the tenancy check reads, written as the reference
    places them: the binding in `compatibility.tenant_bound_endpoints`, ours in the
    extension."""
    bound = [] if tenant_id is None else [{"endpoint_id": "h1", "tenant_id": tenant_id}]
    return {
        "compatibility": {"tenant_bound_endpoints": bound},
        "extensions": {"org.aip-hermes-worker": ours},
    }


@pytest.mark.parametrize(
    ("manifest", "tenant", "offered"),
    [
        (_manifest(None, {"shared": False}), "acme", False),  # unbound, not shared
        (_manifest(None, {"shared": False}), None, True),
        (_manifest(None, {"shared": True}), "acme", True),
        (_manifest(None, {}), "acme", False),  # no `shared`: not shared (fail closed)
        (_manifest(None, {"shared": "yes"}), "acme", False),  # malformed: hidden
        (_manifest("acme", {"shared": False}), "acme", True),
        (_manifest("acme", {"shared": False}), "globex", False),
        (_manifest("acme", {"tenant_expires_at_unix_ms": 999}), "acme", False),  # expired
        ({"compatibility": {"tenant_bound_endpoints": [{"tenant_id": 7}]}}, "acme", False),
    ],
)
def test_the_gateway_offers_an_endpoint_only_to_tenants_its_worker_admits(
    manifest: dict[str, object], tenant: str | None, offered: bool
) -> None:
    """The gateway reads the AIP manifest's binding and `shared` as the worker's tenancy
    check does, so it never offers an unbound, unshared endpoint to a tenant principal
    (issue 24, item 5)."""
    assert _serves_tenant(manifest, tenant, now=1_000) is offered
