"""What the tracing tests share (docs/tracing.md).

`otlp_receiver`: a small OTLP/HTTP trace receiver, a real HTTP server that decodes what a
worker process's OTLP exporter sends (`POST /v1/traces`, protobuf) with the
`opentelemetry-proto` package and keeps every span. A worker is another process: the
in-memory exporter of the test's own process never sees its spans, so its
`OTEL_EXPORTER_OTLP_ENDPOINT` points here instead (`traced`).

`in_memory_tracing`: this process traced through an SDK provider of its own with the
in-memory exporter, as an application embedding `AipClient` would be (the gateway and the
fake Hermes of a test run in it too).
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker import tracing


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as exported, ids as lowercase hex (parent '' for a root)."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    #: (trace id, span id) of each linked span.
    links: tuple[tuple[str, str], ...]
    #: The exporting process's resource attributes (`service.name`, ...).
    resource: dict[str, Any]


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass
class OtlpReceiver:
    url: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    #: False: a sink that only counts what arrives (the bench's, which must not spend its
    #: CPU decoding).
    decode: bool = True
    received_bytes: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received_bytes += len(body)
        if not self.decode:
            self.requests += 1
            return web.Response(
                body=ExportTraceServiceResponse().SerializeToString(),
                content_type="application/x-protobuf",
            )
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        self.requests += 1
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ),
                            resource=resource,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 15.0
    ) -> list[ReceivedSpan]:
        """Every span received once `found` holds of them (exporters send in batches)."""
        deadline = time.monotonic() + timeout_s
        while not found(self.spans):
            if time.monotonic() > deadline:
                names = sorted({span.name for span in self.spans})
                raise AssertionError(f"spans never arrived; received: {names}")
            await asyncio.sleep(0.05)
        return list(self.spans)


@asynccontextmanager
async def otlp_receiver(*, decode: bool = True) -> AsyncIterator[OtlpReceiver]:
    """A receiver on a free loopback port; `url` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""
    receiver = OtlpReceiver(decode=decode)
    app = web.Application()
    app.router.add_post("/v1/traces", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    receiver.url = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        await runner.cleanup()


def traced(receiver: OtlpReceiver, instance: str) -> dict[str, str]:
    """A worker's environment that turns tracing on (the standard variables only), its
    spans sent to `receiver` every 50 ms and told apart by `service.instance.id`."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={instance}",
    }


@contextmanager
def in_memory_tracing() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider, owned=False)
    try:
        yield exporter
    finally:
        tracing.disable()
        provider.shutdown()


def received(span: ReadableSpan) -> ReceivedSpan:
    """An in-memory span in the receiver's shape, to walk one trace across processes."""
    context = span.get_span_context()
    assert context is not None
    parent = span.parent
    return ReceivedSpan(
        name=span.name,
        trace_id=format(context.trace_id, "032x"),
        span_id=format(context.span_id, "016x"),
        parent_id=format(parent.span_id, "016x") if parent is not None else "",
        kind=span.kind.value,
        attributes=dict(span.attributes or {}),
        links=tuple(
            (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
            for link in span.links
        ),
        resource=dict(span.resource.attributes),
    )


def parent_of(traceparent: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C `traceparent` (version 00; flags ignored)."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id


def one(spans: list[ReceivedSpan], name: str, **where: object) -> ReceivedSpan:
    """The one span named `name` whose attributes hold `where`."""
    found = [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in where.items())
    ]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def descends(span: ReceivedSpan, ancestor: ReceivedSpan, spans: list[ReceivedSpan]) -> bool:
    """`span` is below `ancestor` by parent links among `spans`."""
    by_id = {s.span_id: s for s in spans}
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        if span.span_id == ancestor.span_id:
            return True
    return False
