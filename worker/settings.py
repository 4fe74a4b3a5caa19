"""One typed settings object, from `AIPD_*` variables and CLI flags (docs/configuration.md).

Validated at startup: a bad value stops the process with a message naming the field. Keys
are never settings values except the compatibility `AIPD_HERMES_API_KEY`, which warns.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from worker.logs import LogFormat
from worker.reference_names import ReferenceNamesSource


def split_list(value: str) -> list[str]:
    """A comma-separated setting as its non-blank items."""
    return [item.strip() for item in value.split(",") if item.strip()]


_INBOX_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def inbox_prefix(value: str) -> str:
    """A reply-inbox prefix: dot-separated tokens without wildcards (nats-py appends
    `.<nuid>`), so a subscribe permission `<prefix>.>` covers exactly its inboxes."""
    if not _INBOX_PREFIX.fullmatch(value) or len(value) > 128:
        raise ValueError(
            "an inbox prefix is 1-128 characters of dot-separated tokens of letters, "
            "digits, '_' and '-' (no wildcard, no leading or trailing dot)"
        )
    return value


class Settings(BaseSettings):
    """Every worker setting. Environment: `AIPD_<FIELD>`; CLI flags override.

    The docstring under each field is its documentation: `--help`, `docs/configuration.md`
    (generated, drift-checked) and this file say the same thing.
    """

    model_config = SettingsConfigDict(
        env_prefix="AIPD_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    # Services.
    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server URL(s), comma-separated (`nats://`, `tls://`)."""
    nats_user: str | None = None
    """NATS user name (with `nats_password_file`)."""
    nats_password_file: Path | None = None
    """Owner-only file holding the NATS password."""
    nats_token_file: Path | None = None
    """Owner-only file holding a NATS token."""
    nats_nkey_seed_file: Path | None = None
    """Owner-only NATS nkey seed file (the worker's own user key, not the gateway's)."""
    nats_creds_file: Path | None = None
    """Owner-only NATS `.creds` file (JWT + nkey seed)."""
    nats_tls_ca_file: Path | None = None
    """CA bundle to verify the NATS server."""
    nats_tls_cert_file: Path | None = None
    """Client certificate for NATS mutual TLS."""
    nats_tls_key_file: Path | None = None
    """Client key for NATS mutual TLS."""
    nats_inbox_prefix: str = "_INBOX"
    """Subject prefix of this process's reply inboxes (request replies, pull deliveries).
    Under least-privilege NATS roles each role has its own and may subscribe only there
    (compose: `_INBOX_worker_hermes-1`, `_INBOX_gateway`, `_INBOX_admin`), so no other
    role can read a delivery meant for it (docs/security.md, "Roles")."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (`redis://`, `rediss://` for TLS, `unix://`); a user name may be in the URL."""
    redis_cluster: bool = False
    """Use the Redis Cluster client (every script touches one `{act_…}` slot)."""
    redis_password_file: Path | None = None
    """Owner-only file holding the Redis password (ACL user)."""
    approver_redis_url: str | None = None
    """Redis URL `approve` and `escalations resolve` write decisions with: the approver ACL
    user (compose: `redis://aipapprover@redis:6379/0`), since the worker's user may only
    read approvals. Unset: `redis_url` with `redis_password_file`."""
    approver_redis_password_file: Path | None = None
    """Owner-only file holding the approver user's Redis password (with
    `approver_redis_url`)."""
    redis_wait_replicas: Annotated[int, Field(ge=0, le=5)] = 0
    """Replicas that must acknowledge the operator's start claim before `POST /v1/runs`
    (WAIT; WAITAOF from Redis 7.2); 0: off. Set 1 when masters have failover replicas."""
    redis_wait_timeout_ms: Annotated[int, Field(ge=10, le=4_000)] = 500
    """How long one replica confirmation may wait (kept below the 5 s Redis socket timeout)."""
    redis_startup_wait_s: Annotated[float, Field(ge=0, le=3_600)] = 120.0
    """At start, how long to wait for Redis to answer before exiting (nothing is fetched
    until it does)."""
    redis_check_interval_ms: Annotated[int, Field(ge=100, le=60_000)] = 1_000
    """How often Redis is pinged and its memory read; fetching pauses while either fails."""
    redis_memory_reserve_mb: Annotated[int, Field(ge=0, le=65_536)] = 64
    """Memory kept free below Redis `maxmemory` for settles and renewals: above it no new
    lease is taken (a quarter of `maxmemory` when that is smaller; 0: off)."""

    # Endpoints.
    hermes_endpoints: str = ""
    """Hermes endpoints as `id=url[,id=url…]`, e.g. `hermes-1=http://hermes-1:8642`."""
    hermes_endpoints_file: Path | None = None
    """JSON array of endpoint descriptors (id, url, api_key_file, tenant_id, shared,
    timeouts; the reference connector's `base_url` and `display_name` are read too)."""
    hermes_shared_endpoints: str = ""
    """Endpoints bound to no tenant that serve several tenants, as `id[,id…]` (or `shared:
    true` in the endpoints file). Only these admit an Action carrying a tenant without a
    `tenant_id` binding, and they partition session, job, run and response ids per tenant
    (docs/security.md "Shared endpoints")."""
    hermes_api_key_files: str = ""
    """Per-endpoint owner-only key files as `id=path[,id=path…]`, e.g.
    `hermes-1=/run/secrets/h1_key,hermes-2=/run/secrets/h2_key` (or `api_key_file` in the
    endpoints file): each endpoint is sent only its own key."""
    hermes_api_key_file: Path | None = None
    """Owner-only file with the bearer key of the one endpoint that has no key file of its
    own; refused when several endpoints would share it, unless `hermes_share_api_key`."""
    hermes_api_key: str | None = Field(default=None, repr=False)
    """The key as a value (compatibility with the spec's example; warned at startup)."""
    hermes_share_api_key: bool = False
    """Send the one `AIPD_HERMES_API_KEY_FILE` key to several endpoints. Only for endpoints
    that are one Hermes deployment: every endpoint receiving a key can use it elsewhere."""
    hermes_max_concurrent_runs: Annotated[int, Field(ge=1, le=1_000)] = 8
    """Operator runs admitted at once per endpoint, across all workers (Redis semaphore)."""
    hermes_http_transport: Literal["h1", "aiohttp", "httpx"] = "h1"
    """`h1`: starts and event streams on the worker's own HTTP/1.1 pool, the rest on
    httpx-aiohttp; `aiohttp`: all on httpx-aiohttp; `httpx`: all on the stock transport."""
    hermes_read_retry_attempts: Annotated[int, Field(ge=0, le=10)] = 2
    """Retries of a read-only call after a temporary or transport failure (never unsafe ones)."""
    hermes_stream_max_idle_bytes: Annotated[int, Field(ge=64, le=16_777_216)] = 65_536
    """Bytes an event stream may send without an event (blank lines, comments) before it
    fails `stream_incomplete`."""
    hermes_stream_max_idle_ms: Annotated[int, Field(ge=100, le=86_400_000)] = 300_000
    """Time an event stream may keep sending bytes without an event before it fails
    `stream_incomplete` (a silent socket is the endpoint's read timeout)."""

    # Operator policy (spec: "Apply operator policy bounds").
    hermes_operator_delegation_enabled: bool = False
    """Accept first-class delegation (needs both prefix allowlists)."""
    hermes_operator_delegation_requires_approval: bool = True
    """Require a durable approval for delegated children."""
    hermes_operator_delegation_approval_exempt_prefixes: str = ""
    """Child capability-id prefixes exempt from the delegation approval check (narrow!)."""
    hermes_operator_capability_prefixes: str = ""
    """Delegated capability-id prefixes, comma-separated (`*`: unrestricted)."""
    hermes_operator_scope_prefixes: str = ""
    """Delegated scope prefixes, comma-separated (`*`: unrestricted)."""
    hermes_operator_model: str | None = None
    """Model route for operator runs (deployment-owned; never from input)."""
    hermes_operator_instructions_file: Path | None = None
    """Operator system instructions (default: the governed built-in text)."""
    hermes_operator_instructions: str | None = None
    """Operator system instructions as a value (the reference connector's
    `AIP_HERMES_OPERATOR_INSTRUCTIONS`); not together with the file."""
    hermes_operator_timeout_ms: Annotated[int, Field(ge=1_000, le=86_400_000)] = 900_000
    """Longest operator observation (a shorter trusted deadline wins)."""
    hermes_operator_poll_interval_ms: Annotated[int, Field(ge=10, le=60_000)] = 250
    """Status polling interval when the event stream is unavailable."""
    hermes_operator_max_events: Annotated[int, Field(ge=1, le=100_000)] = 4_096
    """Provider events read from one run's stream."""
    hermes_operator_max_input_bytes: Annotated[int, Field(ge=1_024, le=16_777_216)] = 1_048_576
    """Largest serialized provider input of an objective."""
    hermes_operator_max_delegation_depth: Annotated[int, Field(ge=1, le=128)] = 16
    """Longest delegation chain accepted."""
    hermes_operator_start_claim_ttl_ms: Annotated[int, Field(ge=1_000, le=300_000)] = 60_000
    """How long a start claim fences `POST /v1/runs` before it counts as lost."""
    hermes_operator_cancel_grace_ms: Annotated[int, Field(ge=1_000, le=300_000)] = 15_000
    """How long a stop is reconciled before `cancellation_outcome_unknown`."""
    cancel_reply_wait_ms: Annotated[int, Field(ge=0, le=120_000)] = 20_000
    """Longest wait for a cancel to settle its Action before the cancel request is answered
    with a retryable `connector_host.not_ready` error (a requester may ask for less)."""

    # Trust.
    trusted_gateway_keys_file: Path | None = None
    """Public nkeys (`U…`) of trusted envelope signers, one per line."""
    trusted_identity_file: Path | None = None
    """Trusted identity directory (JSON); without it governed execution is refused."""
    approval_authority_file: Path | None = None
    """Approval authority directory (JSON): an array of `AuthorityMembership` records, or
    `{"memberships": [...], "quorums": [{"capability_prefix", "required"}]}` to require N
    distinct approvers for a capability prefix (docs/security.md "Quorums")."""
    channel_egress_file: Path | None = None
    """Channel egress rules (JSON): which results and escalations are sent into which
    persisted Hermes session (docs/channels.md). Trusted configuration, never payload."""
    channel_ingress_file: Path | None = None
    """Channel ingress sessions (JSON): whose messages are published on the bus
    (docs/channels.md). Trusted configuration."""
    allow_unsigned_envelopes: bool = False
    """Accept unsigned envelopes. Development only: warned at start and on every acceptance."""
    max_envelope_age_ms: Annotated[int, Field(ge=1_000, le=86_400_000)] = 300_000
    """Oldest an envelope may be (its `created_at_unix_ms`) when JetStream stores it; one
    stored older (a re-publication of captured bytes) is refused with
    `connector_host.replay`. Waiting in the queue afterwards does not count (docs/security.md,
    "The replay boundary")."""
    max_clock_skew_ms: Annotated[int, Field(ge=0, le=600_000)] = 30_000
    """How far ahead of the time JetStream stored it an envelope's `created_at_unix_ms` may
    lie before it is refused with `connector_host.replay`."""
    worker_signing_key_file: Path | None = None
    """Owner-only nkey seed (`SU…`) this worker signs its results and DLQ entries with; its
    public key goes in consumers' `AIPD_TRUSTED_WORKER_KEYS_FILE`. Unset: every Action is
    refused with `connector_host.response_signing` (unless unsigned responses are allowed)."""
    allow_unsigned_responses: bool = False
    """Publish unsigned results and DLQ entries when no signing key is set. Development only:
    warned at start. Also lets the escalations commands believe unsigned escalations when
    no trusted worker keys are set."""
    trusted_worker_keys_file: Path | None = None
    """Public nkeys (`U…`) of the workers whose signed escalations, receipts, channel
    deliveries and ingress messages are believed, one per line (its own key is always
    trusted): the `escalations` commands, the `escalations_open` gauge, channels
    (docs/channels.md); `audit` reads it too. Unset: a worker trusts its own key only, and
    `escalations` refuses to run unless unsigned responses are allowed."""
    serve_when_unready: bool = False
    """Bind the work consumers even when something serving needs is missing (a trust file,
    a Hermes accepting the key): the Actions are then refused one by one. Development only;
    by default such a worker stays unready (`/ready` 503 with the reasons) and takes nothing."""
    serving_probe_interval_s: Annotated[float, Field(ge=1, le=3_600)] = 15.0
    """How often each endpoint's Hermes key is probed (`GET /v1/models`): a worker whose key is
    refused stops taking that endpoint's work, and takes it again once the key is accepted."""

    # Runtime.
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """This worker's identity in leases, results and receipts (default: host-pid)."""
    concurrency: Annotated[int, Field(ge=1, le=10_000)] = 64
    """Actions in flight at once in this worker (fetches never exceed the free slots)."""
    lease_ttl_ms: Annotated[int, Field(ge=1_000, le=600_000)] = 15_000
    """Lease TTL; the heartbeat renews every third of it."""
    result_ttl_ms: Annotated[int, Field(ge=60_000, le=30 * 86_400_000)] = 86_400_000
    """How long a settled result is kept for replays (idempotency TTL); at least the replay
    window (`max_envelope_age_ms` + `max_clock_skew_ms`), checked at startup. An envelope
    older than this less the skew when a worker takes it is refused as a replay."""
    idempotency_ttl_ms: Annotated[int, Field(ge=1_000, le=30 * 86_400_000)] | None = None
    """How long an Action's `idempotency_key` is remembered from its first use (AIP
    `ttl_ms`; default: `result_ttl_ms`, 24 h): within it, an Action with the same key,
    capability, tenant and principal gets the first one's result and sends nothing
    (docs/guarantees.md "Idempotency keys"). At most `result_ttl_ms`, checked at startup:
    the answer is the first Action's stored result."""
    subject_prefix: str = "aip"
    """First token of every subject."""
    max_envelope_bytes: Annotated[int, Field(ge=1_024, le=8_388_608)] = 1_048_576
    """Largest envelope decoded; a larger one goes to the DLQ."""
    stream_replicas: Annotated[int, Field(ge=1, le=5)] = 1
    """Replicas of every stream `provision` creates (3 on a NATS cluster)."""
    duplicate_window_s: Annotated[float, Field(ge=1, le=86_400)] = 120.0
    """JetStream duplicate window of every stream (`Nats-Msg-Id` dedupe)."""
    stream_actions_max_bytes: Annotated[int, Field(ge=65_536)] = 1_073_741_824
    """Byte limit of the actions work queue (`provision`); when full, new Actions are refused
    at publish (`discard: new`, the publisher sees `maximum bytes exceeded`), none is dropped."""
    stream_actions_max_msgs: Annotated[int, Field(ge=1)] = 1_000_000
    """Message limit of the actions work queue (refuses new ones when reached)."""
    stream_delegations_max_bytes: Annotated[int, Field(ge=65_536)] = 268_435_456
    """Byte limit of the delegations work queue (refuses new ones when full)."""
    stream_delegations_max_msgs: Annotated[int, Field(ge=1)] = 250_000
    """Message limit of the delegations work queue (refuses new ones when reached)."""
    stream_chunks_max_bytes: Annotated[int, Field(ge=65_536)] = 3_221_225_472
    """Byte limit of the chunks stream; when full the oldest chunks are dropped first."""
    stream_results_max_bytes: Annotated[int, Field(ge=65_536)] = 1_073_741_824
    """Byte limit of the results stream; when full the oldest results are dropped first (a
    replayed Action republishes its stored result)."""
    stream_dlq_max_bytes: Annotated[int, Field(ge=65_536)] = 268_435_456
    """Byte limit of the DLQ; when full, new entries are not kept (`discard: new`), counted
    in `dlq_dropped_total{reason="full"}`."""
    stream_dlq_max_msgs: Annotated[int, Field(ge=1)] = 100_000
    """Message limit of the DLQ (new entries are not kept once reached)."""
    stream_dlq_duplicate_window_s: Annotated[float, Field(ge=1, le=604_800)] = 86_400.0
    """JetStream duplicate window of the DLQ (at least `duplicate_window_s`): an Action's
    retry-exhausted entry, written again when a redelivery republishes its stored result,
    is kept once even when that comes long after the first (a results stream full for
    minutes)."""
    stream_audit_max_bytes: Annotated[int, Field(ge=65_536)] = 2_147_483_648
    """Byte limit of the audit stream; when full the oldest receipts are dropped first."""
    stream_runtime_max_bytes: Annotated[int, Field(ge=65_536)] = 134_217_728
    """Byte limit of each AIP runtime stream `provision --runtime-stores` creates."""
    dlq_keep_bytes: Annotated[int, Field(ge=256, le=65_536)] = 4_096
    """Bytes of a refused payload kept in its DLQ entry; the whole is summarized by the
    entry's `size` and `sha256` (docs/publishing.md "The dead-letter queue")."""
    dlq_rate_per_s: Annotated[float, Field(gt=0, le=100_000)] = 10.0
    """DLQ entries this worker writes per second per source subject (token bucket); refusals
    over the rate are terminated and counted in `dlq_dropped_total{reason="rate"}`."""
    dlq_burst: Annotated[int, Field(ge=1, le=100_000)] = 100
    """DLQ entries one source subject may write at once before the rate applies."""
    ack_wait_s: Annotated[float, Field(ge=1, le=3_600)] | None = None
    """AckWait of the work consumers (default: the lease TTL, so a dead worker's Actions
    come back about when its leases expire; the heartbeat keeps live ones in progress)."""
    auto_provision: bool = False
    """Create/update streams and consumers at startup (`provision` does it explicitly); needs
    NATS credentials of the admin role, which workers should not hold."""
    shutdown_grace_s: Annotated[float, Field(ge=0, le=3_600)] = 30.0
    """On SIGTERM, how long in-flight work may finish before its leases are released."""
    nak_delay_ms: Annotated[int, Field(ge=10, le=600_000)] = 1_000
    """Redelivery delay after a failed delivery."""

    # Operations.
    metrics_host: str = "127.0.0.1"
    """Address of the /health, /ready and /metrics server."""
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] | None = None
    """Port of the /health, /ready and /metrics server (unset: off)."""
    escalations_open_refresh_ms: Annotated[int, Field(ge=0, le=3_600_000)] = 15_000
    """Shortest time between two countings of the `escalations_open` gauge from the
    escalation stream and Redis (done when `/metrics` is scraped; 0: at every scrape)."""
    queue_depth_refresh_ms: Annotated[int, Field(ge=0, le=3_600_000)] = 5_000
    """Shortest time between two readings of the work consumers for the `queue_pending` and
    `queue_in_flight` gauges (done when `/metrics` is scraped; 0: at every scrape)."""
    log_format: LogFormat = "json"
    """`json` lines for machines, `human` (or `text`, the same) for terminals."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    use_uvloop: bool = True
    """Run on uvloop when it is installed (+10-40% on the JetStream paths)."""

    @field_validator("nats_url")
    @classmethod
    def _nats_urls(cls, value: str) -> str:
        for url in split_list(value):
            if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(f"{url!r} is not a nats:// or tls:// url")
        return value

    @field_validator("nats_inbox_prefix")
    @classmethod
    def _inbox_prefix(cls, value: str) -> str:
        return inbox_prefix(value)

    @field_validator("redis_url", "approver_redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// url")
        return value

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, value: str) -> str:
        if not value or len(value) > 128 or "#" in value or any(c.isspace() for c in value):
            raise ValueError("worker id must be 1-128 characters, no spaces and no '#'")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags, then `AIPD_*`, then the reference connector's `AIP_HERMES_*` names
        (`worker.reference_names`: a disagreement between the two spellings stops start-up)."""
        return (
            init_settings,
            env_settings,
            ReferenceNamesSource(settings_cls, os.environ),
            dotenv_settings,
            file_secret_settings,
        )

    @model_validator(mode="after")
    def _one_instructions_source(self) -> Settings:
        if (
            self.hermes_operator_instructions is not None
            and self.hermes_operator_instructions_file is not None
        ):
            raise ValueError(
                "operator instructions are set both as a value and as a file "
                "(AIPD_HERMES_OPERATOR_INSTRUCTIONS / AIP_HERMES_OPERATOR_INSTRUCTIONS and "
                "AIPD_HERMES_OPERATOR_INSTRUCTIONS_FILE): set one"
            )
        return self

    @model_validator(mode="after")
    def _delegation_needs_allowlists(self) -> Settings:
        if self.hermes_operator_delegation_enabled and not (
            self.operator_capability_prefixes and self.operator_scope_prefixes
        ):
            raise ValueError(
                "hermes_operator_delegation_enabled needs both "
                "AIPD_HERMES_OPERATOR_CAPABILITY_PREFIXES and AIPD_HERMES_OPERATOR_SCOPE_PREFIXES"
            )
        for prefix in (
            self.operator_capability_prefixes
            + self.operator_scope_prefixes
            + self.operator_approval_exempt_prefixes
        ):
            if len(prefix) > 512:
                raise ValueError("operator allowlist prefixes are at most 512 characters")
        return self

    @model_validator(mode="after")
    def _state_outlives_the_replay_window(self) -> Settings:
        # An envelope is admitted until it is result_ttl - skew old (worker/trust/replay.py),
        # so whichever copy ran first left state that is still there; that bound must not
        # be tighter than the stored-young window (age + skew). Operator bindings live 25 h,
        # above the largest window these bounds allow.
        window_ms = self.max_envelope_age_ms + self.max_clock_skew_ms
        if self.result_ttl_ms < window_ms:
            raise ValueError(
                f"result_ttl_ms ({self.result_ttl_ms}) is shorter than the replay window "
                f"max_envelope_age_ms + max_clock_skew_ms ({window_ms}): a replayed envelope "
                "could outlive its stored result and run again"
            )
        if self.idempotency_ttl_ms is not None and self.idempotency_ttl_ms > self.result_ttl_ms:
            raise ValueError(
                f"idempotency_ttl_ms ({self.idempotency_ttl_ms}) is longer than result_ttl_ms "
                f"({self.result_ttl_ms}): a key would outlive the result it answers with"
            )
        return self

    @property
    def effective_idempotency_ttl_ms(self) -> int:
        return self.idempotency_ttl_ms or self.result_ttl_ms

    @property
    def effective_ack_wait_s(self) -> float:
        return self.ack_wait_s if self.ack_wait_s is not None else self.lease_ttl_ms / 1000

    @property
    def nats_servers(self) -> list[str]:
        return split_list(self.nats_url)

    @property
    def operator_capability_prefixes(self) -> list[str]:
        return split_list(self.hermes_operator_capability_prefixes)

    @property
    def operator_scope_prefixes(self) -> list[str]:
        return split_list(self.hermes_operator_scope_prefixes)

    @property
    def operator_approval_exempt_prefixes(self) -> list[str]:
        return split_list(self.hermes_operator_delegation_approval_exempt_prefixes)
