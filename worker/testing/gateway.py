"""The real gateway in tests: its principals file, its environment, a process, an MCP client
(`worker.gateway.mcp_client`, re-exported here).

Tests and the demo run `worker.gateway` itself (a `python -m worker gateway` process, or the
`Gateway` class in-process when a test wraps its store writer); this module only builds what
a deployment would configure for it and calls it the way Hermes does, through the official
`mcp` SDK's Streamable HTTP client.

```python
principals = write_principals_file(tmp, [principal_entry(TOKEN, hermes_principal_id("h1"))])
proc = gateway_process(tmp, env=gateway_env(nats_url, principals, trust.seed_file, port))
answer = await call_tool(url, TOKEN, "aip_call", {"capability_id": ..., "input": {...}})
```
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.delegation import DELEGATE_PREFIX
from worker.gateway.app import READY_MARK
from worker.gateway.mcp_client import ToolAnswer as ToolAnswer
from worker.gateway.mcp_client import call_tool as call_tool
from worker.gateway.mcp_client import list_tools as list_tools
from worker.gateway.principals import token_sha256
from worker.gateway.settings import PROTECTED_SCOPES
from worker.testing.identities import (
    TrustFiles,
    identity_entries,
    write_json,
    write_trust_files,
)
from worker.testing.workers import WorkerProcess

#: The issuer of the gateway's bearer principals in tests (the identity directory must agree).
MCP_ISSUER = "https://aip-mcp.example.test"
MCP_REVISION = 1


def hermes_principal_id(endpoint_id: str) -> str:
    return DELEGATE_PREFIX + endpoint_id


def principal_entry(
    token: str,
    principal_id: str,
    *,
    kind: str = "agent",
    tenant_id: str | None = None,
    scopes: Sequence[str] = PROTECTED_SCOPES,
    valid_for_ms: int = 3_600_000,
    revision: int = MCP_REVISION,
    issuer: str = MCP_ISSUER,
    capability_prefixes: Sequence[str] | None = None,
    endpoints: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One principals-file entry: the token's hash, never the token (the allowlists only
    when given: an entry without them may call every routed capability)."""
    allowlists: dict[str, Any] = {}
    if capability_prefixes is not None:
        allowlists["capability_prefixes"] = list(capability_prefixes)
    if endpoints is not None:
        allowlists["endpoints"] = list(endpoints)
    return {
        **allowlists,
        "token_sha256": token_sha256(token),
        "principal_id": principal_id,
        "principal_kind": kind,
        "tenant_id": tenant_id,
        "authentication_issuer": issuer,
        "revision": revision,
        "scopes": list(scopes),
        "expires_at_unix_ms": time.time_ns() // 1_000_000 + valid_for_ms,
    }


def directory_entry(principal_id: str, tenant_id: str | None = None) -> dict[str, Any]:
    """The identity-directory entry a worker needs to admit children created by `principal_id`."""
    return {
        "principal_id": principal_id,
        "revision": MCP_REVISION,
        "tenant_id": tenant_id,
        "credential": f"opaque-mcp-token-of-{principal_id}",
        "identity": {"principal_kind": "agent", "authentication_issuer": MCP_ISSUER},
    }


def hermes_trust(directory: Path, endpoint_ids: Sequence[str]) -> TrustFiles:
    """Trust files whose identity directory also holds each endpoint's Hermes principal: the
    children a Hermes creates through the gateway run as that principal."""
    directory.mkdir()
    identities = [
        *identity_entries(),
        *(directory_entry(hermes_principal_id(endpoint_id)) for endpoint_id in endpoint_ids),
    ]
    return write_trust_files(directory, identities=identities)


def write_principals_file(directory: Path, entries: Sequence[Mapping[str, Any]]) -> Path:
    return write_json(directory / "mcp-principals.json", list(entries), mode=0o600)


def gateway_env(
    nats_url: str, principals_file: Path, seed_file: Path, port: int, **extra: str
) -> dict[str, str]:
    """The `AIPD_*` environment of a gateway process (`extra` adds or overrides).

    Without `AIPD_TRUSTED_WORKER_KEYS_FILE` in `extra` the development flag that lets a
    gateway start without worker keys is set: the stand-in capabilities of these tests
    (worker/testing/echo_capability.py) sign with a key of their own that no keys file
    lists."""
    keyed = "AIPD_TRUSTED_WORKER_KEYS_FILE" in extra
    dev = {} if keyed else {"AIPD_ALLOW_UNSIGNED_RESPONSES": "true"}
    return {
        **dev,
        "AIPD_NATS_URL": nats_url,
        "AIPD_MCP_PRINCIPALS_FILE": str(principals_file),
        "AIPD_GATEWAY_SIGNING_KEY_FILE": str(seed_file),
        "AIPD_GATEWAY_HOST": "127.0.0.1",
        "AIPD_GATEWAY_PORT": str(port),
        "AIPD_GATEWAY_RECOVERY_INTERVAL_MS": "500",
        "AIPD_GATEWAY_REDISPATCH_AFTER_MS": "1000",
        **extra,
    }


def gateway_process(name: str, env: Mapping[str, str], log_dir: Path) -> WorkerProcess:
    """A `python -m worker gateway` process (start it with `.start()`; kill -9 with `.kill()`)."""
    return WorkerProcess(
        worker_id=name,
        env={**env, "AIPD_GATEWAY_ID": name},
        log_dir=log_dir,
        command=("gateway",),
        ready_mark=READY_MARK,
    )


# --- the gateway in-process, for the delegation tests ----------------------------------


@dataclass
class GatewayRuntime:
    """A running in-process `Gateway` whose store writer a test can fault, its principals'
    tokens, and the echo capability its sandbox route reaches."""

    gateway: Any  # worker.gateway.Gateway (imported lazily: this module stays light)
    #: key (e.g. "h1", "h1@tenant-a") -> the bearer token of that principal.
    tokens: dict[str, str]
    echo: Any  # EchoCapability

    @property
    def writer(self) -> Any:
        """The gateway's `FaultyStoreWriter`."""
        return self.gateway.writer

    @property
    def fault(self) -> Any:
        return self.writer.fault

    @fault.setter
    def fault(self, value: Any) -> None:
        self.writer.fault = value

    @property
    def url(self) -> str:
        return str(self.gateway.url)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The contract of every `aip_call` that reached the gateway's enqueue, as Hermes
        sent it (`aip_call_arguments` form: `action_id`, no identity)."""
        from worker.delegation.payload import aip_call_arguments

        return [aip_call_arguments(child) for child in self.writer.requested]

    def tool_for(self, key: str = "h1") -> Any:
        """The `aip_call` of principal `key`, over real MCP (for `fake.mcp_tools`)."""
        from worker.testing.fake_hermes.mcp_client import remote_aip_call

        return remote_aip_call(self.url, self.tokens[key])


@contextlib.asynccontextmanager
async def gateway_runtime(
    nats_url: str,
    directory: Path,
    seed_file: Path,
    principals: Mapping[str, tuple[str, str | None]],
    *,
    settle_grace_ms: int = 30_000,
    scopes: Mapping[str, Sequence[str]] | None = None,
    **extra_settings: Any,
) -> AsyncIterator[GatewayRuntime]:
    """The real gateway in this process, with `principals` (key -> (principal id, tenant)),
    every protected scope, the echo capability behind `cap:support_sandbox:`, and a
    `FaultyStoreWriter` (fault `none` until a test sets one). `scopes` overrides a key's
    scopes; `extra_settings` adds `GatewaySettings` fields."""
    import secrets

    import nats

    from worker.gateway import Gateway, GatewaySettings
    from worker.testing.echo_capability import EchoCapability
    from worker.testing.runtime_faults import FaultyStoreWriter

    tokens = {key: "mcp-" + secrets.token_hex(16) for key in principals}
    entries = [
        principal_entry(
            tokens[key],
            principal_id,
            tenant_id=tenant,
            scopes=(scopes or {}).get(key, PROTECTED_SCOPES),
        )
        for key, (principal_id, tenant) in principals.items()
    ]
    principals_file = write_principals_file(directory, entries)
    nc = await nats.connect(nats_url)
    echo = EchoCapability(nc)
    try:
        await echo.start()
        settings = GatewaySettings(
            nats_url=nats_url,
            mcp_principals_file=principals_file,
            gateway_signing_key_file=seed_file,
            gateway_port=0,
            capability_routes=json.dumps(echo.route),
            gateway_recovery_interval_ms=500,
            gateway_redispatch_after_ms=1_000,
            gateway_settle_grace_ms=settle_grace_ms,
            gateway_id="gw-test",
            # The echo capability signs with its own key, listed in no keys file (development
            # flag, unless keys are given).
            allow_unsigned_responses="trusted_worker_keys_file" not in extra_settings,
            **extra_settings,
        )
        async with Gateway(settings, make_writer=FaultyStoreWriter) as gateway:
            yield GatewayRuntime(gateway, tokens, echo)
    finally:
        await echo.stop()
        await nc.close()
