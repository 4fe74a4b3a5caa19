"""What the qualification driver needs beyond a worker's settings, from `AIPD_*` variables.

The driver reads the deployment's own settings (`worker.settings.Settings`: NATS and its
credentials, Redis, the Hermes endpoints and their key files, the trust files) the way every
command does; this model adds what only a publisher, an approver and an MCP client hold.
Every credential is a file, never a value: the spec's `AIPD_MCP_ACCESS_TOKEN` (the external
orchestrator's MCP token) is `AIPD_MCP_ACCESS_TOKEN_FILE`, and its independent approver's
`AIPD_NATIVE_BEARER_TOKEN` is the approver's signing seed, `AIPD_QUALIFY_APPROVER_KEY_FILE`
(approvals here are signed decisions, docs/security.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class QualifySettings(BaseSettings):
    """`aip-hermes-worker qualify` configuration (each field is an `AIPD_*` variable)."""

    model_config = SettingsConfigDict(
        env_prefix="AIPD_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    gateway_signing_key_file: Path | None = None
    """The trusted gateway's nkey seed: the driver signs its Actions, delegations and cancels
    with it, as the gateway would (one of `AIPD_TRUSTED_GATEWAY_KEYS_FILE`)."""
    trusted_worker_keys_file: Path | None = None
    """Public nkeys of the workers: results and chunk chains that do not verify fail."""
    qualify_gateway_url: str | None = None
    """The AIP gateway's MCP URL (`http://gateway:8080/mcp`); unset: gateway checks skip."""
    mcp_access_token_file: Path | None = None
    """The driver's own MCP bearer token (the spec's `AIPD_MCP_ACCESS_TOKEN`), owner-only."""
    qualify_principal_id: str = "user:demo"
    """The caller the driver's Actions run for (in the trusted identity directory)."""
    qualify_principal_kind: str = "user"
    """Its principal kind, as the identity directory records it."""
    qualify_tenant_id: str | None = None
    """Its verified tenant, when the directory binds it to one."""
    qualify_issuer: str = "https://idp.example.test"
    """Its authentication issuer, as the identity directory records it."""
    qualify_revision: Annotated[int, Field(ge=1)] = 3
    """Its credential revision, as the identity directory records it."""
    qualify_approver_id: str = "approver:demo"
    """The approval authority member whose signed decisions approve the driver's Actions."""
    qualify_approver_key_file: Path | None = None
    """That approver's signing seed (the spec's independent approver credential), owner-only."""
    qualify_delegation_scope: str = "support.read"
    """The scope the driver's delegations ask for (inside the workers' scope allowlist)."""
    qualify_timeout_s: Annotated[float, Field(gt=0, le=3_600)] = 90.0
    """Longest wait for one Action's result."""
