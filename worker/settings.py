"""One typed settings object, from `AIPD_*` environment variables and CLI flags (DESIGN §9).

Validated at startup: a bad value stops the process with a message naming the field. Keys
are never settings values except the compatibility `AIPD_HERMES_API_KEY`, which warns.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from subjects.grammar import InvalidEndpointId, normalize_endpoint_id
from worker.secret_files import MAX_SECRET_BYTES, Secret, SecretFileError, read_secret_file

MAX_ENDPOINT_FILE_BYTES = 1_048_576
MAX_CAPABILITIES_PER_ENDPOINT = 512


class EndpointDescriptor(BaseModel):
    """One Hermes endpoint as an administrator configured it (JSON file form)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    url: str
    api_key_file: Path | None = None
    #: The verified AIP tenant that owns this endpoint; Actions of another tenant are refused.
    tenant_id: str | None = None
    #: When the tenant binding stops being valid (Unix ms); after it, everything is refused.
    tenant_expires_at_unix_ms: int | None = None
    connect_timeout_ms: Annotated[int, Field(ge=100, le=120_000)] = 5_000
    #: Above Hermes' 30 s SSE keepalive, so a quiet but healthy stream is not cut.
    read_timeout_ms: Annotated[int, Field(ge=1_000, le=600_000)] = 45_000
    #: Bound on one non-streaming request end to end.
    total_timeout_ms: Annotated[int, Field(ge=1_000, le=3_600_000)] = 120_000
    max_concurrent_runs: Annotated[int, Field(ge=1, le=1_000)] | None = None

    @field_validator("id")
    @classmethod
    def _normalize_id(cls, value: str) -> str:
        try:
            return normalize_endpoint_id(value)
        except InvalidEndpointId as exc:
            raise ValueError(str(exc)) from None

    @field_validator("url")
    @classmethod
    def _http_only(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("endpoint url must be an absolute http:// or https:// url")
        if parts.username or parts.password:
            raise ValueError("endpoint url must not carry credentials; use api_key_file")
        if parts.query or parts.fragment:
            raise ValueError("endpoint url must not have a query or fragment")
        return value.rstrip("/")


class Endpoint(BaseModel):
    """A resolved endpoint: its descriptor plus the key read from its owner-only file."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    descriptor: EndpointDescriptor
    api_key: Secret | None

    @property
    def id(self) -> str:
        return self.descriptor.id

    @property
    def url(self) -> str:
        return self.descriptor.url


def _split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class Settings(BaseSettings):
    """Every worker setting. Environment: `AIPD_<FIELD>`; CLI flags override."""

    model_config = SettingsConfigDict(env_prefix="AIPD_", extra="ignore", frozen=True)

    # Services.
    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password_file: Path | None = None
    nats_token_file: Path | None = None
    nats_nkey_seed_file: Path | None = None
    nats_creds_file: Path | None = None
    nats_tls_ca_file: Path | None = None
    nats_tls_cert_file: Path | None = None
    nats_tls_key_file: Path | None = None
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_cluster: bool = False
    redis_password_file: Path | None = None

    # Endpoints.
    hermes_endpoints: str = ""
    hermes_endpoints_file: Path | None = None
    hermes_api_key_file: Path | None = None
    #: Compatibility with the spec's example; a value in the environment is warned about.
    hermes_api_key: str | None = Field(default=None, repr=False)
    hermes_max_concurrent_runs: Annotated[int, Field(ge=1, le=1_000)] = 8
    hermes_http_transport: Literal["aiohttp", "httpx"] = "aiohttp"
    hermes_read_retry_attempts: Annotated[int, Field(ge=0, le=10)] = 2

    # Operator policy (spec: "Apply operator policy bounds").
    hermes_operator_delegation_enabled: bool = False
    hermes_operator_delegation_requires_approval: bool = True
    hermes_operator_capability_prefixes: str = ""
    hermes_operator_scope_prefixes: str = ""
    hermes_operator_model: str | None = None
    hermes_operator_instructions_file: Path | None = None
    hermes_operator_timeout_ms: Annotated[int, Field(ge=1_000, le=86_400_000)] = 900_000
    hermes_operator_poll_interval_ms: Annotated[int, Field(ge=10, le=60_000)] = 250
    hermes_operator_max_events: Annotated[int, Field(ge=1, le=100_000)] = 4_096
    hermes_operator_max_input_bytes: Annotated[int, Field(ge=1_024, le=16_777_216)] = 1_048_576
    hermes_operator_max_delegation_depth: Annotated[int, Field(ge=1, le=128)] = 16
    hermes_operator_start_claim_ttl_ms: Annotated[int, Field(ge=1_000, le=300_000)] = 60_000
    hermes_operator_cancel_grace_ms: Annotated[int, Field(ge=1_000, le=300_000)] = 15_000

    # Trust.
    trusted_gateway_keys_file: Path | None = None
    trusted_identity_file: Path | None = None
    approval_authority_file: Path | None = None
    allow_unsigned_envelopes: bool = False

    # Runtime.
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    concurrency: Annotated[int, Field(ge=1, le=10_000)] = 64
    lease_ttl_ms: Annotated[int, Field(ge=1_000, le=600_000)] = 15_000
    result_ttl_ms: Annotated[int, Field(ge=60_000, le=30 * 86_400_000)] = 86_400_000
    subject_prefix: str = "aip"
    max_envelope_bytes: Annotated[int, Field(ge=1_024, le=8_388_608)] = 1_048_576
    stream_replicas: Annotated[int, Field(ge=1, le=5)] = 1
    duplicate_window_s: Annotated[float, Field(ge=1, le=86_400)] = 120.0
    #: AckWait of the work consumers; default: the lease TTL, so a dead worker's Actions are
    #: redelivered about when its leases expire (the heartbeat keeps live ones in progress).
    ack_wait_s: Annotated[float, Field(ge=1, le=3_600)] | None = None
    #: Create/update streams and consumers at startup (`provision` does it explicitly).
    auto_provision: bool = False
    shutdown_grace_s: Annotated[float, Field(ge=0, le=3_600)] = 30.0
    nak_delay_ms: Annotated[int, Field(ge=10, le=600_000)] = 1_000

    # Operations.
    metrics_host: str = "127.0.0.1"
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] | None = None
    log_format: Literal["json", "human"] = "json"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    use_uvloop: bool = True

    @field_validator("nats_url")
    @classmethod
    def _nats_urls(cls, value: str) -> str:
        for url in _split_list(value):
            if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(f"{url!r} is not a nats:// or tls:// url")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// url")
        return value

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, value: str) -> str:
        if not value or len(value) > 128 or "#" in value or any(c.isspace() for c in value):
            raise ValueError("worker id must be 1-128 characters, no spaces and no '#'")
        return value

    @model_validator(mode="after")
    def _delegation_needs_allowlists(self) -> Settings:
        if self.hermes_operator_delegation_enabled and not (
            self.operator_capability_prefixes and self.operator_scope_prefixes
        ):
            raise ValueError(
                "hermes_operator_delegation_enabled needs both "
                "AIPD_HERMES_OPERATOR_CAPABILITY_PREFIXES and AIPD_HERMES_OPERATOR_SCOPE_PREFIXES"
            )
        for prefix in self.operator_capability_prefixes + self.operator_scope_prefixes:
            if len(prefix) > 512:
                raise ValueError("operator allowlist prefixes are at most 512 characters")
        return self

    @property
    def effective_ack_wait_s(self) -> float:
        return self.ack_wait_s if self.ack_wait_s is not None else self.lease_ttl_ms / 1000

    @property
    def nats_servers(self) -> list[str]:
        return _split_list(self.nats_url)

    @property
    def operator_capability_prefixes(self) -> list[str]:
        return _split_list(self.hermes_operator_capability_prefixes)

    @property
    def operator_scope_prefixes(self) -> list[str]:
        return _split_list(self.hermes_operator_scope_prefixes)

    def endpoint_descriptors(self) -> list[EndpointDescriptor]:
        """Endpoints from the file and the inline list; duplicate normalized ids are refused."""
        found: list[EndpointDescriptor] = []
        if self.hermes_endpoints_file is not None:
            found.extend(_read_endpoint_file(self.hermes_endpoints_file))
        for item in _split_list(self.hermes_endpoints):
            endpoint_id, sep, url = item.partition("=")
            if not sep:
                raise ValueError(f"AIPD_HERMES_ENDPOINTS item {item!r} is not id=url")
            found.append(EndpointDescriptor(id=endpoint_id, url=url))
        seen: set[str] = set()
        for descriptor in found:
            if descriptor.id in seen:
                raise ValueError(f"endpoint id {descriptor.id!r} is configured twice")
            seen.add(descriptor.id)
        return found

    def resolve_endpoints(self) -> list[Endpoint]:
        """Descriptors with their keys read from owner-only files (startup only)."""
        shared: Secret | None = None
        if self.hermes_api_key_file is not None:
            shared = read_secret_file(self.hermes_api_key_file, what="AIPD_HERMES_API_KEY_FILE")
        elif self.hermes_api_key:
            shared = Secret(self.hermes_api_key)
        endpoints = []
        for descriptor in self.endpoint_descriptors():
            key = shared
            if descriptor.api_key_file is not None:
                key = read_secret_file(
                    descriptor.api_key_file, what=f"api key file of endpoint {descriptor.id}"
                )
            endpoints.append(Endpoint(descriptor=descriptor, api_key=key))
        return endpoints


def _read_endpoint_file(path: Path) -> list[EndpointDescriptor]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"endpoints file {path}: {exc.strerror}") from None
    if size == 0 or size > MAX_ENDPOINT_FILE_BYTES:
        raise ValueError(f"endpoints file {path}: empty or larger than 1 MiB")
    data: Any = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"endpoints file {path}: must hold a JSON array of endpoint objects")
    return [EndpointDescriptor.model_validate(item) for item in data]


__all__ = [
    "MAX_CAPABILITIES_PER_ENDPOINT",
    "MAX_SECRET_BYTES",
    "Endpoint",
    "EndpointDescriptor",
    "SecretFileError",
    "Settings",
]
