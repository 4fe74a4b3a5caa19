"""The qualification driver against two real Hermes 0.19.0 it starts: every item must pass.

This is the CI run of `python -m worker.testing.qualify_local` (the command that regenerates the
committed record in docs/qualification/): NATS and Redis are the test's own servers (it is
marked `chaos`: the driver restarts Redis), the gateway and one worker per instance are
processes, both Hermes are `hermes-agent==0.19.0` driven by the project's fake LLM. A failed
or skipped item fails the test with the driver's own line for it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.testing.services import ServiceHandle

pytestmark = pytest.mark.real_hermes

#: Generous for a loaded 2-core machine; a warm run takes well under a minute.
TIMEOUT_S = 240


@pytest.mark.chaos
@pytest.mark.timeout(TIMEOUT_S)
async def test_two_real_hermes_qualify(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> None:
    from worker.qualify.items import Status
    from worker.testing.qualify_local import qualify_locally

    record = tmp_path / "record"
    report = await qualify_locally(
        tmp_path / "deployment", record, nats_server=nats_server, redis=redis_server
    )
    not_passed = [r.line() for r in report.results if r.status is not Status.PASS]
    assert not not_passed, "\n".join(not_passed)
    assert [r.number for r in report.results] == list(range(1, 11))
    document = json.loads((record / "qualification-record.json").read_text())
    assert document["verdict"] == "qualified"
    assert document["runs_left_behind"] == []
    assert {e: f["version"] for e, f in document["hermes"].items()} == {
        "hermes-1": "0.19.0",
        "hermes-2": "0.19.0",
    }
    assert (record / "qualification-record.md").read_text().startswith("# Qualification record")
