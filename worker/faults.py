"""Named fault points, so chaos tests can stop a worker exactly between two steps.

Enabled only by the test-only environment variable `AIPD_FAULT_POINTS`, read once at import:

    AIPD_FAULT_POINTS="after_settle=exit"                 every Action
    AIPD_FAULT_POINTS="after_post_run=exit@act_0123…"     only that Action
    AIPD_FAULT_POINTS="after_lease=pause,mid_stream=sleep:2"

`exit` ends the process on the spot (`os._exit(137)`, no cleanup, like kill -9), `pause`
stops it (SIGSTOP; the test sends SIGCONT), `sleep:S` blocks the event loop for S seconds
(a stalled process, as seen by its peers), `raise` raises `FaultRaised` there (a bug: an
exception no code path expected), `unavailable` raises `StoreUnavailable` (Redis did not
answer within a budget: a dependency failure, not a bug). Production pays one `is None`
check per point.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from worker.errors import FaultRaised, StoreUnavailable

ENV = "AIPD_FAULT_POINTS"

#: Every point the runtime and the operator pass through, in delivery order.
POINTS = (
    "after_decode",
    "after_idempotency_claim",
    "after_lease",
    "before_execute",
    "before_create",
    "after_claim",
    "after_post_run",
    "after_bind",
    "mid_stream",
    # A resume's approval was sent (Hermes answered it), before the answer is recorded.
    "after_post_approval",
    "before_resolve",
    "after_execute",
    "after_settle",
    "after_escalation",
    "after_exhaustion_dead_letter",
    "after_channel_publish",
    "after_ingress_publish",
    "after_terminal_chunk",
    "after_result_publish",
    "before_ack",
    # The gateway's (worker/gateway): a child's queue entry is written / its envelope sent.
    "gateway_after_enqueue",
    "gateway_after_dispatch",
)


def _parse(spec: str) -> dict[str, tuple[str, str | None]]:
    plan: dict[str, tuple[str, str | None]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, rest = item.partition("=")
        action, _, only = rest.partition("@")
        if name not in POINTS or not action:
            raise ValueError(f"{ENV}: unknown fault point or action in {item!r}")
        plan[name] = (action, only or None)
    return plan


_PLAN: dict[str, tuple[str, str | None]] | None = (
    _parse(os.environ[ENV]) if os.environ.get(ENV) else None
)


def hit(point: str, action_id: str) -> None:
    """Pass through a fault point; acts only when a test enabled this point (and action)."""
    if _PLAN is None:
        return
    entry = _PLAN.get(point)
    if entry is None or (entry[1] is not None and entry[1] != action_id):
        return
    action = entry[0]
    sys.stderr.write(f"fault point {point} for {action_id}: {action}\n")
    sys.stderr.flush()
    if action == "exit":
        os._exit(137)
    elif action == "pause":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    elif action == "raise":
        raise FaultRaised(f"fault point {point}")
    elif action == "unavailable":
        raise StoreUnavailable(f"fault point {point}")
