"""Generate `schemas/json/*.json` from the Python types (and check them for drift)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.action import Action
from schemas.aip.action_envelope import ActionEnvelope
from schemas.audit import Receipt
from schemas.cancel import CancelReply, CancelRequest
from schemas.channel import ChannelDelivery, ChannelMessage
from schemas.chunk import StreamChunk
from schemas.delegation import DelegationRequest
from schemas.errors import ProtocolError
from schemas.escalation import Escalation, EscalationResolution
from schemas.ids import json_schema
from schemas.lifecycle import LifecycleRecord, QueueRecord
from schemas.manifest import CapabilityManifest
from schemas.operator import OperatorInputSchema, OperatorOutput
from schemas.result import ActionResult

JSON_DIR = Path(__file__).parent / "json"

EXPORTED: dict[str, Any] = {
    #: What `aip.hermes.{endpoint}.actions` carries.
    "ActionEnvelope": ActionEnvelope,
    #: The in-process Action it maps to (docs/publishing.md, The Action), also the child
    #: Action a DelegationRequest and a QueueRecord carry.
    "Action": Action,
    "OperatorInput": OperatorInputSchema,
    "OperatorOutput": OperatorOutput,
    "StreamChunk": StreamChunk,
    "ActionResult": ActionResult,
    "ProtocolError": ProtocolError,
    "CancelRequest": CancelRequest,
    "CancelReply": CancelReply,
    "DelegationRequest": DelegationRequest,
    "QueueRecord": QueueRecord,
    "LifecycleRecord": LifecycleRecord,
    "CapabilityManifest": CapabilityManifest,
    "Receipt": Receipt,
    "Escalation": Escalation,
    "EscalationResolution": EscalationResolution,
    "ChannelDelivery": ChannelDelivery,
    "ChannelMessage": ChannelMessage,
}


def render(name: str) -> str:
    """The JSON Schema document of one exported type, byte-stable for drift checks."""
    schema = json_schema(EXPORTED[name])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://aip-hermes-worker/schemas/{name}.json"
    schema["title"] = name
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def rendered() -> dict[str, str]:
    return {f"{name}.json": render(name) for name in EXPORTED}


def export(target: Path = JSON_DIR) -> list[Path]:
    """Write every schema file; returns the paths written."""
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in rendered().items():
        path = target / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def drift(target: Path = JSON_DIR) -> list[str]:
    """Names of files whose committed text differs from what the types generate."""
    out = []
    for filename, text in rendered().items():
        path = target / filename
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            out.append(filename)
    return out
