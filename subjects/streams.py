"""Stream and consumer definitions: what `provision` creates and workers bind to."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from subjects.grammar import Subjects

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class StreamPolicy:
    """Operator-tunable stream settings; the defaults are DESIGN §3's."""

    replicas: int = 1
    duplicate_window_s: float = 120.0
    chunks_max_age_s: float = DAY_S
    results_max_age_s: float = DAY_S
    dlq_max_age_s: float = 30 * DAY_S
    audit_max_age_s: float = 90 * DAY_S
    #: AckWait of the work consumers. The heartbeat calls `in_progress()` every third of the
    #: lease TTL, so AckWait only has to outlast one missed heartbeat, not a whole run.
    ack_wait_s: float = 30.0
    max_ack_pending: int = 20_000
    extra: dict[str, str] = field(default_factory=dict)


def stream_configs(
    subjects: Subjects, policy: StreamPolicy, endpoint_ids: list[str]
) -> list[StreamConfig]:
    """Every stream of DESIGN §3, in creation order.

    The work queues bind the subjects of `endpoint_ids` only, never `aip.hermes.*.actions`:
    no consumer would ever take an Action stored for an endpoint no worker serves (nor one
    published on the literal subject `aip.hermes.*.actions`), and a work queue keeps what no
    consumer takes forever. Not binding such a subject means the publish itself fails
    (`no response from stream`): the publisher learns at once, and nothing is kept.
    `provision` adds to the subjects a stream already binds, so pools that serve different
    endpoints do not undo each other.
    """
    if not endpoint_ids:
        raise ValueError("the work-queue streams need at least one endpoint id")

    def work(kind: str, endpoint_subjects: list[str]) -> StreamConfig:
        return StreamConfig(
            name=subjects.stream_name(kind),
            subjects=endpoint_subjects,
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=policy.replicas,
            duplicate_window=policy.duplicate_window_s,
            discard=DiscardPolicy.OLD,
        )

    def limits(kind: str, subject: str, max_age_s: float) -> StreamConfig:
        return StreamConfig(
            name=subjects.stream_name(kind),
            subjects=[subject],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=policy.replicas,
            duplicate_window=policy.duplicate_window_s,
            max_age=max_age_s,
            discard=DiscardPolicy.OLD,
        )

    return [
        work("actions", [subjects.actions(e) for e in endpoint_ids]),
        work("delegations", [subjects.delegations(e) for e in endpoint_ids]),
        limits("chunks", subjects.all_chunks(), policy.chunks_max_age_s),
        limits("results", subjects.all_results(), policy.results_max_age_s),
        limits("dlq", subjects.all_dlq(), policy.dlq_max_age_s),
        limits("audit", subjects.all_audit(), policy.audit_max_age_s),
    ]


def runtime_store_configs(subjects: Subjects, policy: StreamPolicy) -> list[StreamConfig]:
    """The AIP runtime's queue and lifecycle streams (schemas/lifecycle.py).

    They belong to the runtime, not to the workers: `provision` creates them only when asked
    (`--runtime-stores`), for a deployment or a test whose runtime does not bring its own.
    One record per Action id and subject is enough: the resolver reads the last one.
    """
    return [
        StreamConfig(
            name=subjects.runtime_stream_name(kind),
            subjects=[subject],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=policy.replicas,
            duplicate_window=policy.duplicate_window_s,
            max_age=policy.results_max_age_s,
            max_msgs_per_subject=16,
            discard=DiscardPolicy.OLD,
        )
        for kind, subject in (
            ("queue", subjects.all_runtime_queue()),
            ("lifecycle", subjects.all_runtime_lifecycle()),
        )
    ]


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    stream: str
    config: ConsumerConfig


def consumer_specs(
    subjects: Subjects, endpoint_ids: list[str], policy: StreamPolicy
) -> list[ConsumerSpec]:
    """One durable pull consumer per endpoint and kind, shared by every worker."""
    specs = []
    for endpoint_id in endpoint_ids:
        for kind, subject in (
            ("actions", subjects.actions(endpoint_id)),
            ("delegations", subjects.delegations(endpoint_id)),
        ):
            specs.append(
                ConsumerSpec(
                    stream=subjects.stream_name(kind),
                    config=ConsumerConfig(
                        durable_name=subjects.durable(endpoint_id, kind),
                        filter_subject=subject,
                        ack_policy=AckPolicy.EXPLICIT,
                        deliver_policy=DeliverPolicy.ALL,
                        ack_wait=policy.ack_wait_s,
                        # Unlimited: a delivery nak'd as a duplicate must come back until the
                        # stored result lets some worker ack it; dropping it would lose work.
                        max_deliver=-1,
                        max_ack_pending=policy.max_ack_pending,
                        num_replicas=0,
                    ),
                )
            )
    return specs
