"""Create or update the streams and consumers idempotently.

Running it twice changes nothing. A stream that exists with a setting that cannot be changed
in place (retention, storage, or subjects another stream owns) is reported as a conflict and
left alone: replacing it would delete its messages, which is an operator's decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, StreamConfig
from nats.js.errors import NotFoundError

from subjects.grammar import Subjects
from subjects.streams import StreamPolicy, consumer_specs, stream_configs


class Change(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class ProvisionItem:
    kind: str  # "stream" or "consumer"
    name: str
    change: Change
    detail: str = ""


#: Stream fields we own and may update in place.
_STREAM_UPDATABLE = ("duplicate_window", "max_age", "discard", "subjects")
#: Stream fields that cannot change without recreating the stream.
_STREAM_FIXED = ("retention", "storage")
_CONSUMER_COMPARED = ("filter_subject", "ack_policy", "ack_wait", "max_deliver", "max_ack_pending")
_CONSUMER_FIXED = ("filter_subject", "ack_policy", "deliver_policy")


def _differs(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a or 0) - float(b or 0)) > 1e-3  # type: ignore[arg-type]
    return a != b


async def provision_stream(js: JetStreamContext, wanted: StreamConfig) -> ProvisionItem:
    assert wanted.name is not None
    try:
        info = await js.stream_info(wanted.name)
    except NotFoundError:
        await js.add_stream(wanted)
        return ProvisionItem("stream", wanted.name, Change.CREATED)
    have = info.config
    fixed = [f for f in _STREAM_FIXED if _differs(getattr(have, f), getattr(wanted, f))]
    if fixed:
        return ProvisionItem(
            "stream",
            wanted.name,
            Change.CONFLICT,
            "existing stream differs in " + ", ".join(fixed) + " (not replaced)",
        )
    changed = [f for f in _STREAM_UPDATABLE if _differs(getattr(have, f), getattr(wanted, f))]
    if have.num_replicas != wanted.num_replicas:
        changed.append("num_replicas")
    if not changed:
        return ProvisionItem("stream", wanted.name, Change.UNCHANGED)
    await js.update_stream(wanted)
    return ProvisionItem("stream", wanted.name, Change.UPDATED, "changed " + ", ".join(changed))


async def provision_consumer(
    js: JetStreamContext, stream: str, wanted: ConsumerConfig
) -> ProvisionItem:
    assert wanted.durable_name is not None
    name = f"{stream}/{wanted.durable_name}"
    try:
        info = await js.consumer_info(stream, wanted.durable_name)
    except NotFoundError:
        await js.add_consumer(stream, wanted)
        return ProvisionItem("consumer", name, Change.CREATED)
    have = info.config
    fixed = [f for f in _CONSUMER_FIXED if _differs(getattr(have, f), getattr(wanted, f))]
    if fixed:
        return ProvisionItem(
            "consumer", name, Change.CONFLICT, "differs in " + ", ".join(fixed) + " (not replaced)"
        )
    changed = [f for f in _CONSUMER_COMPARED if _differs(getattr(have, f), getattr(wanted, f))]
    if not changed:
        return ProvisionItem("consumer", name, Change.UNCHANGED)
    await js.add_consumer(stream, wanted)  # same durable name: the server updates it in place
    return ProvisionItem("consumer", name, Change.UPDATED, "changed " + ", ".join(changed))


async def provision(
    js: JetStreamContext,
    subjects: Subjects,
    endpoint_ids: list[str],
    policy: StreamPolicy | None = None,
) -> list[ProvisionItem]:
    """Bring every stream and consumer to the wanted shape; returns what happened to each."""
    policy = policy or StreamPolicy()
    report = [await provision_stream(js, cfg) for cfg in stream_configs(subjects, policy)]
    conflicted = {item.name for item in report if item.change is Change.CONFLICT}
    for spec in consumer_specs(subjects, endpoint_ids, policy):
        if spec.stream in conflicted:
            continue
        report.append(await provision_consumer(js, spec.stream, spec.config))
    return report
