"""The manifest: one operation per Hermes 0.19 route, rules that hold for all, and docs that
cannot drift from the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas.action import Mode
from schemas.codec import convert_input
from schemas.errors import EnvelopeRejected
from schemas.manifest import Risk
from worker.operations.base import Registry
from worker.operations.registry import default_registry
from worker.settings import Settings
from worker.wire.manifests import capability_of

NAMES = [
    "health",
    "health_detailed",
    "capabilities",
    "models",
    "skills",
    "toolsets",
    "chat",
    "chat_stream",
    "responses",
    "responses_stream",
    "response_get",
    "response_delete",
    "sessions_list",
    "session_create",
    "session_get",
    "session_patch",
    "session_delete",
    "session_messages",
    "session_fork",
    "session_chat",
    "session_chat_stream",
    "run_start",
    "run_status",
    "run_events",
    "run_approval",
    "run_stop",
    "jobs_list",
    "job_create",
    "job_get",
    "job_update",
    "job_delete",
    "job_pause",
    "job_resume",
    "job_run",
]
#: Hermes' own route table (`_http_route_table()` in 0.19.0), minus the aliases and the
#: platform/cron webhooks that are not API-key routes.
HERMES_ROUTES = {
    "GET /health",
    "GET /health/detailed",
    "GET /v1/models",
    "GET /v1/capabilities",
    "GET /v1/skills",
    "GET /v1/toolsets",
    "GET /api/sessions",
    "POST /api/sessions",
    "GET /api/sessions/{session_id}",
    "PATCH /api/sessions/{session_id}",
    "DELETE /api/sessions/{session_id}",
    "GET /api/sessions/{session_id}/messages",
    "POST /api/sessions/{session_id}/fork",
    "POST /api/sessions/{session_id}/chat",
    "POST /api/sessions/{session_id}/chat/stream",
    "POST /v1/chat/completions",
    "POST /v1/responses",
    "GET /v1/responses/{response_id}",
    "DELETE /v1/responses/{response_id}",
    "GET /api/jobs",
    "POST /api/jobs",
    "GET /api/jobs/{job_id}",
    "PATCH /api/jobs/{job_id}",
    "DELETE /api/jobs/{job_id}",
    "POST /api/jobs/{job_id}/pause",
    "POST /api/jobs/{job_id}/resume",
    "POST /api/jobs/{job_id}/run",
    "POST /v1/runs",
    "GET /v1/runs/{run_id}",
    "GET /v1/runs/{run_id}/events",
    "POST /v1/runs/{run_id}/approval",
    "POST /v1/runs/{run_id}/stop",
}
APPROVAL = {
    "run_start",
    "run_approval",
    "run_stop",
    "job_create",
    "job_update",
    "job_delete",
    "job_pause",
    "job_resume",
    "job_run",
    "session_delete",
    "response_delete",
}
DOC = Path(__file__).resolve().parents[2] / "docs" / "capabilities.md"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry()


def test_every_route_is_exactly_one_named_operation(registry: Registry) -> None:
    assert list(registry.operations) == NAMES
    routes = {f"{op.spec.method} {op.spec.route}" for op in registry.operations.values()}
    assert routes == HERMES_ROUTES


def test_a_streaming_twin_takes_stream_only_and_its_sync_sibling_never_streams(
    registry: Registry,
) -> None:
    for twin, sibling in (
        ("chat_stream", "chat"),
        ("responses_stream", "responses"),
        ("session_chat_stream", "session_chat"),
    ):
        streaming, plain = registry.get(twin), registry.get(sibling)
        assert streaming is not None
        assert plain is not None
        assert streaming.spec.modes == (Mode.STREAM,), twin
        assert Mode.STREAM not in plain.spec.modes, sibling
    # The sync turns take no `stream` flag: a caller cannot make `chat` stream.
    chat = registry.get("chat")
    assert chat is not None
    with pytest.raises(EnvelopeRejected):
        convert_input(
            {"messages": [{"role": "user", "content": "x"}], "stream": True}, chat.spec.input_type
        )


def test_safety_rules_hold_for_every_operation(registry: Registry) -> None:
    for op in registry.operations.values():
        spec = op.spec
        assert spec.read_only == (spec.method == "GET"), spec.name
        assert spec.idempotency_required == (not spec.read_only), spec.name
        assert spec.approval_required == (spec.name in APPROVAL), spec.name
        if spec.approval_required:
            assert spec.risk in (Risk.MEDIUM, Risk.HIGH), spec.name
        if spec.read_only:
            assert spec.risk is Risk.LOW
        assert op.handles_cancel is False
        assert op.self_fenced is False
        assert spec.description


def test_manifest_capabilities_carry_a_json_schema_for_every_input(registry: Registry) -> None:
    entries = [capability_of(op.spec, "hermes-1") for op in registry.operations.values()]
    assert len(entries) == len(NAMES)
    for entry in entries:
        assert entry.id == f"cap:hermes_agent:hermes-1:{entry.name}"
        assert entry.bindings[0]["operation"] == entry.name
        msgspec.json.encode(entry)
        assert entry.input_schema["type"] == "object"


def test_the_capabilities_doc_matches_the_registry(registry: Registry) -> None:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    documented = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) == 9:  # the capability table, not the stream-family table
            documented[cells[0].strip("`")] = cells[1:8]
    for op in registry.operations.values():
        s = op.spec
        assert documented[s.name] == [
            f"`{s.method} {s.route}`",
            "read-only" if s.read_only else "unsafe",
            s.risk.value,
            "yes" if s.approval_required else "no",
            "yes" if s.idempotency_required else "no",
            "yes" if s.streaming else "no",
            str(s.timeout_ms),
        ], s.name
    assert set(documented) == set(NAMES)


def test_the_read_retry_budget_comes_from_settings() -> None:
    registry = default_registry(Settings(hermes_read_retry_attempts=5))
    models = registry.get("models")
    assert models is not None
    assert models.retry.retries == 5  # type: ignore[attr-defined]


VALID = "run_" + "a" * 32


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("run_status", {"run_id": "run_123"}),
        ("run_status", {"run_id": "../health"}),
        ("run_status", {"run_id": VALID.upper()}),
        ("run_approval", {"run_id": VALID, "choice": "approve-everything"}),
        ("job_get", {"job_id": "28ea286c63c"}),
        ("job_get", {"job_id": "../sessions"}),
        ("job_update", {"job_id": "28ea286c63c8"}),
        ("response_get", {"response_id": "resp_xyz"}),
        ("session_get", {"session_id": "a/b"}),
        ("session_get", {"session_id": ".."}),
        ("session_get", {"session_id": "a..b"}),
        ("session_get", {"session_id": "C:\\x"}),
        ("session_get", {"session_id": "x" * 257}),
        ("session_chat", {"session_id": "s", "message": ""}),
        ("session_create", {"title": "t" * 101}),
        ("sessions_list", {"limit": 201}),
        ("chat", {"messages": []}),
        ("chat_stream", {"messages": [{"role": "root", "content": "x"}]}),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "stream": "true"}),
        ("responses", {"input": "x", "stream": True}),
        (
            "responses_stream",
            {"input": "x", "conversation": "c", "previous_response_id": "resp_" + "0" * 28},
        ),
        ("job_create", {"name": "n", "schedule": "every 1m", "prompt": "p" * 5001}),
        ("health", {"anything": 1}),
    ],
)
@pytest.mark.aip_family("schema_enforcement", assertions=["invalid_input_rejected"])
def test_invalid_input_is_rejected_before_any_request(
    registry: Registry, name: str, value: dict[str, Any]
) -> None:
    op = registry.get(name)
    assert op is not None
    with pytest.raises(EnvelopeRejected):
        convert_input(value, op.spec.input_type)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("session_get", {"session_id": "api_1796019159_3307dbcb"}),
        ("session_get", {"session_id": "aip-operator-act_" + "0" * 32}),
        ("session_get", {"session_id": "0b6b2c8e-1a0a-4c1e-9a51-6f3f2a1d9b7e"}),
        ("job_update", {"job_id": "28ea286c63c8", "enabled": False}),
        ("session_patch", {"session_id": "s", "title": None}),
        ("run_start", {"input": [{"role": "user", "content": "hi"}], "session_id": "s-1"}),
        ("responses", {"input": ["a", {"role": "user", "content": "b"}], "store": False}),
    ],
)
def test_valid_input_is_accepted(registry: Registry, name: str, value: dict[str, Any]) -> None:
    op = registry.get(name)
    assert op is not None
    convert_input(value, op.spec.input_type)
