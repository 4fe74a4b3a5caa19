"""Create or update the streams and consumers idempotently.

Running it twice changes nothing. A stream that exists with a setting that cannot be changed
in place (retention, storage, or subjects another stream owns) is reported as a conflict and
left alone: replacing it would delete its messages, which is an operator's decision.

Before anything is created, `check_store` adds up what the streams reserve (each stream's
`max_bytes` times its replicas, which JetStream sets aside against the store when the stream
is created) and compares it with the account's JetStream storage limit less what the
account's other streams reserve: a store that cannot hold the limits is named with its
shortfall before any stream is made, instead of a disk that fills under load
(docs/operations.md, "Full disk").

On a NATS cluster the report also says where each stream lives (its raft leader and
replicas, and whether each replica is current): after `provision` an operator can see at
once that a stream asked for three replicas really has three, and which node a leader loss
would hit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from enum import StrEnum

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from subjects.grammar import Subjects
from subjects.streams import StreamPolicy, consumer_specs, runtime_store_configs, stream_configs


class Change(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class Peer:
    """One replica of a clustered stream, as the stream leader sees it."""

    name: str
    current: bool
    offline: bool


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a clustered stream lives: its raft leader and the other replicas."""

    leader: str | None
    replicas: tuple[Peer, ...]

    @property
    def size(self) -> int:
        return len(self.replicas) + (1 if self.leader else 0)

    def settled(self, replicas: int) -> bool:
        """A leader, every wanted replica placed, and each of them current."""
        return (
            self.leader is not None
            and self.size >= replicas
            and all(p.current and not p.offline for p in self.replicas)
        )

    def describe(self) -> str:
        peers = " ".join(p.name + _peer_note(p) for p in self.replicas)
        return f"leader {self.leader or 'none'}; replicas {peers or 'none'}"


def _peer_note(peer: Peer) -> str:
    if peer.offline:
        return " (offline)"
    return "" if peer.current else " (behind)"


@dataclass(frozen=True, slots=True)
class ProvisionItem:
    kind: str  # "stream" or "consumer"
    name: str
    change: Change
    detail: str = ""
    #: Streams on a NATS cluster only (None on a single server or for consumers).
    placement: Placement | None = None

    def describe(self) -> str:
        """One report line, as `aip-hermes-worker provision` prints it."""
        notes = [n for n in (self.detail, self.placement and self.placement.describe()) if n]
        return f"{self.kind:8} {self.name:48} {self.change.value}" + "".join(
            f"  ({note})" for note in notes
        )


#: Stream fields we own and may update in place.
_STREAM_UPDATABLE = (
    "duplicate_window", "max_age", "max_bytes", "max_msgs", "discard", "subjects",
)
#: Stream fields that cannot change without recreating the stream.
_STREAM_FIXED = ("retention", "storage")
_CONSUMER_COMPARED = ("filter_subject", "ack_policy", "ack_wait", "max_deliver", "max_ack_pending")
_CONSUMER_FIXED = ("filter_subject", "ack_policy", "deliver_policy")


def _differs(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a or 0) - float(b or 0)) > 1e-3  # type: ignore[arg-type]
    return a != b


async def provision_stream(js: JetStreamContext, wanted: StreamConfig) -> ProvisionItem:
    name = wanted.name
    assert name is not None
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await _add_stream(js, wanted)
        return ProvisionItem("stream", name, Change.CREATED)
    have = info.config
    if wanted.retention is RetentionPolicy.WORK_QUEUE:
        wanted = replace(wanted, subjects=_work_subjects(have.subjects, wanted.subjects))
    fixed = [f for f in _STREAM_FIXED if _differs(getattr(have, f), getattr(wanted, f))]
    if fixed:
        return ProvisionItem(
            "stream",
            name,
            Change.CONFLICT,
            "existing stream differs in " + ", ".join(fixed) + " (not replaced)",
        )
    changed = [f for f in _STREAM_UPDATABLE if _differs(getattr(have, f), getattr(wanted, f))]
    if have.num_replicas != wanted.num_replicas:
        changed.append("num_replicas")
    if not changed:
        return ProvisionItem("stream", name, Change.UNCHANGED)
    await js.update_stream(wanted)
    return ProvisionItem("stream", name, Change.UPDATED, "changed " + ", ".join(changed))


#: JetStream's "error creating store for stream" (a 500): the server could not make the
#: stream's directory.
STORE_NOT_CREATED = 10049
#: The waits before each new attempt at a stream whose store was not created (~1.5 s in all).
STORE_RETRY_WAITS_S = (0.1, 0.2, 0.4, 0.8)
#: JetStream's "no suitable peers for placement" (a 400), and the reason among its reasons
#: that a cluster still forming gives.
NO_PEERS_FOR_PLACEMENT = 10005
PEER_OFFLINE = "peer offline"
#: The waits before each new attempt at a stream no peer could be placed on for an offline
#: peer (~7.75 s in all).
PLACEMENT_RETRY_WAITS_S = (0.25, 0.5, 1.0, 2.0, 4.0)


def _retry_waits(exc: APIError) -> tuple[float, ...]:
    """The waits `_add_stream` allows for this refusal: none for one that stays."""
    if exc.err_code == STORE_NOT_CREATED:
        return STORE_RETRY_WAITS_S
    if exc.err_code == NO_PEERS_FOR_PLACEMENT and PEER_OFFLINE in (exc.description or ""):
        return PLACEMENT_RETRY_WAITS_S
    return ()


async def _add_stream(js: JetStreamContext, wanted: StreamConfig) -> None:
    """`add_stream`, tried again a few times for the two refusals that pass by themselves.

    - **The store directory could not be made** (500 / 10049). A stream created right after
      an account's last stream was deleted can find the account's directory gone under it
      (nats-server 2.9.10 removes it with the last stream): "could not create storage
      directory - mkdir …/jetstream/$G/streams: no such file or directory" in the server's
      log. Seen once in the benchmark's wipe on 2.15.1 (BENCHMARKS.md); every test's
      clean-up and that wipe delete all streams and then provision again. The next attempt
      finds the directory consistent (2.15.1 also cleans up after a failed creation).
    - **No peer could be placed because one is offline** (400 / 10005, "no suitable peers
      for placement, peer offline"). Right after a cluster forms, its meta leader can still
      count a peer offline until that peer's first report reaches it: seen on 2.15.1 in a
      clean-clone CI run, where `provision --stream-replicas 3` ran the moment every node agreed
      on the leader. A deployment that provisions as soon as its cluster is up does the
      same.

    Anything else is raised at once, including the placement refusals that stay (tags not
    matched, too little storage); a store that stays uncreatable (a read-only disk) after
    ~1.5 s, and a peer that stays offline after ~7.75 s.
    """
    attempt = 0
    while True:
        try:
            await js.add_stream(wanted)
            return
        except APIError as exc:
            waits = _retry_waits(exc)
            if attempt >= len(waits):
                raise
            wait_s = waits[attempt]
        attempt += 1
        await asyncio.sleep(wait_s)


def _work_subjects(have: list[str] | None, wanted: list[str] | None) -> list[str]:
    """The endpoints' subjects a work queue binds already plus the wanted ones, in order; a
    wildcard (what streams bound before) is dropped, so nothing unserved is stored again."""
    kept = [s for s in have or () if "*" not in s.split(".") and ">" not in s.split(".")]
    return kept + [s for s in wanted or () if s not in kept]


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


async def stream_placement(
    js: JetStreamContext, name: str, replicas: int, wait_s: float = 10.0
) -> Placement | None:
    """The stream's leader and replicas once it is settled (a leader elected, all `replicas`
    placed and current: a new stream's peers catch up within a heartbeat or two), or as
    they are at `wait_s`, so a replica still behind then is reported as such.
    None when the server is not clustered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        cluster = (await js.stream_info(name)).cluster
        if cluster is None or (cluster.leader is None and not cluster.replicas and replicas == 1):
            return None
        placement = Placement(
            leader=cluster.leader,
            replicas=tuple(
                Peer(p.name or "?", bool(p.current), bool(p.offline))
                for p in cluster.replicas or ()
            ),
        )
        if placement.settled(replicas) or loop.time() >= deadline:
            return placement
        await asyncio.sleep(0.1)


GIB = 1024**3


@dataclass(frozen=True, slots=True)
class StoreCheck:
    """What the wanted streams reserve against the account's JetStream file store.

    `limit` is None when the account sets no storage limit (then only the server's own
    `max_file_store` bounds it, which the JetStream API does not show an account).
    """

    wanted: int
    reserved_by_others: int
    used: int
    limit: int | None

    @property
    def shortfall(self) -> int:
        """Bytes the store lacks to hold every reservation (0: it fits)."""
        if self.limit is None:
            return 0
        return max(0, self.wanted + self.reserved_by_others - self.limit)

    def describe(self) -> str:
        wanted = f"the streams reserve {self.wanted / GIB:.2f} GiB"
        if self.limit is None:
            return (
                f"store    {wanted}; the account sets no JetStream storage limit, so this "
                "could not be checked: give the account a `max_file` (compose/nats/nats.conf) "
                "no larger than the volume under store_dir"
            )
        others = (
            f" + {self.reserved_by_others / GIB:.2f} GiB other streams"
            if self.reserved_by_others
            else ""
        )
        verdict = (
            f"short by {self.shortfall / GIB:.2f} GiB: lower AIPD_STREAM_*_MAX_BYTES or raise "
            "the account's max_file (and the volume)"
            if self.shortfall
            else "fits"
        )
        return f"store    {wanted}{others} of the account's {self.limit / GIB:.2f} GiB: {verdict}"


def reservation(configs: list[StreamConfig]) -> int:
    """Bytes JetStream sets aside for `configs`: `max_bytes` times replicas, file storage."""
    return sum(
        max(0, cfg.max_bytes or 0) * max(1, cfg.num_replicas or 1)
        for cfg in configs
        if cfg.storage in (None, StorageType.FILE)
    )


async def check_store(js: JetStreamContext, wanted: list[StreamConfig]) -> StoreCheck:
    """Compare what `wanted` reserves with the account's storage limit (see `StoreCheck`)."""
    account = await js.account_info()
    names = {cfg.name for cfg in wanted}
    others = [info.config for info in await js.streams_info() if info.config.name not in names]
    limit = account.limits.max_storage if account.limits is not None else None
    return StoreCheck(
        wanted=reservation(wanted),
        reserved_by_others=reservation(others),
        used=int(account.storage or 0),
        limit=limit if limit is not None and limit > 0 else None,
    )


def wanted_streams(
    subjects: Subjects,
    endpoint_ids: list[str],
    policy: StreamPolicy | None = None,
    *,
    runtime_stores: bool = False,
) -> list[StreamConfig]:
    """Every stream `provision` brings to its wanted shape."""
    policy = policy or StreamPolicy()
    wanted = stream_configs(subjects, policy, endpoint_ids)
    if runtime_stores:
        wanted += runtime_store_configs(subjects, policy)
    return wanted


async def provision(
    js: JetStreamContext,
    subjects: Subjects,
    endpoint_ids: list[str],
    policy: StreamPolicy | None = None,
    *,
    runtime_stores: bool = False,
) -> list[ProvisionItem]:
    """Bring every stream and consumer to the wanted shape; returns what happened to each.

    `runtime_stores` also creates the AIP runtime's queue and lifecycle streams that the
    delegated-result resolver reads (for a runtime that does not create its own).
    """
    policy = policy or StreamPolicy()
    report = []
    wanted = wanted_streams(subjects, endpoint_ids, policy, runtime_stores=runtime_stores)
    for cfg in wanted:
        item = await provision_stream(js, cfg)
        if item.change is not Change.CONFLICT:
            placement = await stream_placement(js, item.name, policy.replicas)
            item = ProvisionItem(item.kind, item.name, item.change, item.detail, placement)
        report.append(item)
    conflicted = {item.name for item in report if item.change is Change.CONFLICT}
    for spec in consumer_specs(subjects, endpoint_ids, policy):
        if spec.stream in conflicted:
            continue
        report.append(await provision_consumer(js, spec.stream, spec.config))
    return report
