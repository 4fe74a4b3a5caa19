"""Where the chunks of a streaming Action go: its `callback` (aip-1.0-wire.md §1.2, §3.5),
one delivery per callback profile.

A binding answers a streaming Action with its final `action_result`; the chunks travel
beside that answer, each a signed `aip.core.v1.stream_chunk` Envelope, to the Action's
callback. Which callback profiles are served is the binding's choice, so the delivery is a
small interface: a `SinkFactory` per profile turns the Action's `Callback` and the binding's
`Sealer` (how one StreamChunk body becomes its signed, correlated Envelope) into a
`ChunkSink` (worker/gateway/chunk_follower.py, which decides what is released and when), or
refuses the target before anything runs. worker/gateway/aip_answers.py picks the factory by
`callback.profile`; the native NATS binding registers `aip.native.nats.v1`
(`NatsCallbackSinks`). The connector host's sink to the central callback is
worker/gateway/connector_stream.py.

`aip.native.nats.v1` delivery (§3.5): the Envelope published as a TransportMessage
`{"envelope": …}` with the `AIP-*` headers on the target subject, over the gateway's own
NATS connection. The target is a subject, or a `nats:` URL without a host whose path's
slashes become dots (`nats:///sub/ject` → `sub.ject`); a URL naming a host is refused (the
gateway connects to no other server on a requester's word). Refused as well: wildcards and
malformed subjects, `$`-subjects (JetStream API, system), the bus's own subjects (the
`{prefix}.` namespace, `aip.v1.…` binding subjects excepted, and every route's subject
prefix, where gateway-signed Envelopes could be taken for the bus's traffic) and this
binding's own request subjects (except its `….stream.` subjects, the reference's stream
subject helper).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from nats.aio.client import Client as NATS

from schemas.aip.action import Callback
from schemas.errors import ErrorCategory
from worker.aip.canonical import loads
from worker.errors import NativeRefusal
from worker.gateway.chunk_follower import ChunkSink

#: The code a callback the binding will not deliver to is refused with (an invalid Action
#: for this gateway: §2.6's `action.invalid_input`, permanent).
CALLBACK_REFUSED: Final = "action.invalid_input"
#: The native binding's subject grammar (`aip.v1.{td}.{service}.{version}.…`): not the
#: bus's even when the bus's prefix is `aip`.
AIP_BINDING_ROOT: Final = "aip.v1"
#: A subject's bound (the reference's subjects are far shorter).
MAX_SUBJECT_CHARS: Final = 512


#: One StreamChunk body as the binding's signed `stream_chunk` Envelope (canonical bytes).
Sealer = Callable[[Mapping[str, Any]], bytes]
#: Turns an Action's callback into its sink, or raises `NativeRefusal` for a target the
#: binding will not deliver to (before the Action is enqueued).
SinkFactory = Callable[[Callback, Sealer], ChunkSink]


def refused(reason: str) -> NativeRefusal:
    return NativeRefusal(CALLBACK_REFUSED, reason, ErrorCategory.PERMANENT)


def answer_headers(envelope: Mapping[str, object]) -> dict[str, str]:
    """The `AIP-*` headers of an Envelope a binding sends (§3.1)."""
    headers = {
        "AIP-Version": str(envelope["aip_version"]),
        "AIP-Message-Type": str(envelope["message_type"]),
        "AIP-Message-Id": str(envelope["message_id"]),
    }
    for header, field in (
        ("AIP-Session-Id", "session_id"),
        ("AIP-Correlation-Id", "correlation_id"),
    ):
        value = envelope.get(field)
        if isinstance(value, str):
            headers[header] = value
    return headers


def transport_message(envelope: bytes) -> tuple[bytes, dict[str, str]]:
    """The TransportMessage carrying `envelope` and its `AIP-*` headers (§3.1)."""
    document = loads(envelope)
    assert isinstance(document, dict)
    return b'{"envelope":' + envelope + b"}", answer_headers(document)


class NatsSubjectSink:
    """Publishes each chunk, sealed by the binding, on one subject of the gateway's NATS
    connection."""

    def __init__(self, nc: NATS, subject: str, seal: Sealer) -> None:
        self.nc = nc
        self.subject = subject
        self.seal = seal

    async def send(self, chunk: Mapping[str, Any]) -> None:
        payload, headers = transport_message(self.seal(chunk))
        await self.nc.publish(self.subject, payload, headers=headers)


def _is_subject(subject: str) -> bool:
    if not 0 < len(subject) <= MAX_SUBJECT_CHARS:
        return False
    tokens = subject.split(".")
    return all(
        token and token not in ("*", ">") and not any(c.isspace() for c in token)
        for token in tokens
    )


def _under(subject: str, prefix: str) -> bool:
    return subject == prefix or subject.startswith(prefix + ".")


class NatsCallbackSinks:
    """The `aip.native.nats.v1` SinkFactory: checks the target, then a `NatsSubjectSink`."""

    def __init__(
        self,
        nc: NATS,
        *,
        bus_prefix: str,
        route_prefixes: Iterable[str],
        binding_subject: str,
    ) -> None:
        self.nc = nc
        #: The bus's namespace (`AIPD_SUBJECT_PREFIX`) and every route's subject prefix.
        self.bus_prefix = bus_prefix
        self.route_prefixes = tuple(route_prefixes)
        #: `aip.v1.{td}.{service}.{version}`: this binding's request subjects.
        self.binding_subject = binding_subject

    def subject_of(self, target: str) -> str:
        """The subject `target` names, or `NativeRefusal` (see the module docstring)."""
        subject = target
        if target.startswith("nats:"):
            rest = target[len("nats:") :]
            if not rest.startswith("///"):
                raise refused(
                    "a nats: callback must name no host (nats:///sub/ject): chunks are "
                    "published on this gateway's NATS only"
                )
            subject = rest[3:].strip("/").replace("/", ".")
        if not _is_subject(subject):
            raise refused(
                "callback.target is not a NATS subject (non-empty tokens, no wildcards or "
                f"spaces, at most {MAX_SUBJECT_CHARS} characters)"
            )
        if subject.startswith("$"):
            raise refused("callback.target may not be a $-subject")
        if _under(subject, self.binding_subject):
            if not _under(subject, f"{self.binding_subject}.stream"):
                raise refused(
                    "callback.target may not be one of this binding's request subjects (its "
                    "….stream.{correlation_id} subjects are allowed)"
                )
            return subject
        if any(_under(subject, prefix) for prefix in self.route_prefixes) or (
            _under(subject, self.bus_prefix) and not _under(subject, AIP_BINDING_ROOT)
        ):
            raise refused("callback.target may not be one of the bus's own subjects")
        return subject

    def __call__(self, callback: Callback, seal: Sealer) -> ChunkSink:
        return NatsSubjectSink(self.nc, self.subject_of(callback.target), seal)
