"""The read retry policy: how a read-only operation rides out a temporary failure.

Only read-only operations use it (docs/architecture.md §7,
troubleshooting "Decide whether to retry"):
a temporary (429/5xx) or transport failure is retried a few times with jittered exponential
backoff, never past the Action's deadline. When every attempt the policy allows has failed
retryably, the error it gives up with names the attempts and the policy (`retry_exhausted`):
the failed result keeps them and the Action is dead-lettered once
(`worker/pipeline/exhausted.py`). A stop for the deadline is not exhaustion (the caller's
deadline is its own answer), nor is a definitive answer, nor a policy without retries
(`AIPD_HERMES_READ_RETRY_ATTEMPTS=0`, and every unsafe operation).

Unsafe operations are never retried here: their
5xx/transport failures leave as `uncertain_outcome: true, retryable: false`, and a refusal
Hermes made before starting anything (429, 503 `gateway_draining`) as certain and
`retryable: true`, for the runtime's own retry policy to decide.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from schemas.aip.extensions import RetryExhausted, RetryPolicyFacts
from schemas.errors import ErrorCode
from worker.errors import ConnectorError

T = TypeVar("T")

#: The codes a read may be retried on; everything else is a definitive answer.
RETRYABLE_READ_CODES = frozenset({ErrorCode.REMOTE_TEMPORARY, ErrorCode.TRANSPORT})
#: A retry is only worth starting with at least this much of the deadline left.
MIN_ATTEMPT_S = 0.05


@dataclass(frozen=True, slots=True)
class ReadRetryPolicy:
    """`retries` extra attempts after the first (`Settings.hermes_read_retry_attempts`)."""

    retries: int = 2
    base_delay_s: float = 0.1
    max_delay_s: float = 2.0

    def delay_s(self, retry_index: int) -> float:
        """Full jitter: spreads the retries of many workers hitting one endpoint at once."""
        ceiling = min(self.max_delay_s, self.base_delay_s * (2**retry_index))
        return random.uniform(ceiling / 2, ceiling)

    def facts(self) -> RetryPolicyFacts:
        """This policy in the reference runtime's terms (`ActionStatus.retry.policy`)."""
        return RetryPolicyFacts(
            max_attempts=1 + self.retries,
            initial_backoff_ms=round(self.base_delay_s * 1000),
            max_backoff_ms=round(self.max_delay_s * 1000),
            backoff_multiplier=2,
        )


NO_RETRY = ReadRetryPolicy(retries=0)


async def retry_read(
    policy: ReadRetryPolicy,
    remaining_s: Callable[[], float],
    attempt: Callable[[], Awaitable[T]],
) -> T:
    """Run `attempt`, retrying retryable read failures while the policy and deadline allow."""
    retry_index = 0
    while True:
        try:
            return await attempt()
        except ConnectorError as exc:
            if exc.code not in RETRYABLE_READ_CODES:
                raise
            if retry_index >= policy.retries:
                if policy.retries > 0:
                    exc.retry_exhausted = RetryExhausted(
                        attempts=retry_index + 1, policy=policy.facts()
                    )
                raise
            delay = policy.delay_s(retry_index)
            if remaining_s() - delay < MIN_ATTEMPT_S:
                raise
        retry_index += 1
        await asyncio.sleep(delay)
