"""Identifier shapes shared by every wire type.

Every wire pattern matches a whole string: it starts with `^` and ends with `\\Z`, never `$`.
msgspec validates a pattern with `re.search`, and Python's `$` also matches before a final
newline, so `^act_[0-9a-f]{32}$` admitted `act_<32 hex>\\n`, an id every exact check later
refused. JSON Schema patterns are ECMA-262, where `\\Z` does not exist and `$` already means
the end of the input: `json_schema` translates the one into the other on export.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any

import msgspec

ACTION_ID_PATTERN = r"^act_[0-9a-f]{32}\Z"
ENDPOINT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}\Z"
OPERATION_PATTERN = r"^[a-z][a-z0-9_]{0,62}\Z"
CAPABILITY_PATTERN = r"^cap:hermes_agent:[a-z0-9][a-z0-9_-]{0,62}:[a-z][a-z0-9_]{0,62}\Z"
RUN_ID_PATTERN = r"^run_[0-9a-f]{32}\Z"
#: A DLQ entry's own id (its `dead_letter.dlq_id`): the receipts of an envelope that was not
#: authenticated go under it, never under the Action id the envelope claims.
DLQ_ID_PATTERN = r"^dlq_[0-9a-f]{32}\Z"

ActionId = Annotated[str, msgspec.Meta(pattern=ACTION_ID_PATTERN)]
EndpointId = Annotated[str, msgspec.Meta(pattern=ENDPOINT_ID_PATTERN)]
CapabilityId = Annotated[str, msgspec.Meta(pattern=CAPABILITY_PATTERN)]
#: A bounded free-text identifier (principal ids, keys, trace ids): never unbounded on the wire.
ShortText = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
UnixMs = Annotated[int, msgspec.Meta(ge=0)]

_ACTION_ID_RE = re.compile(ACTION_ID_PATTERN)
_DLQ_ID_RE = re.compile(DLQ_ID_PATTERN)
_PYTHON_END = "\\Z"


def json_schema(typ: Any) -> dict[str, Any]:
    """The JSON Schema of a wire type, its patterns in the ECMA-262 dialect JSON Schema uses
    (`\\Z` at the end of a pattern becomes `$`, which means the same there)."""
    schema: dict[str, Any] = _ecma(msgspec.json.schema(typ))
    return schema


def _ecma(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: value[: -len(_PYTHON_END)] + "$"
            if key == "pattern" and isinstance(value, str) and value.endswith(_PYTHON_END)
            else _ecma(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_ecma(item) for item in node]
    return node


def new_action_id() -> str:
    """A fresh Action id (`act_` + 32 hex), as publishers are expected to mint them."""
    return "act_" + secrets.token_hex(16)


def is_endpoint_id(value: str) -> bool:
    """True when `value` is an endpoint id (before it becomes part of a key or a subject)."""
    return re.fullmatch(ENDPOINT_ID_PATTERN, value) is not None


def is_action_id(value: str) -> bool:
    """True when `value` has the Action id shape (used before building Redis keys from it)."""
    return _ACTION_ID_RE.fullmatch(value) is not None


def is_dlq_id(value: str) -> bool:
    """True when `value` has the DLQ entry id shape (`dlq_` + 32 hex)."""
    return _DLQ_ID_RE.fullmatch(value) is not None


def capability_id(endpoint_id: str, operation: str) -> str:
    """The endpoint-qualified capability id of one operation."""
    return f"cap:hermes_agent:{endpoint_id}:{operation}"


def split_capability(capability: str) -> tuple[str, str]:
    """(endpoint_id, operation) of a capability id that already matched CAPABILITY_PATTERN."""
    _, _, endpoint_id, operation = capability.split(":", 3)
    return endpoint_id, operation
