"""One Hermes request per Action: the shape shared by every non-streaming operation.

An operation is a spec plus a `build` function that turns its validated input into a
`HermesCall` (path ids, JSON body, query). The request always carries
`ctx.trusted_headers()` and nothing else from the caller: input types have no header field,
and the client sets the key and content type last. Read-only operations retry within the
read policy; unsafe ones make exactly one attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.result import ResultStatus
from worker.errors import ConnectorError, deadline_exceeded
from worker.hermes.http_client import HermesResponse
from worker.operations import partition
from worker.operations.base import ExecutionContext, OperationSpec, Outcome, Stateless
from worker.operations.retry import NO_RETRY, ReadRetryPolicy, retry_read


@dataclass(frozen=True, slots=True)
class HermesCall:
    """What one request sends besides the trusted headers."""

    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    query: dict[str, Any] | None = None


def body_of(params: msgspec.Struct, *, exclude: Collection[str] = ()) -> dict[str, Any]:
    """The input as a JSON body, without path fields and without unset or default fields.

    Input types set `omit_defaults`, so an absent optional field is absent on the wire too
    and Hermes applies its own default rather than one this worker guessed.
    """
    built = msgspec.to_builtins(params)
    assert isinstance(built, dict)
    return {key: value for key, value in built.items() if key not in exclude}


@asynccontextmanager
async def within_deadline(ctx: ExecutionContext, what: str) -> AsyncIterator[None]:
    """Bound a block by the Action's deadline; passing it is `deadline_exceeded`."""
    remaining = ctx.remaining_s()
    if remaining <= 0:
        raise deadline_exceeded(what)
    failure: ConnectorError | None = None
    try:
        async with asyncio.timeout(remaining):
            yield
    except TimeoutError:
        failure = deadline_exceeded(what)
    if failure is not None:
        raise failure


async def send(
    ctx: ExecutionContext,
    spec: OperationSpec,
    call: HermesCall,
    *,
    protected: bool = True,
    retry: ReadRetryPolicy = NO_RETRY,
) -> HermesResponse:
    """One request for `spec`, retried only when the spec is read-only."""

    async def attempt() -> HermesResponse:
        return await ctx.hermes.request_json(
            spec.method,
            spec.route,
            call.params,
            json_body=call.body,
            query=call.query,
            headers=ctx.trusted_headers(),
            protected=protected,
            total_timeout_s=ctx.remaining_s(),
        )

    policy = retry if spec.read_only else NO_RETRY
    return await retry_read(policy, ctx.remaining_s, attempt)


class JsonOperation(Stateless):
    """A request whose JSON answer is the Action's output. It publishes no chunk: a
    non-streaming capability's signed result is its whole answer, as upstream's connector
    answers it (aip-1.0-wire.md §7.3)."""

    def __init__(
        self,
        spec: OperationSpec,
        build: Callable[[Any], HermesCall],
        *,
        protected: bool = True,
        retry: ReadRetryPolicy = NO_RETRY,
    ) -> None:
        self.spec = spec
        self.build = build
        self.protected = protected
        self.retry = retry

    async def execute(self, ctx: ExecutionContext, params: Any) -> Outcome:
        params = await partition.guard(ctx, self.spec.name, params)
        response = await send(
            ctx, self.spec, self.build(params), protected=self.protected, retry=self.retry
        )
        # Screened before it becomes the output: another tenant's rows never reach the bus.
        return await partition.screen(
            ctx, self.spec.name, params, Outcome(ResultStatus.COMPLETED, response.body)
        )


def no_call(_: Any) -> HermesCall:
    """The call of an operation without input."""
    return HermesCall()
