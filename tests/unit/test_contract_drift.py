"""Publishers in other languages build from the generated files: they must never rot."""

from __future__ import annotations

import json

from schemas.export import JSON_DIR, drift
from subjects import asyncapi
from worker.commands import config_doc


def test_json_schema_files_match_the_wire_types() -> None:
    assert drift() == [], "run: aip-hermes-worker schemas export"


def test_asyncapi_document_matches_the_subjects_and_types() -> None:
    assert not asyncapi.drifted(), "run: aip-hermes-worker schemas export"


def test_configuration_reference_matches_the_settings() -> None:
    assert not config_doc.drifted(), "run: aip-hermes-worker schemas export"


def test_asyncapi_names_every_subject_of_the_grammar() -> None:
    doc = asyncapi.document()
    addresses = {channel["address"] for channel in doc["channels"].values()}
    assert addresses == {
        "aip.hermes.{endpoint}.actions",
        "aip.hermes.{endpoint}.delegations",
        "aip.hermes.{endpoint}.cancel",
        "aip.hermes.{endpoint}.chunks.{action_id}",
        "aip.hermes.{endpoint}.results.{action_id}",
        "aip.hermes.{endpoint}.dlq",
        "aip.hermes.{endpoint}.audit.{action_id}",
        "aip.hermes.{endpoint}.egress",
        "aip.hermes.{endpoint}.inbound.{session_id}",
        "aip.hermes.{endpoint}.escalations",
        "aip.hermes.{endpoint}.escalations.resolved",
        "aip.hermes.{endpoint}.manifest",
        "aip.runtime.queue.{action_id}",
        "aip.runtime.lifecycle.{action_id}",
        "aip.runtime.open.{shard}",
    }


def test_asyncapi_envelope_subjects_carry_the_aip_envelope_schemas() -> None:
    """Actions, results and chunks are AIP 1.0 Envelopes: each channel's one message is
    named by its message type, its payload is the exported Envelope schema, and the only
    header left is Nats-Msg-Id (the signature is inside the Envelope)."""
    doc = asyncapi.document()
    for channel, message_type in (
        ("actions", "aip.core.v1.action"),
        ("results", "aip.core.v1.action_result"),
        ("chunks", "aip.core.v1.stream_chunk"),
    ):
        assert list(doc["channels"][channel]["messages"]) == [message_type]
        message = doc["components"]["messages"][message_type]
        assert message["name"] == message_type
        assert message["contentType"] == "application/json"
        assert message["payload"] == {"$ref": f"#/components/schemas/{message_type}"}
        assert set(message["headers"]["properties"]) == {"Nats-Msg-Id"}
        exported = json.loads((JSON_DIR / f"{message_type}.json").read_text("utf-8"))
        assert doc["components"]["schemas"][message_type] == exported
    for gone in ("Action", "ActionResult", "StreamChunk", "ProtocolError"):
        assert gone not in doc["components"]["schemas"]
        assert not (JSON_DIR / f"{gone}.json").exists()
