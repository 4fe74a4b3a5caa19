"""The garbage collector's schedule in a worker process that holds many runs at once.

CPython's default schedule (a young collection every 700 net allocations; a full one
whenever the objects promoted since the last full one reach a quarter of the old
generation) made one worker taking 10,000 slow operator runs (benchmark figure 4) spend
31 s of an 85 s ramp in 54 full collections: every held run keeps a few hundred tracked
objects (its task and coroutine frames, its HTTP response, its binding), every full
collection walks all of them, and each paused the event loop for 0.5-0.9 s, long enough to
starve the heartbeat and lose leases. Two changes, both only in the worker process
(`aip-hermes-worker run`), never in a test process that embeds a worker:

* `gc.freeze()` once the worker is wired, before it fetches any work: the modules,
  settings, clients and scripts built at start-up live as long as the process, and a
  frozen object is never traversed again (the start-up garbage is collected first, so
  none of it is kept);
* a young generation of `YOUNG_THRESHOLD` allocations instead of 700: most of an Action's
  short-lived objects die before a collection looks at them, so far fewer are promoted
  and the quarter rule triggers full collections far less often.

The freeze also removed the tail of the chunk relay (figure 3): with the start-up heap in
the old generation, a full collection about 2 s into every stream stopped the event loop
for 45-60 ms; with it frozen, none happens during the stream.

Nothing is kept longer than it was: reference counting still frees every acyclic object
at once; only cyclic garbage waits for a (less frequent) collection.
"""

from __future__ import annotations

import gc

#: Net allocations of tracked objects between two young collections (CPython: 700).
YOUNG_THRESHOLD = 50_000
#: Young collections per middle one, and middle ones per full one (CPython: 10 and 10).
MIDDLE_THRESHOLD = 20
OLD_THRESHOLD = 100


def settle_startup() -> None:
    """Collect the start-up garbage, freeze what is left, and lengthen the schedule.

    Call once per process, after the long-lived objects exist and before work arrives.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
