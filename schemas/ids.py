"""Identifier shapes shared by every wire type."""

from __future__ import annotations

import re
import secrets
from typing import Annotated

import msgspec

ACTION_ID_PATTERN = r"^act_[0-9a-f]{32}$"
ENDPOINT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
OPERATION_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
CAPABILITY_PATTERN = r"^cap:hermes_agent:[a-z0-9][a-z0-9_-]{0,62}:[a-z][a-z0-9_]{0,62}$"
RUN_ID_PATTERN = r"^run_[0-9a-f]{32}$"

ActionId = Annotated[str, msgspec.Meta(pattern=ACTION_ID_PATTERN)]
EndpointId = Annotated[str, msgspec.Meta(pattern=ENDPOINT_ID_PATTERN)]
CapabilityId = Annotated[str, msgspec.Meta(pattern=CAPABILITY_PATTERN)]
#: A bounded free-text identifier (principal ids, keys, trace ids): never unbounded on the wire.
ShortText = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
UnixMs = Annotated[int, msgspec.Meta(ge=0)]

_ACTION_ID_RE = re.compile(ACTION_ID_PATTERN)


def new_action_id() -> str:
    """A fresh Action id (`act_` + 32 hex), as publishers are expected to mint them."""
    return "act_" + secrets.token_hex(16)


def is_action_id(value: str) -> bool:
    """True when `value` has the Action id shape (used before building Redis keys from it)."""
    return _ACTION_ID_RE.fullmatch(value) is not None


def capability_id(endpoint_id: str, operation: str) -> str:
    """The endpoint-qualified capability id of one operation."""
    return f"cap:hermes_agent:{endpoint_id}:{operation}"


def split_capability(capability: str) -> tuple[str, str]:
    """(endpoint_id, operation) of a capability id that already matched CAPABILITY_PATTERN."""
    _, _, endpoint_id, operation = capability.split(":", 3)
    return endpoint_id, operation
