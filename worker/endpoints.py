"""Hermes endpoints: as an administrator names them, and as a worker uses them (with keys).

Settings name endpoints inline (`AIPD_HERMES_ENDPOINTS`, `id=url`) or in a JSON file of
descriptors (`AIPD_HERMES_ENDPOINTS_FILE`), and their bearer keys per endpoint
(`api_key_file`, `AIPD_HERMES_API_KEY_FILES`) or once for all (`AIPD_HERMES_API_KEY_FILE`).
This module turns those settings into descriptors and reads the keys (at start-up, and
again on the serving gate's probe schedule),
refusing every configuration in which a key could reach an endpoint it does not belong to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.errors import InvalidEndpointId
from subjects.grammar import normalize_endpoint_id
from worker.secret_files import Secret, read_secret_file
from worker.settings import Settings, split_list

MAX_ENDPOINT_FILE_BYTES = 1_048_576


class EndpointDescriptor(BaseModel):
    """One Hermes endpoint as an administrator configured it (JSON file form)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    #: The reference connector's endpoints file names it `base_url`; both are read.
    url: str = Field(validation_alias=AliasChoices("url", "base_url"))
    #: A name for people (the reference connector's field; shown nowhere that decides).
    display_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    api_key_file: Path | None = None
    #: The verified AIP tenant that owns this endpoint; Actions of another tenant are refused.
    tenant_id: str | None = None
    #: When the tenant binding stops being valid (Unix ms); after it, everything is refused.
    tenant_expires_at_unix_ms: int | None = None
    #: An endpoint bound to no tenant that several tenants share: only then is an Action
    #: carrying a tenant admitted there, and its ids are partitioned per tenant
    #: (`worker.operations.partition`). Refused together with `tenant_id`.
    shared: bool = False
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

    @model_validator(mode="after")
    def _shared_or_bound(self) -> EndpointDescriptor:
        if self.shared and self.tenant_id is not None:
            raise ValueError("an endpoint is either bound to a tenant or shared, not both")
        return self


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


def endpoint_descriptors(settings: Settings) -> list[EndpointDescriptor]:
    """Endpoints from the file and the inline list; duplicate normalized ids are refused."""
    found: list[EndpointDescriptor] = []
    if settings.hermes_endpoints_file is not None:
        found.extend(_read_endpoint_file(settings.hermes_endpoints_file))
    for item in split_list(settings.hermes_endpoints):
        endpoint_id, sep, url = item.partition("=")
        if not sep:
            raise ValueError(f"AIPD_HERMES_ENDPOINTS item {item!r} is not id=url")
        found.append(EndpointDescriptor(id=endpoint_id, url=url))
    seen: set[str] = set()
    for descriptor in found:
        if descriptor.id in seen:
            raise ValueError(f"endpoint id {descriptor.id!r} is configured twice")
        seen.add(descriptor.id)
    return _with_shared(found, settings.hermes_shared_endpoints)


def _with_shared(found: list[EndpointDescriptor], listed: str) -> list[EndpointDescriptor]:
    """`AIPD_HERMES_SHARED_ENDPOINTS` applied: each id named must be configured (a typo
    would silently leave an endpoint refusing every tenant, or worse, look shared when it
    is not) and bound to no tenant."""
    shared: set[str] = set()
    for raw in split_list(listed):
        try:
            shared.add(normalize_endpoint_id(raw))
        except InvalidEndpointId as exc:
            raise ValueError(f"AIPD_HERMES_SHARED_ENDPOINTS: {exc}") from None
    unknown = shared - {d.id for d in found}
    if unknown:
        raise ValueError(
            f"AIPD_HERMES_SHARED_ENDPOINTS names {', '.join(sorted(unknown))}, "
            "which is not configured"
        )
    out = []
    for descriptor in found:
        if descriptor.id in shared and not descriptor.shared:
            data = descriptor.model_dump()
            data["shared"] = True
            descriptor = EndpointDescriptor.model_validate(data)
        out.append(descriptor)
    return out


def endpoint_key_files(settings: Settings) -> dict[str, Path]:
    """Every endpoint's own key file: `api_key_file` in the endpoints file or an entry of
    `AIPD_HERMES_API_KEY_FILES`. One endpoint named twice, or an entry for an endpoint
    that is not configured, is refused: either is a key that could go astray."""
    descriptors = endpoint_descriptors(settings)
    found = {d.id: d.api_key_file for d in descriptors if d.api_key_file is not None}
    known = {d.id for d in descriptors}
    for item in split_list(settings.hermes_api_key_files):
        raw_id, sep, path = item.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"AIPD_HERMES_API_KEY_FILES item {item!r} is not id=path")
        try:
            endpoint_id = normalize_endpoint_id(raw_id)
        except InvalidEndpointId as exc:
            raise ValueError(f"AIPD_HERMES_API_KEY_FILES: {exc}") from None
        if endpoint_id not in known:
            raise ValueError(
                f"AIPD_HERMES_API_KEY_FILES names endpoint {endpoint_id!r}, "
                "which is not configured"
            )
        if endpoint_id in found:
            raise ValueError(f"endpoint {endpoint_id!r} has two API key files")
        found[endpoint_id] = Path(path.strip())
    return found


@dataclass(frozen=True, slots=True)
class KeyFile:
    """The owner-only file one endpoint's key is read from, and how errors name it."""

    path: Path
    what: str

    def read(self) -> Secret:
        """The key now in the file (`SecretFileError` names the file and what to fix)."""
        return read_secret_file(self.path, what=self.what)


def api_key_files(settings: Settings) -> dict[str, KeyFile]:
    """Where each endpoint's key comes from, for endpoints whose key is a file.

    An endpoint's own key file wins. The single `AIPD_HERMES_API_KEY_FILE` key goes to
    the endpoints without one, and only to one of them unless `hermes_share_api_key`
    says they are one deployment: a key sent to two endpoints lets either use it at the
    other (a hostile endpoint would receive another endpoint's key). The serving gate
    (`worker/serving.py`) re-reads these on its probe schedule, so a key fixed on disk is
    used without a restart.
    """
    descriptors = endpoint_descriptors(settings)
    own = endpoint_key_files(settings)
    keyless = [d.id for d in descriptors if d.id not in own]
    shared_from = (
        "AIPD_HERMES_API_KEY_FILE" if settings.hermes_api_key_file is not None
        else "AIPD_HERMES_API_KEY" if settings.hermes_api_key else None
    )
    if shared_from is not None and len(keyless) > 1 and not settings.hermes_share_api_key:
        raise ValueError(
            f"one API key ({shared_from}) would be sent to {len(keyless)} "
            f"endpoints ({', '.join(keyless)}): give each its own key "
            "(AIPD_HERMES_API_KEY_FILES or api_key_file in AIPD_HERMES_ENDPOINTS_FILE), "
            "or set AIPD_HERMES_SHARE_API_KEY=true if they are one Hermes deployment"
        )
    found = {
        endpoint_id: KeyFile(path, f"api key file of endpoint {endpoint_id}")
        for endpoint_id, path in own.items()
    }
    if settings.hermes_api_key_file is not None:
        for endpoint_id in keyless:
            found[endpoint_id] = KeyFile(settings.hermes_api_key_file, "AIPD_HERMES_API_KEY_FILE")
    return found


def resolve_endpoints(settings: Settings) -> list[Endpoint]:
    """Descriptors with their keys read from owner-only files (`api_key_files`), or the
    inline `AIPD_HERMES_API_KEY` for the endpoints without a file."""
    files = api_key_files(settings)
    inline = Secret(settings.hermes_api_key) if settings.hermes_api_key else None
    endpoints = []
    for descriptor in endpoint_descriptors(settings):
        source = files.get(descriptor.id)
        key = source.read() if source is not None else inline
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
