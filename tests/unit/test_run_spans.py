"""Agent and tool spans read from a Hermes run's events (worker/operations/run_spans.py),
on this process's SDK provider with the in-memory exporter."""

from __future__ import annotations

from opentelemetry.trace import StatusCode

from tests.otel import in_memory_tracing
from worker import tracing
from worker.operations.classifiers import RunEvents
from worker.operations.run_spans import RunSpans


def test_untraced_runs_hold_nothing() -> None:
    assert not tracing.enabled()
    assert RunSpans.open("run_1") is None
    assert RunEvents()._spans is None


def test_a_run_is_an_agent_span_with_a_tool_span_per_call_and_its_usage() -> None:
    with in_memory_tracing() as exporter:
        with tracing.span("aip.execute operator") as execute:
            assert execute is not None
            spans = RunSpans.open("run_1")
            assert spans is not None
            spans.see("message.delta", {"delta": "thinking"})
            spans.see("tool.started", {"tool": "terminal", "preview": "echo one"})
            spans.see("tool.started", {"tool": "terminal", "preview": "false"})
            spans.see("tool.completed", {"tool": "terminal", "duration": 0.01, "error": False})
            spans.see("tool.completed", {"tool": "terminal", "duration": 0.01, "error": True})
            usage = {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}
            spans.see("run.completed", {"output": "done", "usage": usage})
        finished = {s.name: s for s in exporter.get_finished_spans()}
        tools = [s for s in exporter.get_finished_spans() if s.name == "execute_tool terminal"]
    agent = finished["invoke_agent hermes"]
    assert agent.parent is not None
    assert agent.parent.span_id == execute.get_span_context().span_id
    assert agent.attributes is not None
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["aip.hermes.run_id"] == "run_1"
    assert agent.attributes["gen_ai.usage.input_tokens"] == 11
    assert agent.attributes["gen_ai.usage.output_tokens"] == 7
    assert agent.attributes["aip.run.terminal_event"] == "run.completed"
    assert agent.status.status_code is not StatusCode.ERROR
    assert len(tools) == 2
    for tool in tools:
        assert tool.parent is not None
        assert tool.parent.span_id == agent.get_span_context().span_id
        assert tool.attributes is not None
        assert tool.attributes["gen_ai.tool.name"] == "terminal"
    # The calls complete in the order they started: the second one failed.
    first, second = sorted(tools, key=lambda s: s.start_time or 0)
    assert first.status.status_code is not StatusCode.ERROR
    assert second.status.status_code is StatusCode.ERROR


def test_a_failed_run_fails_its_agent_span_and_an_ended_observation_ends_every_span() -> None:
    with in_memory_tracing() as exporter:
        failed = RunSpans.open("run_2")
        assert failed is not None
        failed.see("run.failed", {"error": "boom"})
        paused = RunSpans.open("run_3")
        assert paused is not None
        paused.see("tool.started", {"tool": "terminal"})
        paused.see("approval.request", {"command": "chmod 777 x"})
        paused.close()  # the observation stops at the prompt
        ended = exporter.get_finished_spans()
    by_run = {
        (s.attributes or {}).get("aip.hermes.run_id"): s
        for s in ended
        if s.name == "invoke_agent hermes"
    }
    assert by_run["run_2"].status.status_code is StatusCode.ERROR
    assert "aip.run.terminal_event" not in (by_run["run_3"].attributes or {})
    assert [s.name for s in ended].count("execute_tool terminal") == 1


def test_the_raw_runs_stream_reads_its_events_into_spans_too() -> None:
    from worker.hermes.sse import SSEEvent

    with in_memory_tracing() as exporter:
        events = RunEvents()
        for name, data in (
            ("tool.started", {"event": "tool.started", "tool": "terminal"}),
            ("tool.completed", {"event": "tool.completed", "tool": "terminal", "error": False}),
            ("run.completed", {"event": "run.completed", "output": "ok"}),
        ):
            events.step(SSEEvent(name=name, data=data, named=False))
        names = sorted(s.name for s in exporter.get_finished_spans())
    assert names == ["execute_tool terminal", "invoke_agent hermes"]
