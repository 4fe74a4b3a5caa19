"""Item 10: what must be refused or failed, and how.

Negative authorization (a principal the directory does not know; an unknown MCP token),
tenant isolation (the caller claiming another tenant; the driver's principal reading a
child another principal created), the delegation allowlist, a timeout, a malformed answer
and a provider outage (the last two against the driver's own broken endpoint). Each case
must end with the typed error the spec names, with nothing started in Hermes.
"""

from __future__ import annotations

import secrets

from schemas.errors import ErrorCode
from schemas.ids import capability_id
from schemas.result import ResultStatus
from worker.delegation.action_id import delegation_action_id
from worker.errors import McpHttpRefused, QualifySkipped
from worker.gateway.mcp_client import call_tool
from worker.operator.binding import session_id_for
from worker.qualify.broken import Mode
from worker.qualify.deployment import Deployment, Evidence, Outcome
from worker.qualify.items import Context, expect
from worker.qualify.objectives import SLOW
from worker.qualify.operator_items import objective

#: A capability no sane delegation allowlist admits.
OUTSIDE_ALLOWLIST = "cap:qualify_outside_allowlist:probe"
FOREIGN_TENANT = "qualify-foreign-tenant"
TIMEOUT_MS = 1_500


def _refused(outcome: Outcome, code: ErrorCode, what: str) -> None:
    expect(
        outcome.result.status is ResultStatus.FAILED and outcome.error_code == code.value,
        f"{what} ({outcome.action.id}) ended {outcome.result.status.value} "
        f"{outcome.error_code}, not {code.value}",
    )


async def _nothing_ran(d: Deployment, endpoint_id: str, action_id: str, what: str) -> None:
    runs = await d.user_turns(endpoint_id, session_id_for(action_id))
    expect(runs is None, f"{what}: Hermes {endpoint_id} started a run anyway")


async def refusals(ctx: Context, evidence: Evidence) -> str:
    (endpoint_id,) = ctx.endpoints(1)
    d = ctx.deployment
    done: list[str] = []
    skipped: list[str] = []

    async def run(outcome_of: Outcome) -> Outcome:
        evidence.action(outcome_of.action.id)
        return outcome_of

    stranger = await run(
        await d.outcome(
            d.action(
                endpoint_id,
                "operator",
                objective("never run"),
                principal_id="user:qualify-unknown-" + secrets.token_hex(4),
            ),
            approve=False,
        )
    )
    _refused(stranger, ErrorCode.HOST_AUTHENTICATION, "an unknown principal")
    await _nothing_ran(d, endpoint_id, stranger.action.id, "an unknown principal")
    unapproved = await run(
        await d.outcome(d.action(endpoint_id, "operator", objective("never run")), approve=False)
    )
    expect(
        unapproved.result.status is ResultStatus.FAILED,
        f"an operator Action without approval ended {unapproved.result.status.value}",
    )
    await _nothing_ran(d, endpoint_id, unapproved.action.id, "an unapproved operator Action")
    done.append(f"unknown principal → {stranger.error_code}")
    done.append(f"no approval → {unapproved.error_code}")

    foreign = await run(
        await d.outcome(
            d.action(
                endpoint_id,
                "models",
                {},
                principal_id=d.qualify.qualify_principal_id,
                tenant_id=FOREIGN_TENANT,
            )
        )
    )
    _refused(foreign, ErrorCode.TENANT_MISMATCH, "a caller claiming another tenant")
    done.append(f"foreign tenant → {foreign.error_code}")

    request = d.delegation(endpoint_id, OUTSIDE_ALLOWLIST, {})
    evidence.action(request.action.id)
    handle = await d.delegate(request)
    evidence.action(handle.action_id)
    outside = await handle.result(timeout_s=d.qualify.qualify_timeout_s)
    code = outside.error.code if outside.error else None
    expect(
        code is ErrorCode.OPERATOR_POLICY,
        f"a delegation outside the allowlist ended {outside.status.value} {code}",
    )
    await _nothing_ran(
        d, endpoint_id, delegation_action_id(request.delegation_id), "a delegation off-allowlist"
    )
    done.append(f"child off the allowlist → {code}")

    # A governed timeout is outcome-unknown (the run may still work), never "failed, safe".
    late = d.action(endpoint_id, "operator", objective(SLOW), timeout_ms=TIMEOUT_MS)
    timed_out = await run(await d.outcome(late))
    error = timed_out.result.error
    expect(
        error is not None
        and error.code is ErrorCode.OPERATOR_OUTCOME_UNKNOWN
        and error.uncertain_outcome
        and "timeout" in error.message,
        f"an operator run past its {TIMEOUT_MS} ms timeout ended "
        f"{timed_out.result.status.value} {timed_out.error_code}",
    )
    run_id = timed_out.run_id
    evidence.run(run_id)
    if run_id is not None:
        # The spec's path for a run no operator Action follows any more: `run_stop`.
        stopped = await run(await d.outcome(d.action(endpoint_id, "run_stop", {"run_id": run_id})))
        expect(
            stopped.result.status is ResultStatus.COMPLETED
            or stopped.error_code == ErrorCode.REMOTE_REJECTED.value,
            f"run_stop of the timed-out run {run_id} ended {stopped.error_code}",
        )
    done.append(f"timeout → {timed_out.error_code} (uncertain), run stopped with run_stop")

    try:
        url, token = ctx.gateway()
    except QualifySkipped as exc:
        skipped.append(f"gateway checks ({exc})")
    else:
        try:
            await call_tool(url, "qualify-not-a-token-" + secrets.token_hex(8), "aip_capabilities")
        except McpHttpRefused as exc:
            expect(exc.status == 401, f"the gateway answered an unknown token HTTP {exc.status}")
        else:
            expect(False, "the gateway served an unknown MCP token")
        other = ctx.endpoint_ids[1] if len(ctx.endpoint_ids) > 1 else endpoint_id
        probe = d.delegation(endpoint_id, capability_id(other, "models"), {})
        answer = await call_tool(url, token, "aip_action_result", {"action_id": probe.action.id})
        expect(answer.is_error, "the driver's token read an Action it does not own")
        done.append("unknown MCP token → HTTP 401; another principal's Action → not found")

    try:
        broken = ctx.broken_endpoint()
    except QualifySkipped as exc:
        skipped.append(f"malformed response and provider outage ({exc})")
    else:
        broken.server.mode = Mode.MALFORMED
        garbled = await run(await d.outcome(d.action(broken.endpoint_id, "models", {})))
        _refused(garbled, ErrorCode.TRANSPORT, "a malformed answer")
        done.append(f"malformed body → {garbled.error_code}")
        await broken.server.close()
        gone = await run(await d.outcome(d.action(broken.endpoint_id, "models", {})))
        _refused(gone, ErrorCode.TRANSPORT, "a provider outage")
        expect(
            gone.result.error is not None and gone.result.error.retryable,
            "a read-only call during an outage is not marked retryable",
        )
        done.append(f"outage → {gone.error_code} (retryable)")
    summary = "; ".join(done)
    if skipped:
        raise QualifySkipped(f"{summary}; not run: {'; '.join(skipped)}")
    return summary
