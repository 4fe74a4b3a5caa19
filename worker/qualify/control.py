"""What the driver may do to the deployment's processes, when it owns them.

Items 3 and 7 of the qualification list need a worker stopped at a fault point and a worker
and Redis restarted mid-run. A driver pointed at someone's deployment owns none of its
processes and must not touch them: it gets no `ProcessControl`, and those items skip with
the reason. The local launcher (`worker.testing.qualify_local`) starts every process itself and
hands the driver a control over them.
"""

from __future__ import annotations

from typing import Protocol


class ProcessControl(Protocol):
    """The processes of a deployment the driver started (and so may stop)."""

    def armed_fault(self, endpoint_id: str, point: str) -> str | None:
        """The Action id for which `point=exit` is armed in `endpoint_id`'s worker, if any:
        that worker ends on the spot when it reaches the point for that Action."""

    async def wait_worker_exit(self, endpoint_id: str) -> None:
        """Wait until the worker serving `endpoint_id` has ended (at a fault point)."""

    async def kill_worker(self, endpoint_id: str) -> None:
        """kill -9 the worker serving `endpoint_id` (no lease release, no ack)."""

    async def start_worker(self, endpoint_id: str) -> None:
        """Start the worker serving `endpoint_id` again (after it died or was killed),
        without any fault point; returns once it is bound to its consumers."""

    async def restart_redis(self) -> None:
        """Stop Redis and start it again on its data (AOF): the production storage."""
