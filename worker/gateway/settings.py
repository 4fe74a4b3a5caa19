"""The gateway's settings, from `AIPD_*` variables: where it listens, whom it trusts, routes.

A separate model from the worker's `Settings`: the gateway needs no Redis and no Hermes
endpoint, and a worker must not start because a gateway-only file is missing. Validated at
startup like the worker's; a bad value names its field.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.logs import LogFormat

#: The scope each tool needs (the protected-resource scopes of the AIP MCP server).
CAPABILITY_READ = "capability:read"
ACTION_WRITE = "action:write"
ACTION_READ = "action:read"
ACTION_CANCEL = "action:cancel"
PROTECTED_SCOPES = (CAPABILITY_READ, ACTION_WRITE, ACTION_READ, ACTION_CANCEL)


def _split(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _secure_or_loopback(url: str) -> bool:
    """HTTPS, or plain HTTP to a loopback host (the reference's rule for the hop)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return True
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")


class GatewaySettings(BaseSettings):
    """`aip-hermes-worker gateway` configuration (every field is an `AIPD_*` variable).

    The docstring under each field is its documentation: `docs/configuration.md`
    ("Gateway", generated and drift-checked) says the same thing."""

    model_config = SettingsConfigDict(
        env_prefix="AIPD_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server URL(s), comma-separated; the connection uses the same `AIPD_NATS_*`
    credential files a worker reads (the table above)."""
    nats_inbox_prefix: str = "_INBOX"
    """Prefix of the gateway's reply inboxes (JetStream API replies, request replies). Under
    least-privilege roles the only one its NATS user may subscribe to (compose:
    `_INBOX_gateway`), so no other role reads what is delivered to it (docs/security.md,
    "Roles")."""
    subject_prefix: str = "aip"
    """Subject prefix, the workers' own."""
    gateway_host: str = "127.0.0.1"
    """Where the MCP server (`/mcp`) and `/health`, `/ready`, `/metrics` listen."""
    gateway_port: Annotated[int, Field(ge=0, le=65_535)] = 8080
    """The port of `gateway_host` (0: any free port)."""
    mcp_principals_file: Path
    """The bearer principals: a JSON array of token hashes (never tokens), owner-only
    (docs/gateway.md, "Principals")."""
    gateway_signing_key_file: Path
    """The gateway's nkey seed (owner-only): signs child envelopes, store records and
    cancel requests."""
    trusted_worker_keys_file: Path | None = None
    """Public keys (`U…`) of the workers whose signed results are a child's result, one per
    line (the consumers' file, worker/trust/responses.py). Required unless
    `allow_unsigned_responses` (docs/gateway.md, "Verified child results")."""
    allow_unsigned_responses: bool = False
    """Development only (warned at start): start without `trusted_worker_keys_file` and
    record child results unverified. By default a gateway without worker keys refuses to
    start, since anyone who may publish on a results subject could answer for a child. The
    same variable the worker's and escalation commands' dev escape uses."""
    capability_routes: str | None = None
    """JSON object, capability-id prefix -> subject prefix; merged over the built-in
    `cap:hermes_agent:{endpoint}:` -> `{prefix}.hermes.{endpoint}` (null removes an entry)."""
    mcp_allowed_hosts: str = ""
    """`Host` headers `/mcp` answers besides loopback ones (comma-separated; `name:port`, or
    `name:*` for any port): the names Hermes instances on other hosts call the gateway by.
    Any other Host gets 421 (the MCP SDK's DNS-rebinding protection)."""
    mcp_transport_scopes: str = ""
    """Scopes a token must hold to open an MCP session at all (comma-separated; may be
    empty)."""
    mcp_supported_scopes: str = ",".join(PROTECTED_SCOPES)
    """The protected-resource scopes this server supports; a tool whose scope is not listed
    is refused to everyone (comma-separated)."""
    gateway_max_input_bytes: Annotated[int, Field(ge=1_024, le=8_388_608)] = 1_048_576
    """Bound on the JSON of one `aip_call` contract."""
    gateway_call_timeout_ms: Annotated[int, Field(ge=1_000, le=86_400_000)] = 300_000
    """How long a child without `timeout_ms` is followed (and a sync call waits)."""
    gateway_recovery_interval_ms: Annotated[int, Field(ge=100, le=600_000)] = 2_000
    """How often the recovery sweep looks for children another gateway left unfinished."""
    gateway_redispatch_after_ms: Annotated[int, Field(ge=100, le=600_000)] = 3_000
    """A `queued` entry this old whose dispatch was never recorded is dispatched again
    (same id, same `Nats-Msg-Id`: harmless if the first dispatch happened)."""
    gateway_settle_grace_ms: Annotated[int, Field(ge=0, le=3_600_000)] = 30_000
    """Past a child's timeout, how long a missing result is waited for before the entry is
    settled `failed` (deadline exceeded, outcome uncertain) and a cancel is sent."""
    gateway_max_follows_per_principal: Annotated[int, Field(ge=1, le=100_000)] = 256
    """Sync `aip_call`s one principal may have waiting at once (and asynchronous children it
    has followed in this process); one more is refused with `connector_host.capacity`
    (retryable) before anything is enqueued."""
    gateway_max_held_chunk_bytes: Annotated[int, Field(ge=65_536, le=68_719_476_736)] = (
        268_435_456
    )
    """Bytes of streamed chunks this gateway holds at once over all the streaming Actions it
    passes on (held until their link is verified or their signed result vouches for them);
    each follow is also bounded on its own (64 MiB). A follow that would pass this bound
    stops passing chunks on (`over_bound`, logged and counted); its answer still goes."""
    gateway_max_body_bytes: Annotated[int, Field(ge=4_096, le=16_777_216)] = 2_097_152
    """Bound on one HTTP request body to `/mcp`, enforced before the MCP SDK reads it: a
    larger `Content-Length` is answered 413 at once, and a chunked body is cut off (413)
    as soon as it passes the bound, so no more than this is ever held per request."""
    gateway_max_requests: Annotated[int, Field(ge=1, le=100_000)] = 1_024
    """`/mcp` requests served at once; the next one is answered 503 at once
    (`connector_host.capacity`, `Retry-After: 1`) while those in flight go on."""
    gateway_max_connections: Annotated[int, Field(ge=8, le=100_000)] = 4_096
    """Open connections (uvicorn `limit_concurrency`): while more are open, every new
    request gets a 503 at once (never a reset). Above `gateway_max_requests`, so idle
    keep-alive connections do not starve requests."""
    gateway_backlog: Annotated[int, Field(ge=16, le=65_535)] = 4_096
    """The listening socket's accept backlog: connections the kernel queues before the
    gateway accepts them (above it a connect may be refused by the kernel)."""
    gateway_id: str = Field(default_factory=lambda: f"gw-{socket.gethostname()}-{os.getpid()}")
    """This gateway's name in its receipts (`worker_id`)."""
    aip_trusted_signers_file: Path | None = None
    """The native NATS binding `aip.native.nats.v1` (docs/aip.md, "Native NATS binding"):
    one `did:key:z… PRINCIPAL_ID [kind=…] [revision=…] [issuer=…] [tenant=…]` per line,
    owner-only like every trust file. Unset: the binding is not served."""
    aip_trust_domain: Annotated[str, Field(min_length=1, max_length=128)] = "local"
    """The binding's trust domain: `aip.v1.{trust_domain}.{service}.{version}.>` (each part
    sanitised: `.`, space, `/` and `\\` become `_`)."""
    aip_service: Annotated[str, Field(min_length=1, max_length=128)] = "aip-hermes-worker"
    """The binding's service name (the requester's subject names it)."""
    aip_version: Annotated[str, Field(min_length=1, max_length=32)] = "v1"
    """The binding's service version."""
    aip_queue_group: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")] = (
        "aip-hermes-worker-native"
    )
    """The queue group every gateway subscribes in: one gateway answers each request."""
    aip_request_timeout_ms: Annotated[int, Field(ge=2_000, le=3_600_000)] = 30_000
    """The requesters' NATS request timeout (the reference's default): a sync Action's
    answer is sent before it, non-terminal if the Action is still running."""
    aip_max_in_flight: Annotated[int, Field(ge=1, le=100_000)] = 1_024
    """Binding requests one gateway works on at once; the next is answered at once with a
    retryable `connector_host.capacity` error."""
    aip_delegation_subject: Annotated[
        str | None, Field(default=None, pattern=r"^[A-Za-z0-9_$:-]+(\.[A-Za-z0-9_$:-]+)*$")
    ] = None
    """The delegation route (docs/aip.md, "Delegation route"): the exact core NATS subject
    a GetAIP runtime's `--delegation-nats-route` sends signed `aip.agent.v1.delegation_request`
    Envelopes to (no wildcard), answered with a signed `delegation_result`. Needs
    `aip_trusted_signers_file` (the same signers and checks as the native binding). Unset:
    not served."""
    aip_delegation_timeout_ms: Annotated[int, Field(ge=2_000, le=3_600_000)] = 30_000
    """The route's `TIMEOUT_MS` on the runtime's side (the reference's default): the answer
    leaves before it, the non-terminal `accepted` DelegationResult when the delegation is
    still running (ask again with the same `delegation_id` to read its result)."""
    aip_host_instance_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The connector host over native HTTP (docs/aip.md, "Connector host over native
    HTTP"): the connector instance id this pool serves for a GetAIP central. Set: `POST
    /aip/v1/messages` and `GET /aip/v1/manifest` are served on the gateway's port (needs
    `aip_trusted_signers_file` naming the central's signing did, and `aip_host_tenant_id`).
    Unset: neither path exists."""
    aip_host_tenant_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The tenant the connector instance belongs to: a pinned route whose `tenant_id`
    (`security.connector_route`) names another is refused."""
    aip_host_replica_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """This replica's id in the central registry (default: `gateway_id`)."""
    aip_host_version_id: Annotated[str, Field(min_length=1, max_length=256)] = "aip-hermes-worker"
    """The connector version id the central admitted for this pool."""
    aip_host_public_url: str | None = None
    """The URL the central reaches this host at, ending in `/aip/v1/messages` (HTTPS unless
    on loopback); registered with the central. Required with `aip_central_url`."""
    aip_host_max_in_flight: Annotated[int, Field(ge=1, le=100_000)] = 32
    """Actions the host runs at once; the next is refused `connector_host.capacity` (HTTP
    429, retry after 100 ms) before anything is enqueued."""
    aip_host_credential_revision: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The credential revision new routes pin (`connector_route.credential_revision_ref`).
    With the two lists below, the reference host's rule: a revoked revision is refused; a
    pinned revision must be this one or an accepted previous one; a route pinning none is
    accepted only while neither this nor the accepted list is set."""
    aip_host_accepted_credential_revisions: str = ""
    """Older pinned credential revisions still accepted (comma-separated)."""
    aip_host_revoked_credential_revisions: str = ""
    """Credential revisions refused even if pinned (comma-separated)."""
    aip_central_url: str | None = None
    """The GetAIP central's base URL (`https://central.example`): the host registers,
    heartbeats and drains at `{url}/aip/v1/connector-control`, and a streaming Action's
    callback must be `{url}/aip/v1/connector-callbacks`. Unset: no registration, no lease
    (the host serves as long as it is not draining), and streaming Actions are refused."""
    aip_central_did: str | None = None
    """The `did:key` the central signs its connector-control answers with (required with
    `aip_central_url`)."""
    aip_host_heartbeat_interval_ms: Annotated[int, Field(ge=100, le=150_000)] = 10_000
    """How often the host heartbeats; at most half the lease the central grants (its
    reference default: 30 s), since without a live lease the host refuses Actions
    (`connector_host.not_ready`, HTTP 503)."""
    aip_host_drain_timeout_ms: Annotated[int, Field(ge=1, le=300_000)] = 30_000
    """On stop, how long the draining host waits for its Actions before it goes offline."""
    log_format: LogFormat = "json"
    """`json` lines for machines, `human` (or `text`, the same) for terminals."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""

    @field_validator("nats_inbox_prefix")
    @classmethod
    def _inbox_prefix(cls, value: str) -> str:
        from worker.settings import inbox_prefix

        return inbox_prefix(value)

    @field_validator(
        "mcp_transport_scopes",
        "mcp_supported_scopes",
        "mcp_allowed_hosts",
        "aip_host_accepted_credential_revisions",
        "aip_host_revoked_credential_revisions",
    )
    @classmethod
    def _comma_list(cls, value: str) -> str:
        return ",".join(_split(value))

    @model_validator(mode="after")
    def _connector_host(self) -> GatewaySettings:
        """The connector host's settings belong together (refused at start, naming them)."""
        if self.aip_host_instance_id is not None and (
            self.aip_trusted_signers_file is None or self.aip_host_tenant_id is None
        ):
            raise ValueError(
                "AIPD_AIP_HOST_INSTANCE_ID needs AIPD_AIP_TRUSTED_SIGNERS_FILE (the "
                "central's did) and AIPD_AIP_HOST_TENANT_ID"
            )
        if self.aip_central_url is not None:
            if self.aip_host_instance_id is None:
                raise ValueError("AIPD_AIP_CENTRAL_URL needs AIPD_AIP_HOST_INSTANCE_ID")
            if self.aip_central_did is None or self.aip_host_public_url is None:
                raise ValueError(
                    "AIPD_AIP_CENTRAL_URL needs AIPD_AIP_CENTRAL_DID and AIPD_AIP_HOST_PUBLIC_URL"
                )
            for name, url in (
                ("AIPD_AIP_CENTRAL_URL", self.aip_central_url),
                ("AIPD_AIP_HOST_PUBLIC_URL", self.aip_host_public_url),
            ):
                if not _secure_or_loopback(url):
                    raise ValueError(f"{name} must be https:// (http:// only on loopback)")
            if not self.aip_host_public_url.rstrip("/").endswith("/aip/v1/messages"):
                raise ValueError("AIPD_AIP_HOST_PUBLIC_URL must end in /aip/v1/messages")
        return self

    @property
    def allowed_hosts(self) -> tuple[str, ...]:
        return _split(self.mcp_allowed_hosts)

    @property
    def transport_scopes(self) -> tuple[str, ...]:
        return _split(self.mcp_transport_scopes)

    @property
    def supported_scopes(self) -> tuple[str, ...]:
        return _split(self.mcp_supported_scopes)

    @property
    def accepted_credential_revisions(self) -> frozenset[str]:
        return frozenset(_split(self.aip_host_accepted_credential_revisions))

    @property
    def revoked_credential_revisions(self) -> frozenset[str]:
        return frozenset(_split(self.aip_host_revoked_credential_revisions))
