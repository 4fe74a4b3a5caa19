"""Where messages travel: the subject grammar, stream specs and provisioning (docs/architecture.md §3)."""

from subjects.grammar import (
    DEFAULT_PREFIX,
    InvalidEndpointId,
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
