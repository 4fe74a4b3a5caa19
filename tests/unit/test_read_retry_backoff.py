"""The read retry policy waits between attempts (worker/operations/retry.py): each retry
sleeps a full-jitter delay from the upper half of a doubling ceiling, so a temporary failure
is not hammered, and the last failure leaves unchanged when the retries are spent.
(AIP conformance `retry_exhaustion.backoff_observed`.)"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from schemas.aip.extensions import RetryPolicyFacts
from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.operations.retry import NO_RETRY, ReadRetryPolicy, retry_read


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


async def test_only_a_spent_policy_names_its_attempts_on_the_error() -> None:
    """`retry_exhausted` (what the result keeps and the DLQ entry is made of) is set when
    every attempt the policy allows failed retryably; a definitive answer, a stop for the
    deadline and a policy without retries (unsafe operations) leave it unset."""

    def failing(code: ErrorCode) -> Any:
        async def attempt() -> None:
            raise ConnectorError(code, "failed")

        return attempt

    fast = ReadRetryPolicy(retries=2, base_delay_s=0.001, max_delay_s=0.002)
    with pytest.raises(ConnectorError) as spent:
        await retry_read(fast, lambda: 30.0, failing(ErrorCode.TRANSPORT))
    assert spent.value.retry_exhausted is not None
    assert spent.value.retry_exhausted.attempts == 3
    assert spent.value.retry_exhausted.policy == RetryPolicyFacts(
        max_attempts=3, initial_backoff_ms=1, max_backoff_ms=2, backoff_multiplier=2
    )

    for policy, remaining, code in (
        (fast, 30.0, ErrorCode.REMOTE_REJECTED),  # definitive
        (ReadRetryPolicy(retries=2, base_delay_s=1.0), 0.5, ErrorCode.REMOTE_TEMPORARY),
        (NO_RETRY, 30.0, ErrorCode.REMOTE_TEMPORARY),
    ):
        with pytest.raises(ConnectorError) as raised:
            await retry_read(policy, itertools.repeat(remaining).__next__, failing(code))
        assert raised.value.retry_exhausted is None, (policy, code)
