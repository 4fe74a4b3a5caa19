"""The read retry policy waits between attempts (worker/operations/retry.py): each retry
sleeps a full-jitter delay from the upper half of a doubling ceiling, so a temporary failure
is not hammered, and the last failure leaves unchanged when the retries are spent.
(AIP conformance `retry_exhaustion.backoff_observed`.)"""

from __future__ import annotations

import itertools
import time

import pytest

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.operations.retry import ReadRetryPolicy, retry_read


@pytest.mark.aip_family("retry_exhaustion", assertions=["backoff_observed"])
async def test_a_read_retry_waits_a_growing_jittered_backoff() -> None:
    policy = ReadRetryPolicy(retries=3, base_delay_s=0.02, max_delay_s=1.0)
    attempts: list[float] = []

    async def attempt() -> None:
        attempts.append(time.monotonic())
        raise ConnectorError(ErrorCode.REMOTE_TEMPORARY, "503", remote_status=503)

    with pytest.raises(ConnectorError) as raised:
        await retry_read(policy, lambda: 30.0, attempt)

    assert raised.value.remote_status == 503
    assert len(attempts) == 1 + policy.retries
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    # Retry i sleeps at least half its ceiling, min(max, base * 2**i): 10, 20, 40 ms.
    for index, gap in enumerate(gaps):
        assert gap >= policy.base_delay_s * 2**index / 2 * 0.9, (index, gaps)
    assert gaps[2] > gaps[0]


async def test_a_definitive_failure_is_not_retried_and_does_not_wait() -> None:
    attempts: list[float] = []

    async def attempt() -> None:
        attempts.append(time.monotonic())
        raise ConnectorError(ErrorCode.REMOTE_REJECTED, "404", remote_status=404)

    with pytest.raises(ConnectorError):
        await retry_read(ReadRetryPolicy(retries=3, base_delay_s=0.5), lambda: 30.0, attempt)
    assert len(attempts) == 1
