"""worker/tracing.py on its own: which standard variables turn it on, that it does no work
while off, and the ids a log line carries inside a span (docs/tracing.md)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from tests.otel import in_memory_tracing
from worker import tracing
from worker.logs import JsonFormatter


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_only_the_standard_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_configured_from_the_environment_a_process_records_spans() -> None:
    code = (
        "from worker import tracing\n"
        "assert tracing.configure('svc', env={'OTEL_TRACES_EXPORTER': 'console'})\n"
        "with tracing.span('one') as span:\n"
        "    headers = {}\n"
        "    tracing.inject(headers)\n"
        "    print(headers['traceparent'].split('-')[1] == tracing.log_ids()[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.splitlines()[0] == "True"
    assert '"name": "one"' in out.stdout  # the console exporter printed it at exit


def test_the_helpers_do_no_work_while_off() -> None:
    """Each per-Action call is one global read and a return: the shared no-op context, no
    span object, no header work. (What that costs is measured, not asserted: timeit
    figures in docs/tracing.md "Cost"; a timed assertion would fail on a loaded host.)"""
    assert not tracing.enabled()
    headers = {"Nats-Msg-Id": "x"}
    tracing.inject(headers)
    assert tracing.span("x", kind="consumer") is tracing.NO_SPAN
    assert tracing.producing("s", headers) is tracing.NO_SPAN
    assert tracing.start("x") is None
    tracing.end(None)
    assert tracing.headers_of(None) is None
    with tracing.span("x") as current:
        assert current is None
    assert headers == {"Nats-Msg-Id": "x"}


def test_a_log_line_inside_a_span_carries_its_ids() -> None:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "hello", None, None)
    record.trace_id = "aip-trace"  # the Envelope's own trace id keeps its field
    with in_memory_tracing():
        with tracing.span("logged") as span:
            assert span is not None
            line = json.loads(JsonFormatter().format(record))
        outside = json.loads(JsonFormatter().format(record))
    context = span.get_span_context()
    assert line["otel_trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")
    assert line["trace_id"] == "aip-trace"
    assert "span_id" not in outside
