"""Optional OpenTelemetry tracing: the one place that decides whether it is on, and the
helpers the rest of the code calls (docs/tracing.md).

Off unless the `otel` extra is installed and the standard variables ask for it (`configure`,
called once at a process's start): `OTEL_TRACES_EXPORTER` naming `otlp` or `console`, or
else `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set;
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps it off whatever else is set.
A process whose own code already installed an SDK `TracerProvider` (an application embedding
`AipClient`) is traced through that provider.

The decision is made once: every helper begins by reading one module global, and while it is
None a helper returns at once — no OpenTelemetry import, no span object, no header work
(`tests/unit/test_tracing.py` measures it). Only this module imports `opentelemetry`, so an
install without the extra runs the same code.

W3C `traceparent`/`tracestate` travel as NATS headers on every message the project publishes
(`inject`, `headers_of`) and as HTTP headers on every request to Hermes; a consumer
continues the trace it finds (`consuming`). The AIP Envelope's own trace fields are not
filled from it: the headers are the carrier.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span as Span  # callers annotate with `tracing.Span`
    from opentelemetry.trace import SpanKind, Tracer

log = logging.getLogger(__name__)

#: Where a NATS message's trace context travels (W3C Trace Context, lower case as written).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


class _EnvelopeTrace(msgspec.Struct):
    """The one field of an AIP Envelope `envelope_trace` reads (the rest is skipped)."""

    trace: dict[str, Any] | None = None


_ENVELOPE_TRACE = msgspec.json.Decoder(_EnvelopeTrace)

#: The value of `messaging.system` on every NATS span.
MESSAGING_SYSTEM = "nats"

#: Attribute values: str, bool, int, float (what OpenTelemetry accepts, sequences aside).
AttrValue = str | bool | int | float
Attributes = Mapping[str, AttrValue]


class _On:
    """What tracing needs once it is on: the tracer and the W3C propagator."""

    __slots__ = ("kinds", "propagator", "provider", "tracer")

    def __init__(self, tracer: Tracer, provider: TracerProvider | None) -> None:
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        #: Ours to flush at exit (None: the application's own).
        self.provider = provider
        self.propagator: TextMapPropagator = TraceContextTextMapPropagator()
        self.kinds: dict[str, SpanKind] = {
            "internal": SpanKind.INTERNAL,
            "producer": SpanKind.PRODUCER,
            "consumer": SpanKind.CONSUMER,
            "client": SpanKind.CLIENT,
            "server": SpanKind.SERVER,
        }


#: None while tracing is off: the one thing every helper reads first.
_on: _On | None = None
_configured = False


def enabled() -> bool:
    """True when this process records spans."""
    return _on is not None


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the standard variables in `env` ask for traces (see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporter_names(env)
    if exporters:
        return exporters != ["none"]
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER", "")
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


def configure(service_name: str, env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on from the environment, once per process (later calls only answer);
    True when it is on. Never fails the process: a configuration asking for traces
    without the `otel` extra, or naming an exporter this project does not ship, is logged
    and leaves tracing off."""
    global _configured
    if _configured:
        return _on is not None
    _configured = True
    env = os.environ if env is None else env
    if not wanted(env):
        # Off, unless the application installed an SDK provider of its own: then the SDK
        # is imported already, and nothing is imported here to find out.
        sdk = sys.modules.get("opentelemetry.sdk.trace")
        if sdk is None:
            return False
        from opentelemetry import trace

        current = trace.get_tracer_provider()
        if not isinstance(current, sdk.TracerProvider):
            return False
        enable(current, owned=False)
        return True
    try:
        from opentelemetry import trace

        provider = _provider_from_env(service_name, env)
    except ImportError:
        log.warning(
            "OTEL_* asks for traces but the otel extra is not installed "
            "(pip install 'aip-hermes-worker[otel]'); tracing stays off"
        )
        return False
    if provider is None:
        return False
    trace.set_tracer_provider(provider)
    enable(provider)
    return True


def _provider_from_env(service_name: str, env: Mapping[str, str]) -> TracerProvider | None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    protocol = env.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol and protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not shipped: traces use http/protobuf",
                    protocol)  # fmt: skip
    exporters: list[SpanExporter] = []
    for name in _exporter_names(env) or ["otlp"]:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name != "none":
            log.warning("OTEL_TRACES_EXPORTER names %r, not shipped (otlp, console)", name)
    if not exporters:
        return None
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def enable(provider: TracerProvider, *, owned: bool = True) -> None:
    """Record spans through `provider` from now on (tests, and an application wiring its
    own); with `owned`, it is flushed and shut down at exit."""
    global _on, _configured
    _configured = True
    _on = _On(provider.get_tracer("aip-hermes-worker"), provider if owned else None)
    if owned:
        atexit.register(provider.shutdown)


def disable() -> None:
    """Tracing off again (tests); the provider is left to its owner."""
    global _on
    _on = None


# -- the helpers the rest of the code calls -------------------------------------------------


class _Off:
    """A no-op context manager, about twice as fast to enter as `contextlib.nullcontext`
    (two plain methods, no state): what a span costs while tracing is off."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


#: What every span helper returns while tracing is off: one shared, reentrant no-op.
NO_SPAN: contextlib.AbstractContextManager[None] = _Off()


def span(
    name: str,
    *,
    kind: str = "internal",
    attributes: Attributes | None = None,
    carrier: Mapping[str, str] | None = None,
    links_to: Sequence[Mapping[str, str]] = (),
) -> contextlib.AbstractContextManager[Span | None]:
    """A span around a block, current inside it; the shared no-op context when off.

    `carrier`: the headers whose trace this span continues (a consumed message); None
    continues the current one. `links_to`: headers of other traces this span is linked to
    (a takeover's earlier owner)."""
    on = _on
    if on is None:
        return NO_SPAN
    return _started(on, name, kind, attributes, carrier, links_to)


@contextlib.contextmanager
def _started(
    on: _On,
    name: str,
    kind: str,
    attributes: Attributes | None,
    carrier: Mapping[str, str] | None,
    links_to: Sequence[Mapping[str, str]],
) -> Iterator[Span]:
    from opentelemetry.trace import Link, get_current_span

    parent = on.propagator.extract(carrier) if carrier is not None else None
    links = []
    for headers in links_to:
        linked = get_current_span(on.propagator.extract(headers)).get_span_context()
        if linked.is_valid:
            links.append(Link(linked))
    with on.tracer.start_as_current_span(
        name, context=parent, kind=on.kinds[kind], attributes=attributes, links=links
    ) as current:
        yield current


def consuming(msg: Msg) -> contextlib.AbstractContextManager[Span | None]:
    """The consumer span of one delivery of `msg` (an Action, a delegation, a channel
    delivery), continuing the trace its headers carry; the shared no-op context when off."""
    on = _on
    if on is None:
        return NO_SPAN
    subject = msg.subject
    template = subject_template(subject)
    extra: dict[str, AttrValue] = {}
    with contextlib.suppress(Exception):  # a message from a core subscription has none
        extra["messaging.nats.delivery_count"] = msg.metadata.num_delivered
        extra["messaging.consumer.group.name"] = msg.metadata.consumer or ""
    carrier = msg.headers or {}
    if TRACEPARENT not in carrier:
        carrier = envelope_trace(msg.data) or carrier
    return _started(
        on,
        f"process {template}",
        "consumer",
        messaging("process", subject, template, extra),
        carrier,
        (),
    )


def envelope_trace(data: bytes) -> dict[str, str] | None:
    """The W3C context an AIP Envelope carries in its `trace` (what `worker.wire.envelopes`
    writes when it seals under a span), for a message whose headers have none: a publisher
    that sets only the Envelope's field, or a hop that dropped the headers. Read only while
    tracing is on; anything that is not such an Envelope reads as None."""
    try:
        trace = _ENVELOPE_TRACE.decode(data).trace
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if trace is None or not isinstance(trace.get(TRACEPARENT), str):
        return None
    return {k: v for k, v in trace.items() if k in (TRACEPARENT, TRACESTATE) and isinstance(v, str)}


def producing(
    subject: str,
    headers: MutableMapping[str, str],
    extra: Attributes | None = None,
) -> contextlib.AbstractContextManager[Span | None]:
    """A producer span named `publish {template}` around one publish to `subject`, its
    context written into `headers` (what the consumer continues); no-op when off, before
    the subject's template is worked out."""
    on = _on
    if on is None:
        return NO_SPAN
    return _producing(on, subject, headers, extra)


@contextlib.contextmanager
def _producing(
    on: _On,
    subject: str,
    headers: MutableMapping[str, str],
    extra: Attributes | None,
) -> Iterator[Span]:
    template = subject_template(subject)
    attributes = messaging("publish", subject, template, extra)
    with _started(on, f"publish {template}", "producer", attributes, None, ()) as current:
        inject(headers)
        yield current


def subject_template(subject: str) -> str:
    """`subject` with its variable tokens named (`aip.hermes.{endpoint}.actions`,
    `aip.hermes.{endpoint}.chunks.{action_id}`): the low-cardinality name of a span and
    its `messaging.destination.template`; another executor's subject as it is."""
    parts = subject.split(".")
    if "hermes" not in parts[:-1]:
        return subject
    at = parts.index("hermes") + 1
    parts[at] = "{endpoint}"
    if len(parts) > at + 2 and parts[at + 1] in ("chunks", "results", "audit", "inbound"):
        parts[at + 2] = "{action_id}" if parts[at + 1] != "inbound" else "{session_id}"
    return ".".join(parts)


def start(
    name: str,
    *,
    kind: str = "internal",
    attributes: Attributes | None = None,
    parent: Span | None = None,
) -> Span | None:
    """A span started now under the current one (or under `parent`) and not made current
    (it outlives the block that starts it: a chunk batch, a run's agent span); end it with
    `end`. None when off."""
    on = _on
    if on is None:
        return None
    context = None
    if parent is not None:
        from opentelemetry.trace import set_span_in_context

        context = set_span_in_context(parent)
    return on.tracer.start_span(name, context=context, kind=on.kinds[kind], attributes=attributes)


def end(
    span: Span | None, *, attributes: Attributes | None = None, error: str | None = None
) -> None:
    """End a span from `start` (None: nothing), with what is known only at its end."""
    if span is None:
        return
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        failed(span, error)
    span.end()


def failed(current: Span | None, error: str) -> None:
    """Mark a span from `span` as failed with `error.type` (a class or code name)."""
    if current is None:
        return
    from opentelemetry.trace import Status, StatusCode

    current.set_attribute("error.type", error)
    current.set_status(Status(StatusCode.ERROR))


def annotate(attributes: Attributes, *, error: str | None = None) -> None:
    """Add what is known at the end of a step to the current span (with `error`: failed)."""
    on = _on
    if on is None:
        return
    from opentelemetry.trace import get_current_span

    current = get_current_span()
    current.set_attributes(attributes)
    if error is not None:
        failed(current, error)


def inject(headers: MutableMapping[str, str], of: Span | None = None) -> None:
    """Write the current trace context (or `of`'s) into `headers`; nothing when off."""
    on = _on
    if on is None:
        return
    if of is None:
        on.propagator.inject(headers)
    else:
        from opentelemetry.trace import set_span_in_context

        on.propagator.inject(headers, context=set_span_in_context(of))


def headers_of(of: Span | None) -> dict[str, str] | None:
    """`of`'s trace context as headers, computed once for many messages (a chunk batch);
    None when off or without a span."""
    if of is None:
        return None
    carrier: dict[str, str] = {}
    inject(carrier, of)
    return carrier


def trace_context(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The W3C trace headers among `headers` (what a redelivery's link points at)."""
    if not headers:
        return {}
    return {name: headers[name] for name in (TRACEPARENT, TRACESTATE) if name in headers}


def log_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span as hex, for a log line; None when off or
    outside a span."""
    on = _on
    if on is None:
        return None
    from opentelemetry.trace import get_current_span

    context = get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def messaging(
    operation: str, subject: str, template: str, extra: Attributes | None = None
) -> dict[str, AttrValue]:
    """The messaging semantic-convention attributes of a NATS span: `operation` is
    `publish`, `send`, `receive` or `process`; `template` is the subject with its variable
    parts named (`aip.hermes.{endpoint}.results.{action_id}`), the low-cardinality name."""
    return {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": operation,
        "messaging.destination.name": subject,
        "messaging.destination.template": template,
        **(extra or {}),
    }
