"""The JSON log line: what an operator's log pipeline parses, whatever the formatter caches."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from worker.gateway.settings import GatewaySettings
from worker.logs import JsonFormatter
from worker.settings import Settings

_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _record(
    created: float, msg: str = "settled %s", *args: object, **extra: object
) -> logging.LogRecord:
    record = logging.LogRecord("worker.pipeline.settle", logging.INFO, "x.py", 1, msg, args, None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    record.__dict__.update(extra)
    return record


def test_each_line_is_one_json_object_with_its_own_utc_millisecond() -> None:
    formatter = JsonFormatter()
    first = json.loads(formatter.format(_record(1_796_600_000.125, "settled %s", "act_1")))
    # The next record falls in a later second: the cached second must not be reused.
    later = json.loads(formatter.format(_record(1_796_600_061.5, "settled %s", "act_2")))
    same_second = json.loads(formatter.format(_record(1_796_600_061.875, "x")))
    assert first["ts"] == "2026-12-06T23:33:20.125Z"
    assert later["ts"] == "2026-12-06T23:34:21.500Z"
    assert same_second["ts"] == "2026-12-06T23:34:21.875Z"
    assert all(_TS.match(doc["ts"]) for doc in (first, later, same_second))
    assert first["level"] == "info"
    assert first["logger"] == "worker.pipeline.settle"
    assert first["msg"] == "settled act_1"


def test_context_fields_are_kept_and_what_json_cannot_hold_is_printed_as_text() -> None:
    line = JsonFormatter().format(
        _record(
            1_796_600_000.0,
            action_id="act_1",
            fence=3,
            endpoint=Path("/not/json"),
            capability=None,
            trace_id="tr-é",
        )
    )
    doc = json.loads(line)
    assert doc["action_id"] == "act_1"
    assert doc["fence"] == 3
    assert doc["endpoint"] == "/not/json"
    assert "capability" not in doc  # None is left out, as before
    assert doc["trace_id"] == "tr-é"
    assert "\n" not in line


def test_an_exception_is_named_and_its_traceback_kept_on_the_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record(1_796_600_000.0, "failed")
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    doc = json.loads(line)
    assert doc["error"] == "ValueError"
    assert "ValueError: boom" in doc["traceback"]
    assert "\n" not in line


@pytest.mark.parametrize("fmt", ["json", "human", "text"])
def test_the_worker_and_the_gateway_accept_the_same_log_formats(
    monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Both read `AIPD_LOG_FORMAT`, so one `.env` may serve both: what one accepts, the
    other does (the gateway took `text` and the worker `human` for the same format)."""
    monkeypatch.setenv("AIPD_LOG_FORMAT", fmt)
    assert Settings().log_format == fmt
    gateway_field = GatewaySettings.model_fields["log_format"].annotation
    assert TypeAdapter(gateway_field).validate_python(fmt) == fmt
