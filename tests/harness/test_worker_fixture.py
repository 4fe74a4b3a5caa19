"""The plugin's `worker_process` fixture, in this suite (the README's fresh-venv run is
tests/harness/test_readme_fixtures.py): a real worker with real trust files, a signed and
verified round trip, and workers a test can add and kill like production processes."""

from __future__ import annotations

import os
import stat

from schemas.result import ResultStatus
from worker.testing.worker_fixture import WorkerDeployment


async def test_the_worker_signs_what_the_client_verifies(worker_process: WorkerDeployment) -> None:
    result = await worker_process.run("models")
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by.startswith(worker_process.worker.worker_id)
    assert worker_process.fake.stats().count("GET /v1/models") >= 1
    # The trust files are what a production worker demands: seeds owner-only.
    for seed in (worker_process.trust.seed_file, worker_process.trust.worker_seed_file):
        assert stat.S_IMODE(os.stat(seed).st_mode) == 0o600


async def test_a_second_worker_serves_when_the_first_is_killed(
    worker_process: WorkerDeployment,
) -> None:
    second = await worker_process.spawn("worker-2")
    worker_process.worker.kill()
    result = await worker_process.run("models", timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by.startswith(second.worker_id)
