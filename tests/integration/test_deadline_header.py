"""`X-AIP-Deadline-Unix-Ms` carries the effective deadline the execution runs under (#27).

The effective deadline is the earliest of the Action's `deadline_unix_ms`, its
`created_at_unix_ms + timeout_ms` and admission time plus the capability's manifest
`timeout_ms`; admission decides it once (`ActionIntake.admit`) and both the execution and
the provider header take that one value. Before, the header was the Action's own deadline
only: absent when the Action named none, later than the runtime's when the capability's
bound was tighter.
"""

from __future__ import annotations

import time
from typing import Any

from schemas.result import ResultStatus
from tests.integration.stack import ENDPOINT, Stack
from worker.trust.projection import DEADLINE

MODELS = "GET /v1/models"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _models_timeout_ms(stack: Stack) -> int:
    manifest: dict[str, Any] = await stack.client.manifest(ENDPOINT)
    entry = next(e for e in manifest["capabilities"] if e["name"] == "models")
    return int(entry["contract"]["sla"]["timeout_ms"])


async def _sent_deadline(stack: Stack, **fields: Any) -> tuple[int, int, int]:
    """Publish a `models` Action; (time before, time after, the header Hermes received)."""
    assert stack.fake is not None
    before = _now_ms()
    handle = await stack.publish(stack.action("models", **fields))
    result = await handle.result(timeout_s=30)
    after = _now_ms()
    assert result.status is ResultStatus.COMPLETED, result.error
    sent = [r for r in stack.fake.requests() if r.route == MODELS]
    headers = {k.lower(): v for k, v in sent[-1].headers.items()}
    return before, after, int(headers[DEADLINE.lower()])


async def test_the_header_is_the_capability_bound_when_the_action_names_none(
    stack: Stack,
) -> None:
    await stack.spawn("w1")
    bound = await _models_timeout_ms(stack)
    before, after, header = await _sent_deadline(stack)
    assert before + bound <= header <= after + bound


async def test_the_header_is_the_tighter_bound_not_the_actions_own(stack: Stack) -> None:
    await stack.spawn("w1")
    bound = await _models_timeout_ms(stack)
    # The Action allows an hour; the capability's bound is the effective deadline.
    before, after, header = await _sent_deadline(stack, timeout_ms=bound + 3_600_000)
    assert before + bound <= header <= after + bound
    # The Action's own deadline, when sooner, is the one sent.
    soon = _now_ms() + 20_000
    _, _, header = await _sent_deadline(stack, deadline_unix_ms=soon)
    assert header == soon
