"""The AIP 1.0 body types (`schemas/aip/`) against our own documents written from the
published rules (tests/vectors/aip/messages.json): each valid payload reads back exactly
as upstream serializes it, each normalized one serializes as the rules say (absent, never
null; empty lists omitted; defaulted flags written), each invalid one is refused; and the
exported JSON Schema of every payload describes every field.

The documents are data written by hand, not produced by the project's codec, so a change
to the types that drifts from the rules fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from schemas.aip.json_schema import json_schema
from schemas.aip.messages import (
    BODY_KEYS,
    PAYLOAD_TYPES,
    BodyError,
    open_body,
    open_signed_body,
    payload_builtins,
)
from worker.aip.canonical import canonical_bytes

VECTORS = json.loads(
    (Path(__file__).parents[1] / "vectors" / "aip" / "messages.json").read_text("utf-8")
)["messages"]


def _cases(kind: str) -> list[tuple[str, Any]]:
    return [(mt, case) for mt, cases in VECTORS.items() for case in cases.get(kind, [])]


def test_every_payload_type_has_vectors() -> None:
    assert set(VECTORS) == set(PAYLOAD_TYPES)
    for message_type, cases in VECTORS.items():
        assert cases["valid"], message_type
        assert cases["invalid"], message_type


@pytest.mark.parametrize(("message_type", "payload"), _cases("valid"))
def test_a_valid_payload_reads_back_as_upstream_serializes_it(
    message_type: str, payload: Any
) -> None:
    key = BODY_KEYS[message_type]
    decoded = open_body(message_type, {key: payload})
    again_type, body = payload_builtins(decoded)
    assert again_type == message_type
    assert canonical_bytes(body) == canonical_bytes({key: payload})


@pytest.mark.parametrize(("message_type", "case"), _cases("normalized"))
def test_absent_optionals_stay_absent_and_defaulted_flags_are_written(
    message_type: str, case: dict[str, Any]
) -> None:
    key = BODY_KEYS[message_type]
    _, body = payload_builtins(open_body(message_type, {key: case["given"]}))
    assert body == {key: case["serialized"]}


@pytest.mark.parametrize(("message_type", "case"), _cases("invalid"))
def test_an_invalid_payload_is_refused(message_type: str, case: dict[str, Any]) -> None:
    with pytest.raises(BodyError):
        open_body(message_type, {BODY_KEYS[message_type]: case["doc"]})


def test_a_body_must_have_exactly_the_message_type_s_one_key() -> None:
    action = VECTORS["aip.core.v1.action"]["valid"][0]
    with pytest.raises(BodyError, match="body must be"):
        open_body("aip.core.v1.action", {"action_result": action})
    with pytest.raises(BodyError, match="body must be"):
        open_body("aip.core.v1.action", {"action": action, "extensions": {}})
    with pytest.raises(BodyError, match="body must be"):
        open_body("aip.core.v1.action", [action])
    with pytest.raises(BodyError, match="not one this connector speaks"):
        open_body("aip.session.v1.session_request", {"session_request": {}})


def test_the_error_envelope_body_wraps_the_protocol_error() -> None:
    """`{"error": {"error": {...}}}`: the error body is itself a wrapper."""
    error = VECTORS["aip.core.v1.error"]["valid"][0]
    _, body = payload_builtins(open_body("aip.core.v1.error", {"error": error}))
    assert body["error"]["error"]["category"] == "transport"


def _walk(schema: Any, path: str, missing: list[str]) -> None:
    if isinstance(schema, dict):
        for name, prop in (schema.get("properties") or {}).items():
            if isinstance(prop, dict) and not prop.get("description"):
                missing.append(f"{path}.{name}")
        for key, value in schema.items():
            _walk(value, f"{path}/{key}", missing)
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            _walk(value, f"{path}[{index}]", missing)


@pytest.mark.parametrize("message_type", sorted(PAYLOAD_TYPES))
def test_the_json_schema_describes_every_field_and_is_closed(message_type: str) -> None:
    schema = json_schema(PAYLOAD_TYPES[message_type])
    missing: list[str] = []
    _walk(schema, "$", missing)
    assert missing == []
    for name, definition in schema["$defs"].items():
        if definition.get("type") == "object" and definition.get("properties"):
            assert definition.get("additionalProperties") is False, name


@pytest.mark.parametrize(("message_type", "payload"), _cases("valid"))
def test_a_body_in_upstream_form_opens_as_signed(message_type: str, payload: Any) -> None:
    body = {BODY_KEYS[message_type]: payload}
    assert open_signed_body(message_type, body) == open_body(message_type, body)


@pytest.mark.parametrize(("message_type", "case"), _cases("normalized"))
def test_a_body_upstream_would_re_serialize_otherwise_is_refused_as_signed(
    message_type: str, case: Any
) -> None:
    """Upstream verifies over its re-serialization: a body it reads but would write
    otherwise (a null, an empty list, a defaulted flag left out) cannot carry a signature
    that verifies there."""
    key = BODY_KEYS[message_type]
    open_body(message_type, {key: case["given"]})
    with pytest.raises(BodyError, match="not as upstream re-serializes it"):
        open_signed_body(message_type, {key: case["given"]})
    open_signed_body(message_type, {key: case["serialized"]})


def test_a_signed_body_without_a_defaulted_flag_is_refused() -> None:
    message_type = "aip.lifecycle.v1.action_status_request"
    body = {"action_status_request": {"action_id": "act_" + "a" * 32}}
    open_body(message_type, body)
    with pytest.raises(BodyError, match=r"body\.action_status_request\.include_"):
        open_signed_body(message_type, body)


def test_a_signed_body_with_an_integer_for_a_float_is_refused() -> None:
    """msgspec reads 50 into a float field; upstream re-prints it as 50.0."""
    message_type = "aip.core.v1.heartbeat"
    body = {"heartbeat": {"sequence": 1, "progress": 50}}
    open_body(message_type, body)
    with pytest.raises(BodyError, match=r"body\.heartbeat\.progress"):
        open_signed_body(message_type, body)
    open_signed_body(message_type, {"heartbeat": {"sequence": 1, "progress": 50.0}})
