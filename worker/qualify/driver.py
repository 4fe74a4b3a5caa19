"""Run the qualification list against a deployment and report: lines, a record, an exit code.

Shared by `aip-hermes-worker qualify` (a deployment someone else runs: no process control)
and the local launcher (`worker.testing.qualify_local`, which owns every process and passes a
`ProcessControl`). Whatever happens, every run the driver started is checked at the end
and stopped if Hermes still runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.qualify import delegation_items as dg
from worker.qualify import negative_items as neg
from worker.qualify import operator_items as op
from worker.qualify import tour
from worker.qualify.deployment import Deployment
from worker.qualify.items import Context, Item, ItemResult, Status, run_item
from worker.qualify.probe import probe
from worker.qualify.record import build, verdict, write

#: The connector overview's list, in its order.
ITEMS: tuple[Item, ...] = (
    Item(1, "every published route against the pinned revision", tour.route_tour),
    Item(2, "concurrent same-Action execution starts one run", op.one_run_per_action),
    Item(3, "a lost start is outcome-unknown, never replayed", op.lost_start_is_unknown),
    Item(4, "SSE delta, tool, approval, failure, cancel, terminal mapping", op.event_mapping),
    Item(5, "approval replay and generation isolation", op.approval_replay),
    Item(6, "cancellation/completion races, unconfirmed cancel", op.cancel_races),
    Item(7, "restart recovery with the production storage", op.restart_recovery),
    Item(8, "delegation routed to two isolated instances", dg.routed_to_each_instance),
    Item(9, "Hermes tool use through the authenticated gateway", dg.tool_use_through_gateway),
    Item(10, "negative authz, tenant, allowlist, timeout, malformed, outage", neg.refusals),
)
ITEM_TIMEOUT_S = 240.0


@dataclass(frozen=True, slots=True)
class Report:
    results: list[ItemResult]
    record: dict[str, object]
    written: tuple[Path, Path] | None

    @property
    def failed(self) -> bool:
        return any(r.status is Status.FAIL for r in self.results)


async def drive(
    ctx: Context,
    *,
    record_path: Path | None,
    topology: str,
    only: Sequence[int] = (),
    say: Callable[[str], None] = print,
) -> Report:
    """Probe, run the items (all, or those numbered in `only`), clean up, write the record."""
    d: Deployment = ctx.deployment
    started = time.time()
    q = d.qualify
    token = None
    if q.mcp_access_token_file is not None:
        from worker.secret_files import read_secret_file

        token = read_secret_file(
            q.mcp_access_token_file, what="AIPD_MCP_ACCESS_TOKEN_FILE"
        ).reveal()
    facts = await probe(ctx, q.qualify_gateway_url, token)
    for endpoint_id, problem in ctx.problems.items():
        say(f"!! endpoint {endpoint_id}: {problem}")
    if ctx.gateway_problem:
        say(f"!! gateway: {ctx.gateway_problem}")
    results: list[ItemResult] = []
    try:
        for item in ITEMS:
            if only and item.number not in only:
                continue
            result = await run_item(item, ctx, ITEM_TIMEOUT_S)
            results.append(result)
            say(result.line())
    finally:
        cleanup = await d.leave_nothing_behind()
    for line in cleanup:
        say(f"cleanup: {line}")
    record = build(
        facts,
        results,
        endpoint_ids=ctx.endpoint_ids,
        started=started,
        finished=time.time(),
        cleanup=cleanup,
        topology=topology,
    )
    written = write(record, record_path) if record_path is not None else None
    say(f"verdict: {verdict(results)} ({sum(r.status is Status.PASS for r in results)} pass, "
        f"{sum(r.status is Status.FAIL for r in results)} fail, "
        f"{sum(r.status is Status.SKIP for r in results)} skip)")  # fmt: skip
    if written is not None:
        say(f"record: {written[0]} and {written[1]}")
    return Report(results, record, written)
