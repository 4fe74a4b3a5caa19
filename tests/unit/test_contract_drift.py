"""Publishers in other languages build from the generated files: they must never rot."""

from __future__ import annotations

from schemas.export import drift
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
    }
