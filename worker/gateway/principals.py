"""The MCP bearer principals: one token per Hermes instance, stored only as its sha256.

`AIPD_MCP_PRINCIPALS_FILE` is policy like the other trust files (whoever writes it can act as
any principal), so it is read through `read_policy_file` (regular file, under 1 MiB, nobody
but the owner may write it) and, because it names who may call what, it must not be
readable by group or others either. It never holds a token: a presented token is hashed
and looked up, so the file leaking does not leak a credential.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import msgspec

from schemas.action import Identity
from schemas.lifecycle import AuthenticatedPrincipal
from worker.errors import TrustConfigError
from worker.trust.files import policy_records, read_policy_file

WHAT = "MCP principals file"
T = TypeVar("T")
_SHA256_HEX = r"^[0-9a-f]{64}\Z"


class PrincipalRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One entry of the principals file."""

    token_sha256: Annotated[str, msgspec.Meta(pattern=_SHA256_HEX)]
    principal_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    principal_kind: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    tenant_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    authentication_issuer: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    revision: Annotated[int, msgspec.Meta(ge=0)]
    scopes: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=512)]],
        msgspec.Meta(max_length=64),
    ]
    expires_at_unix_ms: Annotated[int, msgspec.Meta(ge=0)]
    #: The capability-id prefixes this principal may call (textual `starts_with`); absent
    #: means every routed capability. A Hermes principal is steered by whoever chats with
    #: it, so it should name only what that Hermes needs.
    capability_prefixes: (
        Annotated[
            list[Annotated[str, msgspec.Meta(pattern=r"^cap:", min_length=5, max_length=512)]],
            msgspec.Meta(max_length=64),
        ]
        | None
    ) = None
    #: The Hermes endpoints its children may go to; absent means every routed endpoint.
    #: Routes to other executors (no endpoint) are governed by `capability_prefixes` alone.
    endpoints: (
        Annotated[
            list[Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}\Z")]],
            msgspec.Meta(max_length=256),
        ]
        | None
    ) = None


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: who the token says it is, never anything from a payload."""

    principal_id: str
    principal_kind: str
    tenant_id: str | None
    authentication_issuer: str | None
    revision: int
    scopes: frozenset[str]
    expires_at_unix_ms: int
    #: None: every routed capability / endpoint (the file left it open).
    capability_prefixes: tuple[str, ...] | None = None
    endpoints: frozenset[str] | None = None

    def has(self, scope: str) -> bool:
        return scope in self.scopes

    def may_call(self, capability: str, endpoint_id: str | None) -> bool:
        """Whether this principal's allowlists admit `capability`, routed to `endpoint_id`
        (a Hermes endpoint, or None for another executor)."""
        if self.capability_prefixes is not None and not any(
            capability.startswith(prefix) for prefix in self.capability_prefixes
        ):
            return False
        return self.endpoints is None or endpoint_id is None or endpoint_id in self.endpoints

    def may_route(self, capability_prefix: str) -> bool:
        """Whether a route of `capability_prefix` can serve anything this principal may call
        (what `aip_capabilities` shows of the route table)."""
        if self.capability_prefixes is None:
            return True
        head = capability_prefix.partition("{endpoint}")[0]
        return any(p.startswith(head) or head.startswith(p) for p in self.capability_prefixes)

    def identity(self) -> Identity:
        """The child Action's identity: the transport-authenticated principal."""
        return Identity(
            principal_id=self.principal_id,
            principal_kind=self.principal_kind,
            tenant_id=self.tenant_id,
            authentication_issuer=self.authentication_issuer,
            credential_revision=self.revision,
        )

    def authenticated(self) -> AuthenticatedPrincipal:
        """The queue record's `authenticated` block."""
        return AuthenticatedPrincipal(
            principal_id=self.principal_id,
            principal_kind=self.principal_kind,
            tenant_id=self.tenant_id,
            authentication_issuer=self.authentication_issuer,
            credential_revision=self.revision,
            scopes=sorted(self.scopes),
            expires_at_unix_ms=self.expires_at_unix_ms,
        )


def token_sha256(token: str) -> str:
    """What the principals file stores for `token`."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def find_by_token(by_hash: Mapping[str, T], token: str | None) -> T | None:
    """What `by_hash` holds under the sha256 of a present `token`; None otherwise.

    The lookup is by hash, then compared in constant time, so timing says nothing about how
    much of a guessed token matched (the gateway's principals and the console's tokens)."""
    if not token:
        return None
    digest = token_sha256(token)
    for known, value in by_hash.items():
        if hmac.compare_digest(known, digest):
            return value
    return None


class HashedToken(Protocol):
    @property
    def token_sha256(self) -> str: ...


R = TypeVar("R", bound=HashedToken)


def token_records(path: Path, *, what: str, noun: str, record_type: type[R]) -> list[R]:
    """The records of a bearer-token file (the gateway's principals, the console's tokens):
    policy read like every trust file (`read_policy_file`), refused when group or others may
    read it (it names who may see or do what), each token hash at most once."""
    policy = read_policy_file(path, what=what)
    if policy.readable_by_others:
        raise TrustConfigError(f"{what} {path}: group or others may read it; chmod 600 it")
    seen: set[str] = set()
    records: list[R] = []
    for _, where, record in policy_records(
        policy, path, what=what, noun=noun, record_type=record_type
    ):
        if record.token_sha256 in seen:
            raise TrustConfigError(f"{where}: repeats the token hash of another {noun}")
        seen.add(record.token_sha256)
        records.append(record)
    return records


class Principals:
    """Token hash -> principal; `authenticate` is the only way in."""

    def __init__(self, by_hash: dict[str, Principal]) -> None:
        self._by_hash = by_hash

    @classmethod
    def load(cls, path: Path) -> Principals:
        by_hash: dict[str, Principal] = {}
        for record in token_records(path, what=WHAT, noun="principal", record_type=PrincipalRecord):
            by_hash[record.token_sha256] = Principal(
                principal_id=record.principal_id,
                principal_kind=record.principal_kind,
                tenant_id=record.tenant_id,
                authentication_issuer=record.authentication_issuer,
                revision=record.revision,
                scopes=frozenset(record.scopes),
                expires_at_unix_ms=record.expires_at_unix_ms,
                capability_prefixes=None
                if record.capability_prefixes is None
                else tuple(record.capability_prefixes),
                endpoints=None if record.endpoints is None else frozenset(record.endpoints),
            )
        return cls(by_hash)

    def authenticate(self, token: str | None, *, now_ms: int) -> Principal | None:
        """The principal of a present, known, unexpired token; None otherwise."""
        principal = find_by_token(self._by_hash, token)
        if principal is None or now_ms >= principal.expires_at_unix_ms:
            return None
        return principal

    def __len__(self) -> int:
        return len(self._by_hash)


def bearer(scope: Mapping[str, Any]) -> str | None:
    """The token of the request's `Authorization: Bearer …` header, if there is one."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None
