"""Where messages travel: subject grammar, stream specs, provisioning (docs/architecture.md §3)."""

from schemas.errors import InvalidEndpointId
from subjects.grammar import (
    DEFAULT_PREFIX,
    Subjects,
    chunk_msg_id,
    normalize_endpoint_id,
    result_msg_id,
)

__all__ = [
    "DEFAULT_PREFIX",
    "InvalidEndpointId",
    "Subjects",
    "chunk_msg_id",
    "normalize_endpoint_id",
    "result_msg_id",
]
