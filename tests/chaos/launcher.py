"""`python -m tests.chaos.launcher run`: a worker process under the campaign's control.

It is the production worker (`worker.commands.cli.main`, the same code `aip-hermes-worker
run` runs), started through this module for two things only the harness needs. Both live
here, in the test tree, so no production code path (no setting, no environment variable
the worker reads) can turn either on:

* **Clock skew** (`CHAOS_CLOCK_FILE`): the process's wall clock (`time.time`,
  `time.time_ns`, which is what `worker.store.clock.now_ms` and every stamp read) is the
  real one plus the offset in milliseconds written in that file, re-read every 50 ms. The
  nemesis writes the file to skew or jump the clock while the worker runs, as an NTP step
  or a drifting VM clock would. The monotonic clock is untouched (as with a real step),
  and so is Redis' `TIME`, which every expiry decision uses: a skewed worker must still
  agree with the others.
* **Mutations** (`CHAOS_MUTATION`): a planted bug, to prove the checker finds one. See
  `MUTATIONS`. The production modules are patched in this process before the worker
  starts; nothing is written to disk.

It also prints every asyncio task's stack to the worker's log when the file
`<clock file>.dump` appears (the campaign asks for it when an Action never settles).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

CLOCK_FILE_ENV = "CHAOS_CLOCK_FILE"
MUTATION_ENV = "CHAOS_MUTATION"

#: The planted bugs this launcher can install, by name.
MUTATIONS = {
    # The settle no longer checks the fence: the Lua compare of owner and fence is gone,
    # and the worker never learns its lease was lost (no local validity check, no loss
    # from the heartbeat). A worker paused or partitioned past its lease settles anyway.
    "stale_settle": "a worker whose fence was superseded may still settle its result",
    # A redelivery that finds an earlier delivery's start claim, never bound to a run id,
    # takes the claim over and sends `POST /v1/runs` again instead of settling
    # `operator_outcome_unknown`.
    "resend_unbound_start": "an unbound operator start claim is re-sent by the next owner",
    # The approval ledger no longer sees that a generation was already answered: a second
    # resume may claim a generation whose first command is claimed or applied, and send it.
    "two_decisions_per_generation": "one approval generation may take several decisions",
}


def install_clock(path: Path) -> None:
    """Offset the process's wall clock by the milliseconds in `path` (0 when absent)."""
    real_time_ns = time.time_ns
    offset_ns = [0]

    def read() -> None:
        with contextlib.suppress(OSError, ValueError):
            offset_ns[0] = int(float(path.read_text(encoding="utf-8").strip() or 0) * 1e6)

    def poll() -> None:
        while True:
            read()
            time.sleep(0.05)

    read()
    time.time_ns = lambda: real_time_ns() + offset_ns[0]
    time.time = lambda: (real_time_ns() + offset_ns[0]) / 1e9
    threading.Thread(target=poll, name="chaos-clock", daemon=True).start()


def install_task_dump(trigger: Path) -> None:
    """When `trigger` appears, print every asyncio task's stack to stderr (the worker's
    log) and remove it: how a campaign shows where a stuck Action's execution waits."""

    def dump() -> None:
        import asyncio
        import gc
        import io

        out = io.StringIO()
        tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
        out.write(f"chaos launcher: {len(tasks)} live asyncio tasks\n")
        for task in tasks:
            out.write(f"--- {task.get_name()}\n")
            # The whole await chain (Task.print_stack shows one frame of a suspended one).
            awaited: Any = task.get_coro()
            for _ in range(60):
                frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
                if frame is None:
                    out.write(f"    awaiting {awaited!r}\n"[:300])
                    break
                code = frame.f_code
                out.write(f"    {code.co_filename}:{frame.f_lineno} {code.co_name}\n")
                awaited = getattr(awaited, "cr_await", None) or getattr(
                    awaited, "gi_yieldfrom", None
                )
        sys.stderr.write(out.getvalue())
        sys.stderr.flush()

    def poll() -> None:
        while True:
            if trigger.exists():
                with contextlib.suppress(OSError):
                    trigger.unlink()
                dump()
            time.sleep(0.5)

    threading.Thread(target=poll, name="chaos-dump", daemon=True).start()


def _stale_settle() -> None:
    from worker.execution import leases
    from worker.store import scripts

    original_source = scripts.script_source

    def source(name: str) -> str:
        text = original_source(name)
        if name == "settle":
            fenced = (
                "if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1]\n"
                "   or redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then"
            )
            assert fenced in text, "the settle script changed: update the mutation"
            text = text.replace(fenced, "if false then")
        return text

    scripts.script_source = source

    def check(self: Any) -> None:
        return None

    def lose(self: Any, execution: Any, why: str, *, cancel: bool = True) -> None:
        return None

    leases.HeldLease.check = check  # type: ignore[method-assign]
    leases.LeaseKeeper.lose = lose  # type: ignore[method-assign]


def _resend_unbound_start() -> None:
    from worker.operator import start
    from worker.operator.binding import BindingState

    original = start.StartFence._unknown

    async def unknown(self: Any, reason: str, *, remote_status: int | None = None) -> Any:
        if remote_status is None and reason.startswith("the start claim"):

            def steal(b: Any, now: int) -> Any:
                if b.status is not BindingState.STARTING:
                    return None
                return b.changed(now, start_claim=self._claim(now))

            binding = await self.s.handle.update(steal)
            claim = binding.start_claim
            if claim is not None and claim.claim_id == self.claim_id:
                return await self._send(claim)
        return await original(self, reason, remote_status=remote_status)

    start.StartFence._unknown = unknown  # type: ignore[method-assign]


#: How long the mutated worker holds a claimed decision before sending it to Hermes.
HELD_DECISION_S = 1.5


def _two_decisions_per_generation() -> None:
    import asyncio

    from worker.operator import resume

    def answering(binding: Any, generation: int) -> list[Any]:
        return []

    resume._answering = answering
    # Whether resumes arriving together overlap one's claim and its send is scheduling (a
    # clean-clone CI run saw four resumes serialized, one applied and three refused by the
    # status check, and the planted bug unseen). Holding each claimed decision before it is
    # sent makes them overlap every time, so the item's verdict on the bug is certain.
    apply = resume.ResumeLedger._apply

    async def held_apply(self: Any, command: Any) -> Any:
        await asyncio.sleep(HELD_DECISION_S)
        return await apply(self, command)

    resume.ResumeLedger._apply = held_apply  # type: ignore[method-assign]


def install_mutation(name: str) -> None:
    if name not in MUTATIONS:
        raise SystemExit(f"{MUTATION_ENV}: unknown mutation {name!r} (known: {sorted(MUTATIONS)})")
    {
        "stale_settle": _stale_settle,
        "resend_unbound_start": _resend_unbound_start,
        "two_decisions_per_generation": _two_decisions_per_generation,
    }[name]()
    sys.stderr.write(f"chaos launcher: mutation {name} installed: {MUTATIONS[name]}\n")


def main() -> int:
    clock = os.environ.get(CLOCK_FILE_ENV)
    if clock:
        install_clock(Path(clock))
        install_task_dump(Path(clock + ".dump"))
    mutation = os.environ.get(MUTATION_ENV)
    if mutation:
        install_mutation(mutation)
    from worker.commands.cli import main as worker_main

    return worker_main()


if __name__ == "__main__":
    sys.exit(main())
