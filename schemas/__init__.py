"""Wire types of aip-hermes-worker: what travels on the bus, as strict msgspec Structs.

Publishers in other languages use the generated JSON Schema files in `schemas/json/`.
"""

from schemas.action import Action, ApprovalRef, DelegationRef, Identity, Mode, Trace
from schemas.chunk import (
    ChunkKind,
    DataChunk,
    DoneChunk,
    ErrorChunk,
    PendingApprovalChunk,
    ProgressChunk,
    StreamChunk,
    ThoughtChunk,
    ToolChunk,
    make_chunk,
)
from schemas.codec import encode
from schemas.delegation import DelegationRequest
from schemas.errors import CODE_RULES, EnvelopeRejected, ErrorCategory, ErrorCode, ProtocolError
from schemas.ids import capability_id, new_action_id
from schemas.manifest import Risk
from schemas.operator import (
    ApprovalChoice,
    OperatorInput,
    OperatorInputSchema,
    OperatorObjective,
    OperatorOutput,
    OperatorResume,
    OperatorStatus,
)
from schemas.result import ActionResult, ResultStatus

__all__ = [
    "CODE_RULES",
    "Action",
    "ActionResult",
    "ApprovalChoice",
    "ApprovalRef",
    "ChunkKind",
    "DataChunk",
    "DelegationRef",
    "DelegationRequest",
    "DoneChunk",
    "EnvelopeRejected",
    "ErrorCategory",
    "ErrorChunk",
    "ErrorCode",
    "Identity",
    "Mode",
    "OperatorInput",
    "OperatorInputSchema",
    "OperatorObjective",
    "OperatorOutput",
    "OperatorResume",
    "OperatorStatus",
    "PendingApprovalChunk",
    "ProgressChunk",
    "ProtocolError",
    "ResultStatus",
    "Risk",
    "StreamChunk",
    "ThoughtChunk",
    "ToolChunk",
    "Trace",
    "capability_id",
    "encode",
    "make_chunk",
    "new_action_id",
]
