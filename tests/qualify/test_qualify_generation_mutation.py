"""Item 5 fails when one approval generation may take two decisions (issue 27, item 6: the
item must exercise a live later generation, proved by mutation).

The same local deployment as `test_qualify_two_real_hermes.py` (two real Hermes 0.19.0 driven
by the project's fake LLM), item 5 only, with its workers started through
`tests.chaos.launcher` and the planted bug `two_decisions_per_generation`: the approval
ledger no longer sees that a generation was already answered. The production code has no
switch for it; the launcher patches the worker process before it starts. The item must fail,
and say it saw a second decision for one generation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.launcher import MUTATION_ENV
from worker.testing.services import ServiceHandle

pytestmark = pytest.mark.real_hermes

#: Generous for a loaded 2-core machine; a warm run takes about a minute.
TIMEOUT_S = 240


@pytest.mark.timeout(TIMEOUT_S)
async def test_item_5_fails_when_a_generation_takes_two_decisions(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> None:
    from worker.qualify.items import Status
    from worker.testing.qualify_local import qualify_locally

    report = await qualify_locally(
        tmp_path / "deployment",
        None,
        nats_server=nats_server,
        redis=redis_server,
        only=(5,),
        worker_module="tests.chaos.launcher",
        worker_extra_env={MUTATION_ENV: "two_decisions_per_generation"},
    )
    (result,) = report.results
    assert result.status is Status.FAIL, result.line()
    assert "one decision per generation" in result.detail or "for 2 prompts" in result.detail, (
        result.line()
    )
    print(result.line())
