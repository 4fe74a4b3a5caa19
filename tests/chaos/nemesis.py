"""The nemesis: a fault schedule drawn from a seed, then played against the deployment.

`schedule(seed, ...)` is a pure function of its arguments: the same seed gives the same
faults at the same offsets, which is what makes a violation reproducible (the workload
draws from its own generator, seeded from the same seed). Two faults may overlap, except
on one target at a time (a worker cannot be killed while paused; one link carries one
network fault): the generator resolves that when it draws, not at run time, so timing
never changes the schedule.

Kinds (`KINDS`):

* `kill` (kill -9 and restart after `duration`) and `pause` (SIGSTOP, SIGCONT after
  `duration`) of a worker, of NATS or of Redis. NATS restarts on its file store and Redis
  from its AOF (`appendfsync always`).
* `partition`: one worker cut from NATS, Redis, Hermes or all three; `both` directions or
  one (`up`: its requests are held, `down`: the replies are).
* `latency`: every byte between one worker and one dependency delayed.
* `drop`: every connection between one worker and one dependency reset, new ones refused
  for `duration`.
* `clock`: a worker's wall clock stepped by `skew_ms` (either way) for `duration`, then
  stepped back (`tests/chaos/launcher.py`).
* `hermes_restart`: Hermes forgets its runs and open streams (the fake's restart).
* `disk_full`: the tmpfs under the NATS store or Redis' AOF filled for `duration`.

A `Shape` says which targets the draws pick from and how often each kind comes: `FAKE`
(three workers, every kind, every target) or `REAL`, the smaller schedule of the
real-Hermes campaign (two workers; kills and pauses of workers only; network faults on the
worker-Hermes links, and partitions of a worker from everything; clock steps; restarts of
the real Hermes; no full disk), with fewer faults (a longer mean gap).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.deployment import DEPENDENCIES, REAL_WORKERS, WORKERS, Deployment
from tests.chaos.history import History

KINDS = (
    "kill",
    "pause",
    "partition",
    "latency",
    "drop",
    "clock",
    "hermes_restart",
    "disk_full",
)
WEIGHTS = (14, 30, 18, 6, 6, 9, 3, 5)
#: How long a dependency may be down or paused at most (the workers must get it back).
DEP_DOWN_MAX_S = 4.0
FILL_FILE = ".chaos-fill"


@dataclass(frozen=True, slots=True)
class Shape:
    """What a schedule draws from. The defaults are the fake-Hermes campaign's (`FAKE`):
    a schedule drawn with them is the one the same seed always gave."""

    workers: tuple[str, ...] = WORKERS
    #: Each kind's weight, in `KINDS` order (0: never drawn).
    weights: tuple[int, ...] = WEIGHTS
    #: The processes `kill` and `pause` pick from, and their weights.
    processes: tuple[str, ...] = (*WORKERS, "nats", "redis")
    process_weights: tuple[int, ...] = (4, 4, 4, 1, 1)
    #: The dependencies a network fault picks from (a partition may also pick `all`).
    links: tuple[str, ...] = DEPENDENCIES
    mean_gap_s: float = 1.5


FAKE = Shape()
REAL = Shape(
    workers=REAL_WORKERS,
    # kill, pause, partition, latency, drop, clock, hermes_restart, disk_full
    weights=(14, 20, 22, 6, 6, 6, 6, 0),
    processes=REAL_WORKERS,
    process_weights=(1, 1),
    links=("hermes",),
    mean_gap_s=3.0,
)


@dataclass(frozen=True, slots=True)
class Fault:
    at: float
    duration: float
    kind: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"t={self.at:6.2f}s +{self.duration:4.1f}s {self.kind:<14} {self.target} {extra}"

    def occupies(self) -> list[str]:
        """The targets this fault occupies while it lasts."""
        if self.kind in ("kill", "pause"):
            return [f"proc:{self.target}"]
        if self.kind in ("partition", "latency", "drop"):
            worker, dep = self.target.split("->")
            deps = DEPENDENCIES if dep == "all" else (dep,)
            return [f"net:{worker}:{d}" for d in deps]
        return [f"{self.kind}:{self.target}"]


def schedule(
    seed: int,
    duration_s: float,
    *,
    disk: bool,
    kinds: tuple[str, ...] = KINDS,
    shape: Shape = FAKE,
    max_faults: int = 500,
) -> list[Fault]:
    """The faults of one campaign: started within `duration_s`, healed by its end; only
    of `kinds` (the draws of the others are skipped, so a subset is a sub-schedule)."""
    rng = random.Random(f"nemesis-{seed}")
    faults: list[Fault] = []
    busy: dict[str, float] = {}
    t = rng.uniform(0.5, 2.0)
    while t < duration_s - 1.0 and len(faults) < max_faults:
        kind = rng.choices(KINDS, shape.weights)[0]
        fault = _draw(rng, kind, t, duration_s, disk, shape)
        if (
            fault is not None
            and kind in kinds
            and all(busy.get(k, 0.0) <= t for k in fault.occupies())
        ):
            for k in fault.occupies():
                # A killed process needs time to come back before its next fault.
                busy[k] = t + fault.duration + (6.0 if fault.kind == "kill" else 0.5)
            faults.append(fault)
        t += rng.expovariate(1 / shape.mean_gap_s)
    return faults


def _draw(
    rng: random.Random, kind: str, t: float, horizon: float, disk: bool, shape: Shape
) -> Fault | None:
    left = max(0.5, horizon - t)
    worker = rng.choice(shape.workers)
    at = round(t, 2)
    if kind in ("kill", "pause"):
        target = rng.choices(shape.processes, shape.process_weights)[0]
        if target in shape.workers:
            # Most around the lease TTL (3 s) plus a redelivery: long enough for another
            # worker to take over, short enough for the paused one to wake before it ends.
            drawn = rng.triangular(0.5, 9.0, 4.5)
        else:
            drawn = rng.uniform(0.5, DEP_DOWN_MAX_S)
        duration = round(min(drawn, left), 2)
        return Fault(at, duration, kind, target)
    if kind == "partition":
        dep = rng.choice([*shape.links, "all"])
        direction = rng.choice(["both", "up", "down"])
        duration = round(min(rng.uniform(0.5, 7.0), left), 2)
        return Fault(at, duration, kind, f"{worker}->{dep}", {"direction": direction})
    if kind == "latency":
        dep = rng.choice(shape.links)
        latency_ms = rng.choice([20, 100, 400, 1200])
        duration = round(min(rng.uniform(1.0, 6.0), left), 2)
        return Fault(at, duration, kind, f"{worker}->{dep}", {"latency_ms": latency_ms})
    if kind == "drop":
        dep = rng.choice(shape.links)
        duration = round(min(rng.uniform(0.2, 3.0), left), 2)
        return Fault(at, duration, kind, f"{worker}->{dep}")
    if kind == "clock":
        skew_ms = rng.choice([-1, 1]) * rng.choice([500, 5_000, 30_000, 120_000])
        duration = round(min(rng.uniform(1.0, 10.0), left), 2)
        return Fault(at, duration, kind, worker, {"skew_ms": skew_ms})
    if kind == "hermes_restart":
        return Fault(at, 0.0, kind, "hermes")
    if kind == "disk_full":
        if not disk:
            return None
        duration = round(min(rng.uniform(1.0, 5.0), left), 2)
        return Fault(at, duration, kind, rng.choice(["nats", "redis"]))
    raise AssertionError(kind)


@dataclass
class Nemesis:
    deployment: Deployment
    history: History
    faults: list[Fault]
    injected: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    async def run(self) -> None:
        """Play every fault at its offset; returns when the last one has healed."""
        await asyncio.gather(*(self._play(fault) for fault in self.faults))

    async def _play(self, fault: Fault) -> None:
        delay = fault.at - self.history.now()
        if delay > 0:
            await asyncio.sleep(delay)
        detail = {"fault": str(fault), **asdict(fault)["params"]}
        self.history.add("nemesis", f"start {fault.kind}", None, target=fault.target, **detail)
        try:
            heal = await self._apply(fault)
        except Exception as exc:  # a fault that could not be applied is reported, not fatal
            self.history.add(
                "nemesis",
                f"failed {fault.kind}",
                None,
                target=fault.target,
                error=f"{type(exc).__name__}: {exc}"[:200],
            )
            return
        self.injected[fault.kind] = self.injected.get(fault.kind, 0) + 1
        await asyncio.sleep(fault.duration)
        try:
            await heal()
        except Exception as exc:  # an overlapping fault got in the way: heal_all finishes it
            self.history.add(
                "nemesis",
                f"heal failed {fault.kind}",
                None,
                target=fault.target,
                error=f"{type(exc).__name__}: {exc}"[:200],
            )
            return
        self.history.add("nemesis", f"heal {fault.kind}", None, target=fault.target)

    async def _apply(self, fault: Fault) -> Any:
        d = self.deployment
        kind, target = fault.kind, fault.target
        if kind in ("partition", "latency", "drop"):
            worker_id, dep = target.split("->")
            proxies = [
                d.workers[worker_id].proxies[x] for x in (DEPENDENCIES if dep == "all" else (dep,))
            ]
            for proxy in proxies:
                if kind == "partition":
                    direction = fault.params["direction"]
                    proxy.set(
                        cut_up=direction in ("both", "up"), cut_down=direction in ("both", "down")
                    )
                elif kind == "latency":
                    proxy.set(latency_s=fault.params["latency_ms"] / 1000)
                else:
                    proxy.drop(refuse_s=fault.duration)

            async def heal_links() -> None:
                for proxy in proxies:
                    proxy.heal()

            return heal_links
        if kind == "clock":
            clock = d.workers[target].clock_file
            clock.write_text(str(fault.params["skew_ms"]))

            async def heal_clock() -> None:
                clock.write_text("0")

            return heal_clock
        if kind == "hermes_restart":
            await d.restart_hermes()
            return _nothing
        if kind == "disk_full":
            return await self._fill(fault)
        if target in d.workers:
            return await self._worker_fault(fault)
        return await self._dependency_fault(fault)

    async def _worker_fault(self, fault: Fault) -> Any:
        d = self.deployment
        worker = d.workers[fault.target]
        process = worker.process
        if process is None or not process.alive:
            self.notes.append(f"{fault}: worker not running, nothing to do")
            return _nothing
        if fault.kind == "kill":
            await asyncio.to_thread(process.kill)

            async def restart() -> None:
                await d.start_worker(fault.target)

            return restart
        process.pause()
        worker.paused = True

        async def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                process.resume()
            worker.paused = False

        return resume

    async def _dependency_fault(self, fault: Fault) -> Any:
        d = self.deployment
        service = d.nats if fault.target == "nats" else d.redis
        assert service is not None
        if fault.kind == "kill":
            await asyncio.to_thread(service.kill)

            async def restart() -> None:
                await asyncio.to_thread(service.restart)

            return restart
        await asyncio.to_thread(service.pause)

        async def resume() -> None:
            await asyncio.to_thread(service.resume)

        return resume

    async def _fill(self, fault: Fault) -> Any:
        d = self.deployment
        directory = (
            (d.root / "nats" / "store") if fault.target == "nats" else (d.root / "redis" / "data")
        )
        if directory not in d.mounts:
            self.notes.append(f"{fault}: skipped, {d.disk_skip_reason}")
            return _nothing
        path = directory / FILL_FILE
        written = await asyncio.to_thread(_fill_disk, path)
        self.history.add("nemesis", "disk filled", None, target=fault.target, bytes=written)

        async def free() -> None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            if fault.target == "nats" and not await d.jetstream_answers(attempts=6):
                # JetStream hangs after a full disk and stays hung once space is back
                # (nats-server 2.9.10, docs/reliability.md): an operator restarts it.
                self.history.add(
                    "nemesis", "nats restarted: JetStream hung after full disk", None, target="nats"
                )
                assert d.nats is not None
                await asyncio.to_thread(d.nats.restart)

        return free


def _fill_disk(path: Path) -> int:
    """Write zeros to `path` until the filesystem is full (bounded by its size)."""
    block = b"\0" * (1024 * 1024)
    written = 0
    with path.open("wb", buffering=0) as out:
        for _ in range(4096):
            try:
                written += out.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        # Fill the last partial block too, a page at a time.
        for _ in range(256):
            try:
                written += out.write(block[:4096])
            except OSError:
                break
        with contextlib.suppress(OSError):
            os.fsync(out.fileno())
    return written


async def _nothing() -> None:
    return None
