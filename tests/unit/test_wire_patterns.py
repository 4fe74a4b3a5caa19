"""Wire patterns match whole strings, and an envelope has one reading only.

msgspec checks a pattern with `re.search`, where Python's `$` also matches before a final
newline: `act_<32 hex>\\n` used to pass the Action id pattern and then fail every exact
check after it. Each id validator is tested with values drawn from its own grammar, plus
whitespace before or after. A JSON object that repeats a key is refused: msgspec would read
the last value, a first-wins gateway the first.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import approval, delegation, ids
from schemas.errors import EnvelopeRejected
from schemas.export import AIP_EXPORTED, EXPORTED, render, render_envelope
from schemas.ids import json_schema
from worker.operations import input_types as operation_ids
from worker.wire.actions import GATEWAY_SENDER, encode_action
from worker.wire.actions import decode_action as open_action


def decode_action(payload: bytes) -> Any:
    """The Action of an Action Envelope (the worker's decoder)."""
    return open_action(payload)[0]


def _sealed(action: Any) -> bytes:
    """`action` as an (unsigned) AIP Action Envelope."""
    return encode_action(action, signer=None, sender=GATEWAY_SENDER)


DELEGATE = Annotated[str, msgspec.Meta(pattern=delegation.DELEGATE_PATTERN)]
DLQ_ID = Annotated[str, msgspec.Meta(pattern=ids.DLQ_ID_PATTERN)]

#: Every validated identifier type of the wire, by name.
VALIDATORS: dict[str, Any] = {
    "ActionId": ids.ActionId,
    "EndpointId": ids.EndpointId,
    "CapabilityId": ids.CapabilityId,
    "AnyCapabilityId": delegation.AnyCapabilityId,
    "Delegate": DELEGATE,
    "DecisionId": approval.DecisionId,
    "Fingerprint": approval.Fingerprint,
    "RunId": operation_ids.RunId,
    "JobId": operation_ids.JobId,
    "ResponseId": operation_ids.ResponseId,
    "SessionId": operation_ids.SessionId,
    "DlqId": DLQ_ID,
}

#: Whitespace a hostile publisher could add (Python's `\s` and the Unicode line breaks).
WHITESPACE = ["\n", "\r\n", "\r", " ", "\t", "\x0b", "\x0c", "\x85", "\u2028", "\u00a0"]


def _pattern(typ: Any) -> str:
    (meta,) = [m for m in typ.__metadata__ if isinstance(m, msgspec.Meta)]
    assert meta.pattern is not None
    return meta.pattern


def test_every_wire_pattern_is_anchored_at_both_ends_of_the_string() -> None:
    for name, typ in VALIDATORS.items():
        pattern = _pattern(typ)
        assert pattern.startswith("^"), name
        assert pattern.endswith("\\Z"), name


@pytest.mark.parametrize("name", sorted(VALIDATORS))
@given(data=st.data())
def test_an_id_with_whitespace_before_or_after_is_refused(name: str, data: st.DataObject) -> None:
    typ = VALIDATORS[name]
    valid = data.draw(st.from_regex(_pattern(typ), fullmatch=True), label="valid")
    assert msgspec.convert(valid, typ) == valid
    space = data.draw(st.sampled_from(WHITESPACE), label="whitespace")
    for padded in (valid + space, space + valid, valid + space + space):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(padded, typ)


def test_the_poison_id_never_decodes_as_an_action() -> None:
    action = _action()
    # The first occurrence is `body.action.id` (keys sorted: `id` before `idempotency_key`).
    poisoned = _sealed(action).replace(action.id.encode(), action.id.encode() + b"\\n", 1)
    with pytest.raises(EnvelopeRejected) as refused:
        decode_action(poisoned)
    assert refused.value.code.value == "schema.envelope.invalid"
    assert "$.id" in refused.value.reason


def test_exported_json_schemas_use_the_ecma_end_anchor() -> None:
    """JSON Schema patterns are ECMA-262, which has no `\\Z` (and whose `$` is the end)."""
    for name in EXPORTED:
        text = render(name)
        assert "\\\\Z" not in text, name
    for message_type in AIP_EXPORTED:
        assert "\\\\Z" not in render_envelope(message_type), message_type
    found = re.findall(r'"pattern": "([^"]*)"', render_envelope("aip.core.v1.cancel"))
    found += re.findall(r'"pattern": "([^"]*)"', render_envelope("aip.core.v1.action_result"))
    assert found
    assert all(p.endswith("$") for p in found)
    manifest_schema = json_schema(operation_ids.SessionId)
    assert manifest_schema["pattern"].endswith("$")


def _action() -> Any:
    from worker.client import AipClient

    client = AipClient.__new__(AipClient)
    return client.build_action(
        endpoint_id="h1",
        operation="models",
        input={"a": {"b": 1}, "c": [1, 2]},
        principal_id="user:alice",
        tenant_id="acme",
    )


@pytest.mark.parametrize(
    ("original", "repeated"),
    [
        (b'"mode":"async"', b'"mode":"sync","mode":"async"'),
        (b'"a":{"b":1}', b'"a":{"b":1,"b":2}'),
        (b'"input":{', b'"input":{"c":0,'),
        (b'"tenant":{"id":"acme"}', b'"tenant":{"id":"acme","id":"evil"}'),
    ],
)
def test_a_repeated_key_at_any_depth_is_refused(original: bytes, repeated: bytes) -> None:
    payload = _sealed(_action())
    assert original in payload
    compact = payload.replace(original, repeated, 1)
    pretty = msgspec.json.format(compact, indent=2)  # not msgspec's own bytes: the slow path
    for variant in (compact, pretty):
        with pytest.raises(EnvelopeRejected) as refused:
            decode_action(variant)
        assert refused.value.code.value == "envelope.decode.invalid"
        assert "repeats a key" in refused.value.reason


def test_envelopes_without_repeated_keys_decode_on_both_paths() -> None:
    payload = _sealed(_action())
    assert decode_action(payload) == decode_action(msgspec.json.format(payload, indent=2))
    # Escapes a canonical encoder would not write are read as the same text.
    escaped = payload.replace(b'"user:alice"', b'"user\\u003aalice"')
    assert decode_action(escaped).identity.principal_id == "user:alice"


def test_cancel_envelopes_refuse_repeated_keys_too() -> None:
    """A Cancel Envelope (`worker.wire.cancels`) refuses a repeated key as an Action does."""
    from worker.wire.cancels import decode_cancel, encode_cancel

    cancel = encode_cancel(
        "act_" + "a" * 32, requester={"id": "user:alice", "kind": "human"}, signer=None
    )
    assert decode_cancel(cancel).action_id == "act_" + "a" * 32
    repeated = cancel.replace(
        b'{"action":"act_', b'{"action":"act_' + b"b" * 32 + b'","action":"act_'
    )
    with pytest.raises(EnvelopeRejected) as refused:
        decode_cancel(repeated)
    assert refused.value.code.value == "envelope.decode.invalid"


def test_the_manifest_publishes_patterns_in_the_ecma_dialect_too() -> None:
    """Every schema a worker serves in its manifest (input schemas, the operator's output
    schema) uses `$`, never Python's `\\Z`, which an ECMA-262 validator misreads."""
    from worker.settings import Settings
    from worker.wire.manifests import EndpointFacts, build_manifest
    from worker.wiring import build_registry

    registry = build_registry(Settings(hermes_endpoints="h1=http://127.0.0.1:1"))
    manifest = build_manifest(
        [op.spec for op in registry.operations.values()],
        EndpointFacts(
            endpoint_id="h1", actions_subject="aip.hermes.h1.actions", worker_version="t"
        ),
    )
    text = msgspec.json.encode(manifest).decode()
    assert '"pattern"' in text
    assert "\\\\Z" not in text
