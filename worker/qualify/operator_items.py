"""Items 2-7: the governed operator against a live Hermes.

Every objective says in plain words what the agent should do (a real model follows the
words) and carries the project's scenario word for it (the fake LLM that drives Hermes in
the local qualification follows the word), so the same driver qualifies both. What an item
believes about Hermes it reads from Hermes: how many runs a session holds (one user turn
per run), what status a run reached; what it believes about the workers it reads from
their verified results, the binding in Redis and the audit receipts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from schemas.action import Action
from schemas.audit import Receipt, ReceiptEvent
from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.client import ActionHandle
from worker.errors import QualifySkipped
from worker.operator.binding import session_id_for
from worker.qualify.broken import Mode
from worker.qualify.deployment import Deployment, Evidence, Outcome
from worker.qualify.items import Context, expect, fail
from worker.qualify.objectives import APPROVAL, APPROVAL_TWICE, FAILING, PLAIN, SLOW, TOOL

#: Copies of one Action published at once (item 2).
COPIES = 4
#: Distinct resumes published at once for one live approval generation (item 5).
CONTENDERS = 4

#: An approval ledger entry as the binding shows it: (resume Action id, state, generation).
Command = tuple[str, str, int]


def objective(text: str) -> dict[str, str]:
    return {"objective": text}


async def wait_receipt(
    d: Deployment, endpoint_id: str, action_id: str, event: ReceiptEvent, timeout_s: float = 30.0
) -> tuple[int, Receipt]:
    """The first receipt of `event` on the Action's chain, waiting for it to appear."""
    deadline = time.monotonic() + timeout_s
    while True:
        for seq, receipt in await d.receipts(endpoint_id, action_id):
            if receipt.event is event:
                return seq, receipt
        if time.monotonic() > deadline:
            fail(f"{action_id} has no {event.value} receipt after {timeout_s:g} s")
        await asyncio.sleep(0.1)


async def cite(
    d: Deployment, evidence: Evidence, endpoint_id: str, action_id: str, *events: ReceiptEvent
) -> list[Receipt]:
    """The Action's receipts; those of `events` are cited as evidence."""
    found = await d.receipts(endpoint_id, action_id)
    for seq, receipt in found:
        if receipt.event in events:
            evidence.receipt(endpoint_id, seq, receipt)
    return [receipt for _, receipt in found]


def count(receipts: list[Receipt], event: ReceiptEvent) -> int:
    return sum(1 for r in receipts if r.event is event)


async def hermes_runs(d: Deployment, endpoint_id: str, action: Action) -> int:
    """How many runs Hermes started for an operator Action (its session's user turns)."""
    return await d.user_turns(endpoint_id, session_id_for(action.id)) or 0


async def started(
    d: Deployment, endpoint_id: str, text: str, **kw: object
) -> tuple[Action, ActionHandle]:
    action = d.action(endpoint_id, "operator", objective(text), **kw)  # type: ignore[arg-type]
    await d.approve(action)
    return action, await d.publish(action)


async def first_chunk(handle: ActionHandle, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        async for _ in handle.chunks():
            return


# --- item 2 ---------------------------------------------------------------------------------


async def one_run_per_action(ctx: Context, evidence: Evidence) -> str:
    (endpoint_id,) = ctx.endpoints(1)
    d = ctx.deployment
    action = d.action(endpoint_id, "operator", objective(PLAIN))
    evidence.action(action.id)
    await d.approve(action)
    # No Nats-Msg-Id: the stream keeps every copy, so the workers really receive four.
    handles = await asyncio.gather(*(d.publish(action, dedupe=False) for _ in range(COPIES)))
    outcome = await d.follow(action, handles[0])
    evidence.run(outcome.run_id)
    expect(
        outcome.result.status is ResultStatus.COMPLETED,
        f"{action.id} ended {outcome.result.status.value} {outcome.error_code}",
    )
    deadline = time.monotonic() + 30.0
    while True:
        receipts = await cite(d, evidence, endpoint_id, action.id)
        if count(receipts, ReceiptEvent.RECEIVED) >= COPIES or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    receipts = await cite(
        d, evidence, endpoint_id, action.id, ReceiptEvent.START_CLAIMED, ReceiptEvent.RUN_BOUND
    )
    received = count(receipts, ReceiptEvent.RECEIVED)
    expect(received >= COPIES, f"only {received} of {COPIES} copies reached a worker")
    runs = await hermes_runs(d, endpoint_id, action)
    expect(runs == 1, f"Hermes holds {runs} runs in {session_id_for(action.id)}, not 1")
    bound = count(receipts, ReceiptEvent.RUN_BOUND)
    expect(bound == 1, f"{bound} run_bound receipts, not 1")
    return (
        f"{COPIES} concurrent copies of {action.id}: Hermes session "
        f"{session_id_for(action.id)} holds 1 run ({outcome.run_id})"
    )


# --- item 3 ---------------------------------------------------------------------------------


async def lost_start_is_unknown(ctx: Context, evidence: Evidence) -> str:
    control = ctx.owned()
    (endpoint_id,) = ctx.endpoints(1)
    action_id = control.armed_fault(endpoint_id, "after_post_run")
    if action_id is None:
        raise QualifySkipped(f"no worker of {endpoint_id} has the after_post_run fault point armed")
    d = ctx.deployment
    action, handle = await started(d, endpoint_id, PLAIN, action_id=action_id)
    evidence.action(action.id)
    # The owner ends right after Hermes accepted the run, before it stored the run id.
    await wait_receipt(d, endpoint_id, action.id, ReceiptEvent.START_CLAIMED)
    await control.wait_worker_exit(endpoint_id)
    await control.start_worker(endpoint_id)
    outcome = await d.follow(action, handle)
    error = outcome.result.error
    expect(
        outcome.result.status is ResultStatus.FAILED
        and error is not None
        and error.code is ErrorCode.OPERATOR_OUTCOME_UNKNOWN
        and error.uncertain_outcome,
        f"{action.id} ended {outcome.result.status.value} {outcome.error_code}, "
        "not operator_outcome_unknown (uncertain)",
    )
    binding = await d.binding(action.id)
    expect(
        binding is not None and binding["status"] == "outcome_unknown",
        f"binding of {action.id} is {binding and binding['status']}",
    )
    runs = await hermes_runs(d, endpoint_id, action)
    expect(runs == 1, f"Hermes holds {runs} runs for {action.id}: the start was replayed")
    await cite(
        d, evidence, endpoint_id, action.id, ReceiptEvent.START_CLAIMED, ReceiptEvent.SETTLED
    )
    evidence.notes.append(
        f"the lost run lives in Hermes session {session_id_for(action.id)} (id never bound)"
    )
    return (
        f"worker killed after POST /v1/runs: {action.id} settled operator_outcome_unknown, "
        "Hermes holds exactly the one lost run, nothing replayed"
    )


# --- item 4 ---------------------------------------------------------------------------------


async def _matches_hermes(d: Deployment, endpoint_id: str, outcome: Outcome, status: str) -> None:
    run_id = outcome.run_id
    expect(run_id is not None, f"{outcome.action.id} names no run")
    assert run_id is not None
    seen = await d.run_status(endpoint_id, run_id)
    expect(seen == status, f"Hermes says run {run_id} is {seen}, the result says {status}")


async def event_mapping(ctx: Context, evidence: Evidence) -> str:
    (endpoint_id,) = ctx.endpoints(1)
    d = ctx.deployment

    async def run(text: str) -> Outcome:
        action = d.action(endpoint_id, "operator", objective(text))
        outcome = await d.outcome(action)
        evidence.action(action.id)
        evidence.run(outcome.run_id)
        return outcome

    async def cancelled() -> Outcome:
        action, handle = await started(d, endpoint_id, SLOW)
        evidence.action(action.id)
        await first_chunk(handle)
        reply = await d.cancel(endpoint_id, action.id)
        expect(reply.accepted, f"cancel of {action.id} refused: {reply.error}")
        outcome = await d.follow(action, handle)
        evidence.run(outcome.run_id)
        return outcome

    plain, tool, approval, failure, stopped = await asyncio.gather(
        run(PLAIN), run(TOOL), run(APPROVAL), run(FAILING), cancelled()
    )
    checks = (
        (plain, ResultStatus.COMPLETED, "data", "done", "completed"),
        (tool, ResultStatus.COMPLETED, "tool", "done", "completed"),
        (approval, ResultStatus.REQUIRES_HUMAN, "pending_approval", "done", None),
        (failure, ResultStatus.FAILED, "error", "error", "failed"),
        (stopped, ResultStatus.CANCELLED, "done", "done", "cancelled"),
    )
    for outcome, status, kind, last, hermes_status in checks:
        where = f"{outcome.action.id} ({outcome.action.input['objective'][:30]}…)"
        expect(
            outcome.result.status is status,
            f"{where} ended {outcome.result.status.value} {outcome.error_code}, not {status.value}",
        )
        kinds = outcome.kinds()
        expect(kind in kinds, f"{where}: no {kind} chunk in {kinds}")
        expect(bool(kinds) and kinds[-1] == last, f"{where}: last chunk {kinds[-1:]} is not {last}")
        if hermes_status is not None:
            await _matches_hermes(d, endpoint_id, outcome, hermes_status)
    expect(
        {"tool.started", "tool.completed"} <= set(tool.provider_events()),
        f"tool run events: {tool.provider_events()}",
    )
    expect(
        failure.error_code == ErrorCode.OPERATOR_FAILED.value,
        f"failed run settled {failure.error_code}, not operator_failed",
    )
    await _matches_hermes(d, endpoint_id, approval, "waiting_for_approval")
    # Leave nothing waiting: deny the prompt (Hermes still ends the run completed).
    denied = await d.outcome(
        d.action(
            endpoint_id,
            "operator",
            {"resume": {"source_action_id": approval.action.id, "choice": "deny"}},
        )
    )
    evidence.action(denied.action.id)
    expect(
        denied.result.status is ResultStatus.COMPLETED,
        f"deny of {approval.action.id} ended {denied.result.status.value} {denied.error_code}",
    )
    return (
        "delta→data, tool.*→tool, approval.request→pending_approval (requires_human), "
        "run.failed→error (operator_failed), run.cancelled→done (cancelled), "
        "run.completed→done; each agrees with Hermes' run status"
    )


# --- item 5 ---------------------------------------------------------------------------------


async def _ledger(d: Deployment, source: Action) -> tuple[dict[str, Any], list[Command]]:
    """The source binding and its approval ledger as (resume id, state, generation)."""
    binding = await d.binding(source.id)
    expect(binding is not None, f"no binding for {source.id}")
    assert binding is not None
    commands = [
        (c["resume_action_id"], c["state"], c["generation"])
        for c in binding.get("approval_commands") or []
    ]
    return binding, commands


async def approval_replay(ctx: Context, evidence: Evidence) -> str:
    """A run that asks twice: generation 1 answered, then, while generation 2 is live, the
    answered resume replayed (nothing may reach Hermes) and CONTENDERS new resumes at once
    (exactly one may answer generation 2: one decision per generation)."""
    (endpoint_id,) = ctx.endpoints(1)
    d = ctx.deployment
    source = await d.outcome(d.action(endpoint_id, "operator", objective(APPROVAL_TWICE)))
    evidence.action(source.action.id)
    evidence.run(source.run_id)
    expect(
        source.result.status is ResultStatus.REQUIRES_HUMAN,
        f"{source.action.id} ended {source.result.status.value}, not requires_human",
    )

    def resume(choice: str) -> Action:
        return d.action(
            endpoint_id,
            "operator",
            {"resume": {"source_action_id": source.action.id, "choice": choice}},
        )

    first = resume("once")
    answered = await d.outcome(first)
    evidence.action(first.id)
    expect(
        answered.result.status is ResultStatus.REQUIRES_HUMAN,
        f"resume {first.id} ended {answered.result.status.value} {answered.error_code}, "
        "not requires_human (Hermes' second prompt, generation 2)",
    )
    binding, commands = await _ledger(d, source.action)
    live = (binding["status"], binding.get("approval_generation"))
    expect(
        live == ("waiting_for_approval", 2) and commands == [(first.id, "applied", 1)],
        f"after generation 1 the source is {live}, ledger {commands}",
    )
    # The answered resume again, past the duplicate window, while generation 2 is live: its
    # stored result; it must not answer the later prompt.
    replay = await d.follow(first, await d.publish(first, dedupe=False))
    expect(
        replay.result.status is answered.result.status
        and replay.result.output == answered.result.output,
        f"replay of {first.id} answered {replay.result.status.value}, not the stored result",
    )
    binding, after_replay = await _ledger(d, source.action)
    expect(
        binding["status"] == "waiting_for_approval" and after_replay == commands,
        f"the replay of {first.id} changed the source: {binding['status']}, {after_replay}",
    )
    # Generation 2, answered by several resumes at once (a late one meant for generation 1
    # among them): one decision, the others refused or shown the source's outcome.
    contenders = [resume("once") for _ in range(CONTENDERS)]
    for action in contenders:
        evidence.action(action.id)
        await d.approve(action)
    handles = await asyncio.gather(*(d.publish(action) for action in contenders))
    outcomes = await asyncio.gather(
        *(d.follow(action, handle) for action, handle in zip(contenders, handles, strict=True))
    )
    completed = [o for o in outcomes if o.result.status is ResultStatus.COMPLETED]
    expect(
        bool(completed),
        "no resume of generation 2 completed the run: "
        + ", ".join(f"{o.result.status.value} {o.error_code}" for o in outcomes),
    )
    _, ledger = await _ledger(d, source.action)
    second = [c for c in ledger if c[2] == 2]
    expect(
        ledger[:1] == [(first.id, "applied", 1)]
        and len(ledger) == 2
        and len(second) == 1
        and second[0][1] == "applied",
        f"approval ledger of {source.action.id}: {ledger} (one decision per generation)",
    )
    sent = 0
    for action_id in (first.id, *(a.id for a in contenders)):
        receipts = await cite(d, evidence, endpoint_id, action_id, ReceiptEvent.APPROVAL_COMMAND)
        sent += count(receipts, ReceiptEvent.APPROVAL_COMMAND)
    expect(sent == 2, f"{sent} approval commands sent to Hermes for 2 prompts")
    runs = await hermes_runs(d, endpoint_id, source.action)
    expect(runs == 1, f"Hermes holds {runs} runs for {source.action.id}")
    await _matches_hermes(d, endpoint_id, completed[0], "completed")
    others = sorted(
        {" ".join(filter(None, (o.result.status.value, o.error_code))) for o in outcomes}
    )
    return (
        f"resume {first.id} applied generation 1; replayed while generation 2 was live it "
        f"returned its stored result and sent nothing; of {CONTENDERS} resumes for "
        f"generation 2 at once, {second[0][0]} alone was applied ({', '.join(others)})"
    )


# --- item 6 ---------------------------------------------------------------------------------


async def cancel_races(ctx: Context, evidence: Evidence) -> str:
    (endpoint_id,) = ctx.endpoints(1)
    d = ctx.deployment
    # A cancel sent while a short run is finishing: whichever Hermes reports wins.
    action, handle = await started(d, endpoint_id, PLAIN)
    evidence.action(action.id)
    await first_chunk(handle)
    await d.cancel(endpoint_id, action.id)
    raced = await d.follow(action, handle)
    evidence.run(raced.run_id)
    status = raced.result.status
    expect(
        status in (ResultStatus.COMPLETED, ResultStatus.CANCELLED),
        f"raced {action.id} ended {status.value} {raced.error_code}",
    )
    await _matches_hermes(d, endpoint_id, raced, status.value)
    detail = f"cancel racing completion settled {status.value}, as Hermes reports"
    try:
        broken = ctx.broken_endpoint()
    except QualifySkipped as exc:
        raise QualifySkipped(f"{detail}; the unconfirmed cancel did not run: {exc}") from None
    broken.server.mode = Mode.NEVER_STOPS
    stuck, stuck_handle = await started(d, broken.endpoint_id, PLAIN)
    evidence.action(stuck.id)
    await wait_receipt(d, broken.endpoint_id, stuck.id, ReceiptEvent.RUN_BOUND)
    reply = await d.cancel(broken.endpoint_id, stuck.id)
    expect(reply.accepted, f"cancel of {stuck.id} refused: {reply.error}")
    unconfirmed = await d.follow(stuck, stuck_handle)
    error = unconfirmed.result.error
    expect(
        error is not None
        and error.code is ErrorCode.CANCELLATION_OUTCOME_UNKNOWN
        and error.uncertain_outcome,
        f"unconfirmed cancel of {stuck.id} settled {unconfirmed.result.status.value} "
        f"{unconfirmed.error_code}",
    )
    stops = sum(broken.server.stops.values())
    expect(stops >= 1, "the stop never reached the endpoint")
    await cite(d, evidence, broken.endpoint_id, stuck.id, ReceiptEvent.CANCEL_SENT)
    return f"{detail}; a stop never confirmed settled cancellation_outcome_unknown ({stuck.id})"


# --- item 7 ---------------------------------------------------------------------------------


async def restart_recovery(ctx: Context, evidence: Evidence) -> str:
    control = ctx.owned()
    (endpoint_id,) = ctx.endpoints(1)
    d = ctx.deployment
    action, handle = await started(d, endpoint_id, SLOW)
    evidence.action(action.id)
    seq, bound = await wait_receipt(d, endpoint_id, action.id, ReceiptEvent.RUN_BOUND)
    evidence.receipt(endpoint_id, seq, bound)
    await control.kill_worker(endpoint_id)
    await control.restart_redis()
    await control.start_worker(endpoint_id)
    outcome = await d.follow(action, handle)
    evidence.run(outcome.run_id)
    expect(
        outcome.result.status is ResultStatus.COMPLETED,
        f"{action.id} ended {outcome.result.status.value} {outcome.error_code} after the restart",
    )
    await _matches_hermes(d, endpoint_id, outcome, "completed")
    runs = await hermes_runs(d, endpoint_id, action)
    expect(runs == 1, f"Hermes holds {runs} runs for {action.id}: the restart started another")
    receipts = await cite(
        d, evidence, endpoint_id, action.id, ReceiptEvent.LEASE_ACQUIRED, ReceiptEvent.SETTLED
    )
    fences = [r.fence for r in receipts if r.event is ReceiptEvent.LEASE_ACQUIRED]
    expect(
        len(fences) >= 2 and fences == sorted(fences),
        f"lease fences {fences}: no takeover after the restart",
    )
    return (
        f"worker killed and Redis restarted mid-run: {action.id} recovered run "
        f"{outcome.run_id} from the stored binding (fences {fences}), one Hermes run"
    )
