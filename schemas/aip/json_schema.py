"""JSON Schema of the AIP body types, as this project publishes them (every field
described; the tag property of a tagged variant described too, which msgspec leaves
bare; patterns in the ECMA-262 dialect, as `schemas.ids.json_schema` writes them)."""

from __future__ import annotations

from typing import Any

from schemas.ids import json_schema as wire_json_schema

#: The tag properties of the tagged unions (message parts, approver selectors, rules).
TAG_DESCRIPTIONS = {
    "type": "The variant: which kind of part or selector this is.",
    "operator": "The variant: which kind of rule this is.",
}


def json_schema(payload_type: type[Any]) -> dict[str, Any]:
    """The JSON Schema (2020-12 `$defs` form) of `payload_type`."""
    schema = wire_json_schema(payload_type)
    for definition in schema.get("$defs", {}).values():
        for name, prop in (definition.get("properties") or {}).items():
            if name in TAG_DESCRIPTIONS and "description" not in prop and "enum" in prop:
                prop["description"] = TAG_DESCRIPTIONS[name]
    return schema
