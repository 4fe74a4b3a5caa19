"""The trusted identity directory: which principals may act, at which revision, for whom.

The gateway's signature says the envelope came through the gateway; the directory says the
identity inside it is still one this deployment trusts. Refusals, in the troubleshooting
order (stop at the first failed layer):

- `connector_host.authentication`: the principal is not in the directory, its kind or
  issuer differs from what the directory pins, or its entry has expired;
- `connector_host.credential_revision_denied`: `identity.credential_revision` is missing or
  is not the directory's revision;
- `connector.hermes_agent.tenant_mismatch`: the claimed tenant is missing, extra, or not
  the directory's tenant for the principal.

Revoked, duplicate and zero-revision entries stop the worker at startup, so revoking a
principal is removing its entry (or bumping its revision) and restarting. An entry that has
already expired is skipped with a warning (and counted, `trust_entries_expired`): it admits
nothing either way, and an entry that expires on its own schedule must not make the next
restart of every worker fail (a departure from the spec's "rejects expired entries",
docs/security.md). Being skipped before the duplicate check, an expired entry may sit next
to the renewed one for the same principal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec

from schemas.action import Identity
from schemas.errors import ErrorCode
from schemas.ids import ShortText, UnixMs
from worker.errors import ConnectorError, TrustConfigError
from worker.secret_files import Secret
from worker.store.clock import Clock
from worker.trust.files import describe_principal, has_expired, policy_records, read_policy_file

_WHAT = "trusted identity file"

log = logging.getLogger(__name__)


class SanitizedIdentity(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Identity facts safe to log; when set, the Action's claim must match them."""

    principal_kind: ShortText | None = None
    authentication_issuer: ShortText | None = None
    display_name: ShortText | None = None


class _Entry(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    principal_id: ShortText
    revision: Annotated[int, msgspec.Meta(ge=0)]
    tenant_id: ShortText | None = None
    credential: Annotated[str, msgspec.Meta(min_length=1, max_length=65_536)] | None = None
    identity: SanitizedIdentity | None = None
    expires_at_unix_ms: UnixMs | None = None
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class TrustedIdentity:
    """A principal as the directory knows it: the verified facts an admitted Action carries."""

    principal_id: str
    revision: int
    tenant_id: str | None
    principal_kind: str | None = None
    authentication_issuer: str | None = None
    display_name: str | None = None
    expires_at_unix_ms: int | None = None
    #: Opaque to this worker; kept out of every repr, log, header and receipt.
    credential: Secret | None = field(default=None, repr=False, compare=False)


def _refuse(code: ErrorCode, claimed: Identity, why: str) -> ConnectorError:
    return ConnectorError(code, f"principal {describe_principal(claimed.principal_id)}: {why}")


class IdentityDirectory:
    """Principals by id, validated once at startup."""

    def __init__(self, entries: dict[str, TrustedIdentity], *, expired: int = 0) -> None:
        self._entries = entries
        #: Entries the file holds that had already expired at load, and were skipped.
        self.expired = expired

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, principal_id: str) -> TrustedIdentity | None:
        return self._entries.get(principal_id)

    @classmethod
    def load(cls, path: Path, *, now_ms: int) -> IdentityDirectory:
        """Parse and check the JSON array; an error names the entry index, never a credential.

        A file with credentials must be owner-only (no group or other access at all), since
        a credential that others can read is already leaked.
        """
        policy = read_policy_file(path, what=_WHAT)
        entries: dict[str, TrustedIdentity] = {}
        index_of: dict[str, int] = {}
        expired = 0
        for index, where, entry in policy_records(
            policy, path, what=_WHAT, noun="entry", record_type=_Entry
        ):
            if has_expired(entry.expires_at_unix_ms, now_ms) and _entry_problem(entry) is None:
                expired += 1
                log.warning("%s: has expired; skipped (remove or renew the entry)", where)
                continue
            problem = _entry_problem(entry)
            if problem is None and entry.principal_id in index_of:
                problem = f"duplicate of entry {index_of[entry.principal_id]}"
            if problem is not None:
                raise TrustConfigError(f"{where}: {problem}")
            if entry.credential is not None and policy.readable_by_others:
                raise TrustConfigError(
                    f"{_WHAT} {path}: holds credentials but group or others may read it; "
                    "chmod 600 it"
                )
            index_of[entry.principal_id] = index
            entries[entry.principal_id] = _trusted(entry)
        return cls(entries, expired=expired)

    async def verify(self, claimed: Identity, clock: Clock) -> TrustedIdentity:
        """The directory's identity for the Action's claim; raises ConnectorError."""
        entry = self._entries.get(claimed.principal_id)
        if entry is None:
            raise _refuse(
                ErrorCode.HOST_AUTHENTICATION, claimed, "not in the trusted identity directory"
            )
        if entry.principal_kind is not None and claimed.principal_kind != entry.principal_kind:
            raise _refuse(
                ErrorCode.HOST_AUTHENTICATION, claimed, "principal kind differs from the directory"
            )
        if (
            entry.authentication_issuer is not None
            and claimed.authentication_issuer != entry.authentication_issuer
        ):
            raise _refuse(
                ErrorCode.HOST_AUTHENTICATION,
                claimed,
                "authentication issuer differs from the directory",
            )
        if (
            entry.expires_at_unix_ms is not None
            and await clock.now_ms() >= entry.expires_at_unix_ms
        ):
            raise _refuse(ErrorCode.HOST_AUTHENTICATION, claimed, "directory entry has expired")
        if claimed.credential_revision != entry.revision:
            raise _refuse(
                ErrorCode.HOST_CREDENTIAL_REVISION_DENIED,
                claimed,
                f"credential revision {claimed.credential_revision} is not the directory's "
                f"revision {entry.revision}",
            )
        if claimed.tenant_id != entry.tenant_id:
            raise _refuse(
                ErrorCode.TENANT_MISMATCH,
                claimed,
                "claimed tenant is not the principal's verified tenant"
                if entry.tenant_id is not None
                else "claims a tenant but has no verified tenant",
            )
        return entry


def _entry_problem(entry: _Entry) -> str | None:
    """What makes an entry malformed (it stops startup); expiry is not among them."""
    if entry.revision == 0:
        return "revision must be non-zero"
    if entry.revoked:
        return "is revoked; remove the entry"
    return None


def _trusted(entry: _Entry) -> TrustedIdentity:
    facts = entry.identity or SanitizedIdentity()
    return TrustedIdentity(
        principal_id=entry.principal_id,
        revision=entry.revision,
        tenant_id=entry.tenant_id,
        principal_kind=facts.principal_kind,
        authentication_issuer=facts.authentication_issuer,
        display_name=facts.display_name,
        expires_at_unix_ms=entry.expires_at_unix_ms,
        credential=None if entry.credential is None else Secret(entry.credential),
    )
