"""The cancel notice among workers (`…control.cancel`) is an AIP Cancel Envelope, read by
its three fields only: documents here are written from the AIP rules (a dict), not with
the project's encoder, and the encoder's output is checked against the exported schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from schemas.errors import EnvelopeRejected
from worker.wire.cancels import MAX_NOTICE_BYTES, encode_cancel_notice, notice_action_id

ACTION = "act_" + "0123456789abcdef" * 2
PADDING = b"y" * MAX_NOTICE_BYTES
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "json" / "aip.core.v1.cancel.json"


def _rule_built(target: dict[str, str], message_type: str = "aip.core.v1.cancel") -> bytes:
    envelope = {
        "aip_version": "1.0",
        "message_type": message_type,
        "message_id": "msg_0190a1b2c3d47e8f9a0b1c2d3e4f5a6b",
        "sent_at": "2026-12-06T05:00:00Z",
        "from": {"id": "agent:hermes_operator:hermes-1", "kind": "agent"},
        "body": {"cancel": {"target": target, "reason": "re-read"}},
    }
    return json.dumps(envelope).encode()


def test_a_rule_built_notice_names_its_action() -> None:
    assert notice_action_id(_rule_built({"action": ACTION})) == ACTION


def test_what_a_worker_publishes_is_a_schema_valid_cancel_envelope() -> None:
    data = encode_cancel_notice(
        ACTION, endpoint_id="hermes-1", signer=None, correlation_id="msg_corr"
    )
    schema = json.loads(SCHEMA.read_text("utf-8"))
    jsonschema.validate(json.loads(data), schema, cls=jsonschema.Draft202012Validator)
    assert notice_action_id(data) == ACTION


@pytest.mark.parametrize(
    "data",
    [
        ACTION.encode(),  # the notice before AIP: a bare id
        b"not json",
        _rule_built({"session": "sess_1"}),
        _rule_built({"action": "act_nothex"}),
        _rule_built({"action": ACTION}, message_type="aip.core.v1.action"),
        _rule_built({"action": ACTION}).replace(b"}}}", b'}}, "x": "' + PADDING + b'"}'),
    ],
)
def test_anything_else_is_not_a_notice(data: bytes) -> None:
    with pytest.raises(EnvelopeRejected):
        notice_action_id(data)
