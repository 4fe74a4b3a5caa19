"""Generate `schemas/json/*.json` from the Python types (and check them for drift).

Two kinds of file:

- `aip.*.json`: the AIP 1.0 Envelope of each message type this project puts on the
  actions, results, chunks, cancel, manifest, escalation and channel subjects
  (`schemas.aip.envelope_schema`);
- `<Name>.json`: the internal types still on the subjects that have not moved to AIP
  Envelopes yet (runtime records, delegation, receipts) and the operator's input/output
  contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.aip.envelope_schema import PUBLISHED, envelope_schema
from schemas.audit import Receipt
from schemas.ids import json_schema
from schemas.operator import OperatorInputSchema, OperatorOutput

JSON_DIR = Path(__file__).parent / "json"

#: Internal types by schema name.
EXPORTED: dict[str, Any] = {
    "OperatorInput": OperatorInputSchema,
    "OperatorOutput": OperatorOutput,
    "Receipt": Receipt,
}


def render(name: str) -> str:
    """The JSON Schema document of one exported type, byte-stable for drift checks."""
    schema = json_schema(EXPORTED[name])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://aip-hermes-worker/schemas/{name}.json"
    schema["title"] = name
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


#: The AIP message types whose Envelope schema is published (`aip.core.v1.action.json`, …).
AIP_EXPORTED: tuple[str, ...] = tuple(PUBLISHED)


def render_envelope(message_type: str) -> str:
    """The Envelope schema document of one AIP message type, byte-stable like `render`."""
    return json.dumps(envelope_schema(message_type), indent=2, sort_keys=True) + "\n"


def rendered() -> dict[str, str]:
    files = {f"{name}.json": render(name) for name in EXPORTED}
    files.update({f"{mt}.json": render_envelope(mt) for mt in AIP_EXPORTED})
    return files


def export(target: Path = JSON_DIR) -> list[Path]:
    """Write every schema file, and remove the ones no type generates any more (the folder
    is generated); returns the paths written."""
    target.mkdir(parents=True, exist_ok=True)
    files = rendered()
    for stale in target.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    written = []
    for filename, text in files.items():
        path = target / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def drift(target: Path = JSON_DIR) -> list[str]:
    """Names of files whose committed text differs from what the types generate, and of
    committed schema files no type generates any more."""
    files = rendered()
    out = []
    for filename, text in files.items():
        path = target / filename
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            out.append(filename)
    out += sorted(p.name for p in target.glob("*.json") if p.name not in files)
    return out
