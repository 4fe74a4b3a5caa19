"""The replay window's two comparisons (worker/trust/replay.py), exactly at their edges.

1. stored young: the JetStream stored time S against `created_at` C (a backlog keeps its S,
   a re-publication gets a new one);
2. state still kept: Redis TIME N against C, up to the result retention less the skew.
"""

from __future__ import annotations

import pytest

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.store.clock import FixedClock
from worker.trust.replay import ReplayWindow

C = 1_800_000_000_000
AGE, SKEW, TTL = 300_000, 30_000, 86_400_000
WINDOW = ReplayWindow(AGE, SKEW, TTL)


async def _refused(created: int, now: int, stored: int | None) -> str | None:
    """The refusal's message, or None when the envelope passes."""
    try:
        await WINDOW.check(created, FixedClock(now), stored_at_ms=stored)
    except ConnectorError as exc:
        code, message = exc.code, exc.message
    else:
        return None
    assert code is ErrorCode.HOST_REPLAY
    return message


@pytest.mark.parametrize(
    ("stored", "now", "refused_with"),
    [
        (C + AGE, C + AGE, None),  # stored at the edge of the window
        (C + AGE + 1, C + AGE + 1, "stored 300001 ms after"),  # a re-publication after it
        (C + 1_000, C + 3_600_000, None),  # stored young, queued an hour: a backlog runs
        (C + 1_000, C + TTL - SKEW, None),  # … up to the retention less the skew
        (C + 1_000, C + TTL - SKEW + 1, "older than the state"),  # then its state may be gone
        (C - SKEW, C - SKEW, None),  # dated ahead of the stored time, within the skew
        (C - SKEW - 1, C, "in the future of the time it was stored"),
    ],
)
async def test_the_stored_time_decides_and_the_state_bounds_the_wait(
    stored: int, now: int, refused_with: str | None
) -> None:
    message = await _refused(C, now, stored)
    if refused_with is None:
        assert message is None
    else:
        assert message is not None
        assert refused_with in message


async def test_a_republication_is_refused_whenever_a_backlog_is_not() -> None:
    """The same bytes, the same fetch time: the original stored young runs, the copy
    stored after the window does not (only the stored time differs)."""
    now = C + 3_600_000
    assert await _refused(C, now, stored=C + 5) is None
    assert await _refused(C, now, stored=now) is not None


async def test_without_a_stored_time_the_fetch_time_decides() -> None:
    assert await _refused(C, C + AGE, None) is None
    message = await _refused(C, C + AGE + 1, None)
    assert message is not None
    assert "seen 300001 ms after" in message
    message = await _refused(C, C - SKEW - 1, None)
    assert message is not None
    assert "in the future of now" in message
