"""The trusted execution projection: the only AIP facts a provider request carries.

Every value comes from a verified field: the principal and tenant from the identity
directory, the issuer from the directory (or the gateway-signed claim when the directory
leaves it open), trace, deadline, delegation chain and idempotency key from the signed
envelope. Nothing is read from `input` or a legacy `_aip` object.

A value that is not a safe header value (control characters such as CR/LF, non-ASCII,
leading or trailing spaces, more than 512 bytes) is *refused*, not dropped: silently
dropping a principal or tenant header would widen what the provider lets the request do,
so the whole Action fails with `connector.hermes_agent.configuration_or_input` before any
provider request is made.
"""

from __future__ import annotations

import re

from schemas.action import Action
from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.trust.identities import TrustedIdentity

MAX_HEADER_VALUE_BYTES = 512
PRINCIPAL_ID = "X-AIP-Principal-Id"
TENANT_ID = "X-AIP-Tenant-Id"
AUTHENTICATION_ISSUER = "X-AIP-Authentication-Issuer"
TRACE_ID = "X-AIP-Trace-Id"
CORRELATION_ID = "X-AIP-Correlation-Id"
DEADLINE = "X-AIP-Deadline-Unix-Ms"
DELEGATION_CHAIN = "X-AIP-Delegation-Chain"
IDEMPOTENCY_KEY = "Idempotency-Key"
PROJECTED_HEADERS = (
    PRINCIPAL_ID,
    TENANT_ID,
    AUTHENTICATION_ISSUER,
    TRACE_ID,
    CORRELATION_ID,
    DEADLINE,
    DELEGATION_CHAIN,
    IDEMPOTENCY_KEY,
)

#: Visible ASCII with inner spaces only: what every HTTP stack sends unchanged.
_SAFE_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


def _refuse(header: str, why: str) -> ConnectorError:
    return ConnectorError(
        ErrorCode.CONFIGURATION_OR_INPUT, f"header {header} refused: the value {why}"
    )


def _checked(header: str, value: str) -> str:
    if len(value.encode("utf-8", errors="surrogatepass")) > MAX_HEADER_VALUE_BYTES:
        raise _refuse(header, f"is over {MAX_HEADER_VALUE_BYTES} bytes")
    if not _SAFE_VALUE.fullmatch(value):
        raise _refuse(
            header, "has control, non-ASCII, or leading/trailing space characters, or is empty"
        )
    return value


def effective_deadline(action: Action) -> int | None:
    """The Action's own deadline: explicit, else creation time plus its timeout."""
    if action.deadline_unix_ms is not None:
        return action.deadline_unix_ms
    if action.timeout_ms is not None:
        return action.created_at_unix_ms + action.timeout_ms
    return None


def trusted_projection(
    action: Action, identity: TrustedIdentity, *, deadline_unix_ms: int | None = None
) -> dict[str, str]:
    """The provider headers for an admitted Action; raises ConnectorError on unsafe values.

    `deadline_unix_ms` is the runtime's deadline when it has one (it may be tighter than the
    Action's own); otherwise the Action's is used.
    """
    values: dict[str, str | None] = {
        PRINCIPAL_ID: identity.principal_id,
        TENANT_ID: identity.tenant_id,
        AUTHENTICATION_ISSUER: identity.authentication_issuer
        or action.identity.authentication_issuer,
        TRACE_ID: action.trace.trace_id if action.trace else None,
        CORRELATION_ID: action.trace.correlation_id if action.trace else None,
        IDEMPOTENCY_KEY: action.idempotency_key,
    }
    deadline = deadline_unix_ms if deadline_unix_ms is not None else effective_deadline(action)
    if deadline is not None:
        values[DEADLINE] = str(deadline)
    if action.delegation is not None and action.delegation.chain:
        for hop in action.delegation.chain:
            if "," in hop:
                raise _refuse(DELEGATION_CHAIN, "has a principal containing ','")
        values[DELEGATION_CHAIN] = ",".join(action.delegation.chain)
    return {name: _checked(name, value) for name, value in values.items() if value is not None}
