"""The capability manifest a worker answers on `aip.hermes.{endpoint}.manifest` and `$SRV`."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from schemas._base import WireStruct


class Risk(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class CapabilityEntry(WireStruct, kw_only=True, frozen=True):
    capability: str
    operation: str
    method: str
    #: The Hermes route template, e.g. `/v1/runs/{run_id}`.
    route: str
    read_only: bool
    risk: Risk
    approval_required: bool
    idempotency_required: bool
    streaming: bool
    timeout_ms: int
    input_schema: dict[str, Any]


class CapabilityManifest(WireStruct, kw_only=True, frozen=True):
    endpoint_id: str
    worker_version: str
    capabilities: list[CapabilityEntry]
