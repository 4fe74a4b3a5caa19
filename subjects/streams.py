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
MIB = 1_048_576
GIB = 1024 * MIB


@dataclass(frozen=True, slots=True)
class StreamPolicy:
    """Operator-tunable stream settings; the defaults are docs/architecture.md §3's.

    Every stream has a byte limit, so whoever may publish cannot fill the server's JetStream
    storage (and starve every other stream) through one of them. The work queues and the
    DLQ refuse new messages when full (`discard: new`): dropping the oldest queued Action or
    the oldest evidence silently would be worse than a publisher seeing the refusal. Chunks,
    results and receipts are bounded histories and drop their oldest entries first.

    JetStream reserves each stream's `max_bytes` (times its replicas) against the server's
    `max_file_store` (and the account's `max_file`) when the stream is created, so the
    defaults add up to 9.0 GiB (9.25 with the runtime stores): they fit the compose
    server's 10 GB, which `provision` checks (docs/scaling.md, "Stream sizes").
    """

    replicas: int = 1
    duplicate_window_s: float = 120.0
    #: The DLQ's own duplicate window, a day: an entry written again from a stored result
    #: (worker/pipeline/exhausted.py: a redelivery republishes what a settle owed) may come
    #: long after the first, when the result's publication failed for minutes (a full
    #: results stream); entries are rare, so remembering their ids for a day costs little.
    dlq_duplicate_window_s: float = DAY_S
    chunks_max_age_s: float = DAY_S
    results_max_age_s: float = DAY_S
    dlq_max_age_s: float = 30 * DAY_S
    audit_max_age_s: float = 90 * DAY_S
    actions_max_bytes: int = GIB
    actions_max_msgs: int = 1_000_000
    delegations_max_bytes: int = 256 * MIB
    delegations_max_msgs: int = 250_000
    chunks_max_bytes: int = 3 * GIB
    results_max_bytes: int = GIB
    dlq_max_bytes: int = 256 * MIB
    dlq_max_msgs: int = 100_000
    audit_max_bytes: int = 2 * GIB
    #: Each of the AIP runtime's queue and lifecycle streams (`--runtime-stores` only).
    runtime_max_bytes: int = 128 * MIB
    escalations_max_age_s: float = 30 * DAY_S
    escalations_max_bytes: int = 256 * MIB
    egress_max_bytes: int = 256 * MIB
    egress_max_msgs: int = 250_000
    inbound_max_age_s: float = 7 * DAY_S
    inbound_max_bytes: int = GIB
    #: AckWait of the work consumers. The heartbeat calls `in_progress()` every third of the
    #: lease TTL, so AckWait only has to outlast one missed heartbeat, not a whole run.
    ack_wait_s: float = 30.0
    max_ack_pending: int = 20_000
    extra: dict[str, str] = field(default_factory=dict)


def stream_configs(
    subjects: Subjects, policy: StreamPolicy, endpoint_ids: list[str]
) -> list[StreamConfig]:
    """Every stream of docs/architecture.md §3, in creation order.

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

    def work(
        kind: str, endpoint_subjects: list[str], max_bytes: int, max_msgs: int
    ) -> StreamConfig:
        return StreamConfig(
            name=subjects.stream_name(kind),
            subjects=endpoint_subjects,
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=policy.replicas,
            duplicate_window=policy.duplicate_window_s,
            max_bytes=max_bytes,
            max_msgs=max_msgs,
            discard=DiscardPolicy.NEW,
        )

    def limits(
        kind: str,
        subject: str | list[str],
        max_age_s: float,
        max_bytes: int,
        max_msgs: int = -1,
        discard: DiscardPolicy = DiscardPolicy.OLD,
        duplicate_window_s: float = policy.duplicate_window_s,
    ) -> StreamConfig:
        return StreamConfig(
            name=subjects.stream_name(kind),
            subjects=[subject] if isinstance(subject, str) else subject,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=policy.replicas,
            duplicate_window=duplicate_window_s,
            max_age=max_age_s,
            max_bytes=max_bytes,
            max_msgs=max_msgs,
            discard=discard,
        )

    p = policy
    return [
        work(
            "actions", [subjects.actions(e) for e in endpoint_ids], p.actions_max_bytes,
            p.actions_max_msgs,
        ),
        work(
            "delegations", [subjects.delegations(e) for e in endpoint_ids],
            p.delegations_max_bytes, p.delegations_max_msgs,
        ),
        work(
            "egress", [subjects.egress(e) for e in endpoint_ids], p.egress_max_bytes,
            p.egress_max_msgs,
        ),
        limits("chunks", subjects.all_chunks(), p.chunks_max_age_s, p.chunks_max_bytes),
        limits("results", subjects.all_results(), p.results_max_age_s, p.results_max_bytes),
        # Evidence is kept, not rotated: when full, the newest refusals are the ones not
        # kept (the worker counts them), so a flood cannot push the first entries out.
        limits(
            "dlq", subjects.all_dlq(), p.dlq_max_age_s, p.dlq_max_bytes, p.dlq_max_msgs,
            DiscardPolicy.NEW, max(p.dlq_duplicate_window_s, p.duplicate_window_s),
        ),
        limits("audit", subjects.all_audit(), p.audit_max_age_s, p.audit_max_bytes),
        limits(
            "escalations", subjects.all_escalations(), p.escalations_max_age_s,
            p.escalations_max_bytes,
        ),
        limits("inbound", subjects.all_inbound(), p.inbound_max_age_s, p.inbound_max_bytes),
    ]


def runtime_store_configs(subjects: Subjects, policy: StreamPolicy) -> list[StreamConfig]:
    """The AIP runtime's queue and lifecycle streams (schemas/lifecycle.py), and the
    gateway's index of open children.

    They belong to the runtime, not to the workers: `provision` creates them only when asked
    (`--runtime-stores`), for a deployment or a test whose runtime does not bring its own.
    One record per Action id and subject is enough: the resolver reads the last one.
    The open index keeps one message per shard (the current set), never expiring: a child
    stays open as long as its shard says so (worker/gateway/open_children.py).
    """
    records = [
        StreamConfig(
            name=subjects.runtime_stream_name(kind),
            subjects=[subject],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=policy.replicas,
            duplicate_window=policy.duplicate_window_s,
            max_age=policy.results_max_age_s,
            max_bytes=policy.runtime_max_bytes,
            max_msgs_per_subject=16,
            discard=DiscardPolicy.OLD,
        )
        for kind, subject in (
            ("queue", subjects.all_runtime_queue()),
            ("lifecycle", subjects.all_runtime_lifecycle()),
        )
    ]
    open_index = StreamConfig(
        name=subjects.runtime_stream_name("open"),
        subjects=[subjects.all_runtime_open()],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        num_replicas=policy.replicas,
        max_bytes=policy.runtime_max_bytes,
        max_msgs_per_subject=1,
        discard=DiscardPolicy.OLD,
    )
    return [*records, open_index]


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
            ("egress", subjects.egress(endpoint_id)),
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
