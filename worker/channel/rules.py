"""`AIPD_CHANNEL_EGRESS_FILE`: which results and escalations go into which Hermes session.

Trusted deployment configuration, never payload: a JSON array of rules

    {"id": "support-desk",
     "match": {"endpoint": "hermes-1", "capability_prefix": "cap:hermes_agent:hermes-1:",
               "tenant": "tenant-a", "sources": ["result", "escalation"]},
     "endpoint_id": "hermes-1", "session_id": "desk-session", "max_message_bytes": 4096}

Every `match` field is optional (absent: any); `sources` defaults to both. A source matching
several rules is delivered once per rule. Refused at start-up (exit 2, naming the rule):
an unknown field, a rule naming an endpoint this deployment does not serve, a deployment
with more than one endpoint whose rule lacks `endpoint_id` or `session_id`, a duplicate id,
a file that is not an owner-controlled regular file under 1 MiB. A session that does not
exist is refused when the worker starts (`check_sessions`).

Tenants: a rule delivers only results of the tenant its target endpoint is bound to
(`tenant_id` in the endpoint's descriptor), and an endpoint bound to no tenant accepts
only results without a tenant (a session there is no tenant's, so a tenant's result there
would be readable by whoever reads that session). At load a rule that may deliver
another tenant's results is refused, naming the rule: into a bound endpoint, a rule must
pin `match.tenant` to that tenant (or match only a source endpoint bound to it); into an
unbound one, a rule must not name a tenant nor match only a tenant-bound source endpoint.
An endpoint configured `shared` (`AIPD_HERMES_SHARED_ENDPOINTS`) partitions its session
ids per tenant (`worker.operations.partition`): there a source is delivered only into a
session of its own tenant's partition (the session id starts with
`partition_prefix(tenant)`, the untenanted partition's for a source without a tenant), and
a rule pinned to a tenant whose session lies outside that partition is refused at load.
What load cannot know (a rule of any tenant, fed by unbound source endpoints) is checked
per source: `EgressRule.matches` admits a source only when `admits(tenant)`, and the
egress intake checks it again against the tenant the source's lease recorded.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypeVar

import msgspec

from schemas.channel import MAX_CHANNEL_MESSAGE_BYTES, ChannelSource, SessionId
from schemas.ids import EndpointId, ShortText
from worker.errors import ChannelConfigError
from worker.trust.tenancy import partition_prefix

MAX_FILE_BYTES = 1_048_576
DEFAULT_MESSAGE_BYTES = 4_096
MAX_RULES = 256

T = TypeVar("T")


class _Match(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    endpoint: EndpointId | None = None
    capability_prefix: ShortText | None = None
    tenant: ShortText | None = None
    sources: list[ChannelSource] = msgspec.field(
        default_factory=lambda: [ChannelSource.RESULT, ChannelSource.ESCALATION]
    )


class _Rule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    id: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}\Z")]
    match: _Match = msgspec.field(default_factory=_Match)
    endpoint_id: EndpointId | None = None
    session_id: SessionId | None = None
    max_message_bytes: Annotated[int, msgspec.Meta(ge=256, le=MAX_CHANNEL_MESSAGE_BYTES)] = (
        DEFAULT_MESSAGE_BYTES
    )


@dataclass(frozen=True, slots=True)
class EgressRule:
    id: str
    endpoint_id: str
    session_id: str
    max_message_bytes: int
    match_endpoint: str | None
    capability_prefix: str | None
    tenant: str | None
    sources: frozenset[ChannelSource]
    #: The tenant the target endpoint is bound to (None: bound to none). Only sources of
    #: exactly this tenant are delivered.
    target_tenant: str | None = None
    #: The target endpoint is shared: a source goes only into its own tenant's partition.
    target_shared: bool = False

    def admits(self, tenant: str | None) -> bool:
        """Whether a source of `tenant` may be delivered into this rule's session."""
        if self.target_shared:
            return self.session_id.startswith(partition_prefix(tenant))
        return tenant == self.target_tenant

    def matches(
        self, source: ChannelSource, endpoint_id: str, capability: str, tenant: str | None
    ) -> bool:
        return (
            source in self.sources
            and (self.match_endpoint is None or self.match_endpoint == endpoint_id)
            and (self.capability_prefix is None or capability.startswith(self.capability_prefix))
            and (self.tenant is None or self.tenant == tenant)
            and self.admits(tenant)
        )


@dataclass(frozen=True, slots=True)
class EgressTable:
    rules: tuple[EgressRule, ...]

    def matching(
        self, source: ChannelSource, endpoint_id: str, capability: str, tenant: str | None
    ) -> list[EgressRule]:
        return [r for r in self.rules if r.matches(source, endpoint_id, capability, tenant)]

    def rule(self, rule_id: str) -> EgressRule | None:
        return next((r for r in self.rules if r.id == rule_id), None)

    def targets(self) -> set[tuple[str, str]]:
        """Every (endpoint, session) some rule delivers to (checked at start-up)."""
        return {(r.endpoint_id, r.session_id) for r in self.rules}


def _read(path: Path, what: str, typ: type[T]) -> list[T]:
    """The file's rules: a regular, not group/world-writable file under 1 MiB, decoded
    strictly (unknown fields refused)."""
    try:
        info = path.stat()
    except OSError as exc:
        raise ChannelConfigError(f"{what}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ChannelConfigError(f"{what}: not a regular file")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ChannelConfigError(f"{what}: group- or world-writable")
    if info.st_size > MAX_FILE_BYTES:
        raise ChannelConfigError(f"{what}: larger than {MAX_FILE_BYTES} bytes")
    try:
        rules: list[T] = msgspec.json.decode(
            path.read_bytes(), type=Annotated[list[typ], msgspec.Meta(max_length=MAX_RULES)]  # type: ignore[valid-type]
        )
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ChannelConfigError(f"{what}: {exc}") from None
    return rules


def _source_endpoint(rule: _Rule) -> str | None:
    """The one endpoint whose results the rule can match, when it names one."""
    if rule.match.endpoint is not None:
        return rule.match.endpoint
    prefix = rule.match.capability_prefix
    if prefix is not None:
        parts = prefix.split(":")
        if len(parts) >= 4 and parts[:2] == ["cap", "hermes_agent"]:
            return parts[2]
    return None


def _tenant_problem(
    rule: _Rule, target: str, session_id: str, tenants: Mapping[str, str | None], shared: bool
) -> str | None:
    """Why this rule could deliver one tenant's results into another's session, or None
    (see the module docstring)."""
    bound = tenants.get(target)
    source_endpoint = _source_endpoint(rule)
    source_tenant = rule.match.tenant
    if source_tenant is None and source_endpoint is not None:
        source_tenant = tenants.get(source_endpoint)
    if shared:
        prefix = partition_prefix(source_tenant)
        if source_tenant is not None and not session_id.startswith(prefix):
            return (
                f"delivers results of tenant {source_tenant!r} into session {session_id!r} "
                f"of shared endpoint {target!r}, outside that tenant's partition (its "
                f"session ids start with {prefix!r})"
            )
        return None
    if bound is not None:
        if source_tenant is None:
            return (
                f"delivers results of any tenant into a session of endpoint {target!r}, "
                f"which is bound to tenant {bound!r}: set match.tenant to {bound!r}"
            )
        if source_tenant != bound:
            return (
                f"delivers results of tenant {source_tenant!r} into a session of endpoint "
                f"{target!r}, which is bound to tenant {bound!r}"
            )
        return None
    if source_tenant is not None:
        return (
            f"delivers results of tenant {source_tenant!r} into a session of endpoint "
            f"{target!r}, which is bound to no tenant and accepts only results without one"
        )
    return None


def load_egress_rules(
    path: Path,
    endpoint_ids: list[str],
    tenants: Mapping[str, str | None] | None = None,
    shared: frozenset[str] = frozenset(),
) -> EgressTable:
    """The validated table, or ChannelConfigError naming what to fix. `tenants` is each
    endpoint's tenant binding (absent or None: bound to none); `shared`, the endpoints
    configured shared."""
    tenants = tenants or {}
    what = f"AIPD_CHANNEL_EGRESS_FILE {path}"
    raw = _read(path, what, _Rule)
    seen: set[str] = set()
    rules: list[EgressRule] = []
    for rule in raw:
        where = f"{what}: rule {rule.id!r}"
        if rule.id in seen:
            raise ChannelConfigError(f"{where}: duplicate id")
        seen.add(rule.id)
        if len(endpoint_ids) > 1 and (rule.endpoint_id is None or rule.session_id is None):
            raise ChannelConfigError(
                f"{where}: a multi-endpoint deployment must name both endpoint_id and session_id"
            )
        if rule.session_id is None:
            raise ChannelConfigError(f"{where}: session_id is required")
        endpoint_id = rule.endpoint_id or endpoint_ids[0]
        for named in (endpoint_id, rule.match.endpoint):
            if named is not None and named not in endpoint_ids:
                raise ChannelConfigError(f"{where}: endpoint {named!r} is not configured")
        problem = _tenant_problem(
            rule, endpoint_id, rule.session_id, tenants, endpoint_id in shared
        )
        if problem is not None:
            raise ChannelConfigError(f"{where}: {problem}")
        rules.append(
            EgressRule(
                id=rule.id,
                endpoint_id=endpoint_id,
                session_id=rule.session_id,
                max_message_bytes=rule.max_message_bytes,
                match_endpoint=rule.match.endpoint,
                capability_prefix=rule.match.capability_prefix,
                tenant=rule.match.tenant,
                sources=frozenset(rule.match.sources),
                target_tenant=tenants.get(endpoint_id),
                target_shared=endpoint_id in shared,
            )
        )
    return EgressTable(tuple(rules))


class _IngressRule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    endpoint_id: EndpointId | None = None
    session_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}\Z")]
    poll_interval_ms: Annotated[int, msgspec.Meta(ge=100, le=60_000)] = 1_000


@dataclass(frozen=True, slots=True)
class IngressTarget:
    """One followed session: `AIPD_CHANNEL_INGRESS_FILE` is a JSON array of
    `{"endpoint_id", "session_id", "poll_interval_ms"}` (the same file checks as egress;
    session ids are letters, digits, `_` and `-`, since they become a subject token)."""

    endpoint_id: str
    session_id: str
    poll_interval_ms: int


def load_ingress_rules(path: Path, endpoint_ids: list[str]) -> tuple[IngressTarget, ...]:
    what = f"AIPD_CHANNEL_INGRESS_FILE {path}"
    raw = _read(path, what, _IngressRule)
    targets: list[IngressTarget] = []
    for rule in raw:
        where = f"{what}: session {rule.session_id!r}"
        if len(endpoint_ids) > 1 and rule.endpoint_id is None:
            raise ChannelConfigError(f"{where}: a multi-endpoint deployment must name endpoint_id")
        endpoint_id = rule.endpoint_id or endpoint_ids[0]
        if endpoint_id not in endpoint_ids:
            raise ChannelConfigError(f"{where}: endpoint {endpoint_id!r} is not configured")
        target = IngressTarget(endpoint_id, rule.session_id, rule.poll_interval_ms)
        if any((t.endpoint_id, t.session_id) == (endpoint_id, rule.session_id) for t in targets):
            raise ChannelConfigError(f"{where}: listed twice")
        targets.append(target)
    return tuple(targets)
