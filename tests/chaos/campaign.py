"""One campaign: deploy, run the workload through the seed's faults, heal, collect, check.

`run_campaign(seed, ...)` returns a `Report`; its `violations` are empty when every rule of
`tests.chaos.checker` held. On a violation `Report.explain()` prints the seed, the fault
schedule and the part of the history about the Action concerned (with the faults active
around it), and the same seed replays the same schedule and workload choices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nats
import nats.js.errors

from schemas.audit import Receipt
from schemas.ids import new_action_id
from tests.aip_wire import receipt_fields
from tests.chaos.checker import (
    APPROVAL,
    CHAT,
    START,
    STOP,
    Evidence,
    Request,
    Violation,
    check,
    decoded_result,
    late_chunks,
)
from tests.chaos.deployment import ENDPOINT, REAL_WORKERS, WORKERS, Deployment
from tests.chaos.history import Event, History
from tests.chaos.nemesis import FAKE, FILL_FILE, KINDS, REAL, Fault, Nemesis, schedule
from tests.chaos.workload import FAKE_MIX, REAL_MIX, Workload
from worker.bus.publisher import CHAIN_MAC_HEADER
from worker.errors import UnverifiedResponse
from worker.testing._errors import HermesUnavailable
from worker.testing.redis_server import redis_answers

log = logging.getLogger(__name__)

#: After the faults heal: how long every acknowledged Action has to get its result.
QUIESCE_S = 90.0


@dataclass
class Report:
    seed: int
    duration_s: float
    mutation: str | None
    faults: list[Fault]
    history: History
    violations: list[Violation]
    injected: dict[str, int]
    operations: int
    actions: int
    acked: int
    outcomes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    root: Path | None = None
    wall_s: float = 0.0
    evidence: Evidence | None = None
    #: The fault kinds the schedule was drawn with (`--kinds`): part of what replays it.
    kinds: tuple[str, ...] = KINDS
    #: `fake` or `real` (the deployment variant; part of what replays it).
    hermes: str = "fake"
    #: Requests that reached Hermes, by route template (the log the checker read).
    hermes_requests: dict[str, int] = field(default_factory=dict)
    #: Superseded owners' late chunks on the chunk streams (bug 2's worker side), which
    #: the reader keeps from a consumer, and how many of them a streaming reader passed on
    #: and then retracted (`checker.late_chunks`).
    late_chunks: int = 0
    retracted: int = 0

    @property
    def unknown(self) -> list[Violation]:
        """The violations that are not a known, reported bug: what fails a campaign."""
        return [v for v in self.violations if v.known is None]

    def rules(self) -> set[str]:
        return {v.rule for v in self.unknown}

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.injected.items()))
        known = len(self.violations) - len(self.unknown)
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return (
            f"seed {self.seed}{' (real Hermes)' if self.hermes == 'real' else ''}"
            f"{f' mutation {self.mutation}' if self.mutation else ''}: "
            f"{self.operations} operations, {self.actions} Actions ({self.acked} acked), "
            f"{sum(self.injected.values())} faults ({kinds}); outcomes: {outcomes}; "
            f"{len(self.unknown)} violations"
            f"{f' (+{known} of a known bug)' if known else ''}"
            f"{self._late()}; {self.wall_s:.0f}s"
        )

    def _late(self) -> str:
        if not self.late_chunks:
            return ""
        return (
            f"; {self.late_chunks} late chunks of superseded owners on the streams, kept from "
            f"the consumer by the reader ({self.retracted} retracted after being streamed)"
        )

    def traffic(self) -> str:
        """What reached Hermes, the routes the checker's rules count."""
        routes = (START, CHAT, APPROVAL, STOP)
        return ", ".join(f"{r} {self.hermes_requests.get(r, 0)}" for r in routes)

    def explain(self, limit: int = 3) -> str:
        lines = [
            self.summary(),
            "",
            self.reproduce(),
            "",
            "fault schedule:",
        ]
        lines += [f"  {f}" for f in self.faults]
        by_rule = Counter(f"{v.rule}{' (known)' if v.known else ''}" for v in self.violations)
        lines += ["", "violations by rule: " + ", ".join(f"{k} {n}" for k, n in by_rule.items())]
        for violation in self.violations[:limit]:
            lines += ["", f"VIOLATION {violation}"]
            lines += [f"  {e.line()}" for e in self._around(violation)]
            lines += self._evidence_of(violation.action_id)
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more violations")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def reproduce(self) -> str:
        """The command that replays this campaign: its seed, schedule length and kinds
        (the schedule is a pure function of the three) and its mutation."""
        return (
            f"reproduce: ./dev chaos --seed {self.seed} --minutes 0.1 "
            f"--schedule-s {self.duration_s:g} --kinds {','.join(self.kinds) or 'none'}"
            + (f" --hermes {self.hermes}" if self.hermes != "fake" else "")
            + (f" --mutation {self.mutation}" if self.mutation else "")
        )

    def _evidence_of(self, action_id: str | None) -> list[str]:
        """What the bus and Redis hold about the Action: receipts, lease, results."""
        ev = self.evidence
        if ev is None or action_id is None:
            return []
        lines = [f"  lease: {ev.leases.get(action_id)}"]
        lines += [
            f"  receipt {r.event.value} by {r.worker_id} fence {r.fence}"
            for r in ev.receipts.get(action_id, [])
        ]
        lines += [f"  result {raw[:300]!r}" for raw in ev.results.get(action_id, [])]
        starts = [r for r in ev.requests if action_id in json.dumps(r.body)]
        lines += [f"  hermes {r.route} at {r.at:.3f}" for r in starts]
        return lines

    def _around(self, violation: Violation) -> list[Event]:
        """The history of the Action, and the faults active during its life."""
        if violation.action_id is None:
            return []
        mine = self.history.about(violation.action_id)
        if not mine:
            return []
        first, last = mine[0].t - 1.0, mine[-1].t + 1.0
        faults = [
            e for e in self.history.events if e.type == "nemesis" and first - 10 <= e.t <= last
        ]
        return sorted(mine + faults, key=lambda e: e.t)


async def run_campaign(
    seed: int,
    duration_s: float,
    *,
    mutation: str | None = None,
    root: Path | None = None,
    keep: bool = False,
    kinds: tuple[str, ...] = KINDS,
    hermes: str = "fake",
) -> Report:
    """Run one seeded campaign of `duration_s` seconds of faults and workload, against the
    fake Hermes or (`hermes="real"`) the smaller real-Hermes variant (tests/chaos/
    deployment.py); the real one raises `HermesUnavailable` when it cannot be had."""
    started = time.monotonic()
    owned = root is None
    base = Path(tempfile.mkdtemp(prefix=f"aip-chaos-{seed}-")) if root is None else root
    real = hermes == "real"
    deployment = Deployment(
        base, mutation=mutation, hermes=hermes, worker_ids=REAL_WORKERS if real else WORKERS
    )
    history = History()
    try:
        await deployment.start()
        history = History()  # time 0 is when the deployment is up
        faults = schedule(
            seed,
            duration_s,
            disk=not deployment.disk_skip_reason,
            kinds=kinds,
            shape=REAL if real else FAKE,
        )
        assert deployment.stack is not None
        workload = Workload(
            deployment.stack,
            history,
            random.Random(f"workload-{seed}"),
            gateway_url=deployment.gateway_url,
            gateway_token=deployment.gateway_token,
            mix=REAL_MIX if real else FAKE_MIX,
        )
        nemesis = Nemesis(deployment, history, faults)
        if deployment.disk_skip_reason:
            nemesis.notes.append(f"full-disk faults skipped: {deployment.disk_skip_reason}")
        await asyncio.gather(workload.run(duration_s), nemesis.run())
        await heal_all(deployment, history)
        await quiesce(deployment, workload.acked, history)
        evidence = await collect(deployment, workload, history)
        violations = check(evidence)
        late, retracted = late_chunks(evidence)
        outcomes: Counter[str] = Counter()
        for copies in evidence.results.values():
            for raw in set(copies):
                result = decoded_result(raw)
                if result is None:
                    outcomes["undecodable"] += 1
                    continue
                error = result.error
                outcomes[error.code.value if error is not None else result.status.value] += 1
        report = Report(
            seed=seed,
            duration_s=duration_s,
            mutation=mutation,
            faults=faults,
            history=history,
            violations=violations,
            injected=dict(nemesis.injected),
            operations=workload.operations,
            actions=len(workload.planned),
            acked=len(workload.acked),
            outcomes=dict(outcomes),
            notes=nemesis.notes,
            root=base,
            wall_s=time.monotonic() - started,
            evidence=evidence,
            kinds=kinds,
            hermes=hermes,
            hermes_requests=dict(Counter(r.route for r in evidence.requests)),
            late_chunks=late,
            retracted=retracted,
        )
        if violations or keep:
            history.dump(base / "history.jsonl")
        return report
    except HermesUnavailable:
        raise  # nothing ran: no history worth keeping
    except BaseException:
        history.dump(base / "history.jsonl")
        raise
    finally:
        await deployment.close()
        if owned and not keep and not (base / "history.jsonl").exists():
            _remove(base)


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


async def heal_all(d: Deployment, history: History) -> None:
    """Undo every fault still in effect, so that what follows sees a healthy deployment."""
    for worker in d.workers.values():
        for proxy in worker.proxies.values():
            proxy.heal()
        worker.clock_file.write_text("0")
    for path in d.mounts:
        with contextlib.suppress(FileNotFoundError):
            (path / FILL_FILE).unlink()
    for service in (d.nats, d.redis):
        assert service is not None
        if service.paused:
            await asyncio.to_thread(service.resume)
        if not service.running:
            await asyncio.to_thread(service.restart)
    assert d.nats is not None
    assert d.redis is not None
    if not await d.jetstream_answers():
        # Seen after a full disk under the store (nats-server 2.9.10): JetStream stops
        # answering and does not recover once space is freed, while /healthz still says
        # 200 and nothing is logged. Only a restart brings it back (docs/reliability.md).
        history.add("nemesis", "heal: nats restarted (JetStream not answering)", None)
        await asyncio.to_thread(d.nats.restart)
        if not await d.jetstream_answers():
            history.add("nemesis", "heal: JetStream still not answering after a restart", None)
    if await d.ensure_hermes():
        history.add("nemesis", "heal: hermes started (a restart had left it down)", None)
    if not await asyncio.to_thread(redis_answers, "127.0.0.1", d.redis.port):
        history.add("nemesis", "heal: redis restarted (not answering)", None)
        await asyncio.to_thread(d.redis.restart)
    for worker_id, worker in d.workers.items():
        if worker.process is not None and worker.process.alive:
            worker.process.resume()
            worker.paused = False
        else:
            history.add("nemesis", "heal: worker restarted", None, target=worker_id)
            await d.start_worker(worker_id)
    history.add("nemesis", "healed", None)


async def read_stream(
    nc: nats.aio.client.Client, subject: str
) -> list[tuple[str, bytes, dict[str, str]]]:
    """Every message on `subject` (wildcards allowed), oldest first, with its headers."""
    js = nc.jetstream()
    try:
        sub = await js.subscribe(subject, ordered_consumer=True)
    except nats.js.errors.NotFoundError:
        # The stream itself is gone (seen after a full disk and a NATS restart): nothing
        # on it is there any more, which the checker reports Action by Action.
        log.error("chaos: no stream holds %s after the heal", subject)
        return []
    out: list[tuple[str, bytes, dict[str, str]]] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=2.0)
            except nats.errors.TimeoutError:
                return out
            out.append((msg.subject, msg.data, dict(msg.headers or {})))
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()


def _family(subject: str) -> str:
    """`aip.hermes.h1.results.act_x` -> `aip.hermes.h1.results.*`."""
    return subject.rsplit(".", 1)[0] + ".*"


async def stream_by_action(d: Deployment, which: str) -> dict[str, list[bytes]]:
    """Each Action's messages on one output stream, oldest first."""
    return {
        action_id: [data for data, _ in messages]
        for action_id, messages in (await messages_by_action(d, which)).items()
    }


async def messages_by_action(
    d: Deployment, which: str
) -> dict[str, list[tuple[bytes, dict[str, str]]]]:
    """Each Action's messages on one output stream with their headers, oldest first."""
    assert d.stack is not None
    subjects = d.stack.subjects
    sample = new_action_id()
    pattern = {
        "results": lambda: subjects.results(ENDPOINT, sample),
        "chunks": lambda: subjects.chunks(ENDPOINT, sample),
        "audit": lambda: subjects.audit(ENDPOINT, sample),
    }[which]()
    grouped: dict[str, list[tuple[bytes, dict[str, str]]]] = {}
    for subject, data, headers in await read_stream(d.stack.nc, _family(pattern)):
        grouped.setdefault(subject.rsplit(".", 1)[1], []).append((data, headers))
    return grouped


async def quiesce(d: Deployment, acked: set[str], history: History) -> None:
    """Wait (bounded) until every acknowledged Action has a result on the stream."""
    deadline = time.monotonic() + QUIESCE_S
    missing = set(acked)
    while missing and time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            results = await stream_by_action(d, "results")
            missing = {a for a in acked if a not in results}
        if missing:
            await asyncio.sleep(1.0)
    history.add("nemesis", "quiesced", None, missing=len(missing))
    if missing:
        # Where is each worker waiting? Each prints its tasks' stacks to its log.
        for worker in d.workers.values():
            Path(f"{worker.clock_file}.dump").touch()
    await asyncio.sleep(3.0)  # late republishes and duplicates, if any, land now


async def collect(d: Deployment, workload: Workload, history: History) -> Evidence:
    assert d.stack is not None
    result_messages = await messages_by_action(d, "results")
    results = {a: [data for data, _ in ms] for a, ms in result_messages.items()}
    unverified: dict[str, str] = {}
    children = [a for a, planned in workload.planned.items() if planned.kind == "delegation"]
    for action_id in children:
        for data, _ in result_messages.get(action_id, []):
            try:
                d.stack.client.believe_result(data)
            except UnverifiedResponse as exc:
                unverified[action_id] = str(exc)[:200]
    chunk_messages = await messages_by_action(d, "chunks")
    receipts: dict[str, list[Receipt]] = {}
    for _action_id, raws in (await stream_by_action(d, "audit")).items():
        for raw in raws:
            with contextlib.suppress(
                msgspec.ValidationError, ValueError, KeyError, TypeError, AssertionError
            ):
                receipt = msgspec.convert(receipt_fields(raw), Receipt)
                receipts.setdefault(receipt.action_id, []).append(receipt)
    leases = {a: await d.stack.lease(a) for a in workload.planned}
    runs = await bound_runs(d, [a for a, p in workload.planned.items() if "objective" in p.kind])
    requests = [Request(r.route, r.run_id, r.body, r.at) for r in d.hermes_requests()]
    return Evidence(
        actions=workload.planned,
        acked=workload.acked,
        results={a: results.get(a, []) for a in workload.planned if a in results},
        chunks={a: [data for data, _ in ms] for a, ms in chunk_messages.items()},
        chunk_macs={
            a: [headers.get(CHAIN_MAC_HEADER) for _, headers in ms]
            for a, ms in chunk_messages.items()
        },
        receipts=receipts,
        leases=leases,
        requests=requests,
        history=history,
        runs=runs,
        forged_cancels=workload.forged_cancels - workload.cancelled,
        unverified=unverified,
    )


async def bound_runs(d: Deployment, action_ids: list[str]) -> dict[str, str]:
    """Each operator Action's Hermes run id, as its binding in Redis records it."""
    from redis.asyncio import Redis

    from worker.operator.binding import decode_binding
    from worker.store.keys import binding_key
    from worker.store.operator_store import OperatorStore

    assert d.redis is not None
    client = Redis.from_url(d.redis.url)
    runs: dict[str, str] = {}
    try:
        store = OperatorStore(client)
        for action_id in action_ids:
            stored = await store.read(binding_key(action_id))
            run_id = decode_binding(stored.doc).run_id if stored.doc is not None else None
            if run_id is not None:
                runs[action_id] = run_id
    finally:
        await client.aclose()
    return runs
