"""The process heap after start-up: moved out of the garbage collector's sight.

Everything a worker builds while starting (imported modules, schemas, compiled scripts,
clients, the registry) lives until the process exits, and so does most of what its first
minutes build; yet CPython's cyclic collector walks all of it on every full (generation 2)
collection, and a full collection triggers every few tens of thousands of allocations. On
the chunk relay's path (figure 3 of the bench) that walk stopped the event loop for 20-45 ms
every few seconds, longer than any other pause in the worker: the tail of its latency.

`gc.freeze()` after start-up moves those objects to the permanent generation, which no
collection visits; what the work allocates afterwards is collected as before. A reference
cycle among the frozen objects is never freed, so the garbage of start-up is collected once
first.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect start-up's garbage, then keep every surviving object out of later collections."""
    gc.collect()
    gc.freeze()
