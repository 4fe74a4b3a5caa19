"""The console's bearer tokens: who may look, and at which tenant's runs.

`AIPD_CONSOLE_TOKENS_FILE` is shaped like the gateway's principals file (a JSON array of
records holding the sha256 of a token, never the token) and read by the same
`token_records`: regular, under 1 MiB, nobody but the owner may write or read it, each token
hash once. Each token is scoped to one
tenant, or to `*` (every tenant, and the runs of principals without one); a token sees only
its scope's runs, escalations and DLQ entries, and nothing it cannot see is said to exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec

from worker.gateway.principals import find_by_token, token_records

WHAT = "console tokens file"
#: The scope of a token that sees every tenant.
ALL_TENANTS = "*"
_SHA256_HEX = r"^[0-9a-f]{64}\Z"


class TokenRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One entry of the tokens file."""

    token_sha256: Annotated[str, msgspec.Meta(pattern=_SHA256_HEX)]
    #: Who holds the token (shown on every page, never used to decide anything).
    principal_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    #: The one tenant it sees, or `*` for all.
    tenant_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    expires_at_unix_ms: Annotated[int, msgspec.Meta(ge=0)]


@dataclass(frozen=True, slots=True)
class Viewer:
    """An authenticated console user: what its token says, nothing from the request."""

    principal_id: str
    #: None: every tenant (the token's scope was `*`).
    tenant_id: str | None
    expires_at_unix_ms: int

    def sees(self, tenant_id: str | None) -> bool:
        """Whether a record of `tenant_id` (None: no tenant, or not known) is in scope; a
        tenant's token never sees a record whose tenant is unknown."""
        return self.tenant_id is None or (tenant_id is not None and tenant_id == self.tenant_id)

    @property
    def scope(self) -> str:
        return ALL_TENANTS if self.tenant_id is None else self.tenant_id


class ConsoleTokens:
    """Token hash -> viewer; `authenticate` is the only way in."""

    def __init__(self, by_hash: dict[str, Viewer]) -> None:
        self._by_hash = by_hash

    @classmethod
    def load(cls, path: Path) -> ConsoleTokens:
        return cls(
            {
                record.token_sha256: Viewer(
                    principal_id=record.principal_id,
                    tenant_id=None if record.tenant_id == ALL_TENANTS else record.tenant_id,
                    expires_at_unix_ms=record.expires_at_unix_ms,
                )
                for record in token_records(path, what=WHAT, noun="token", record_type=TokenRecord)
            }
        )

    def authenticate(self, token: str | None, *, now_ms: int) -> Viewer | None:
        """The viewer of a present, known, unexpired token; None otherwise."""
        viewer = find_by_token(self._by_hash, token)
        if viewer is None or now_ms >= viewer.expires_at_unix_ms:
            return None
        return viewer

    def __len__(self) -> int:
        return len(self._by_hash)
