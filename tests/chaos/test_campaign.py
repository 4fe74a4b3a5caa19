"""The short seeded campaign of the normal suite, and the proof that its checker finds a
planted bug (issue #29).

Each campaign deploys NATS, Redis, the fake Hermes and three worker processes, plays the
seed's fault schedule for `SCHEDULE_S` seconds while the workload runs, heals, waits for
every acknowledged Action's result, and checks (tests/chaos/checker.py). On a violation the
assertion message is `Report.explain()`: the seed, the schedule, and the history around it.
Longer campaigns: `./dev chaos --minutes N --seed S` (docs/reliability.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.campaign import run_campaign
from tests.chaos.deployment import NO_DURABLE_NATS, durable_nats_server

#: The short campaign: these seeds, each this long (about 45 s of wall time apiece).
SHORT_SEEDS = (1, 2)
SCHEDULE_S = 20.0
#: A planted bug shows when a fault meets a request in flight, which a 20 s schedule does
#: not always arrange: the mutation tests go on to the next seed until one finds it (each
#: was found by seed 1 or 2 in every run so far); the third is there for a loaded machine.
MUTATION_SEEDS = (1, 2, 3)

#: The campaign judges the durability settings the project ships, on a release it accepts.
pytestmark = pytest.mark.skipif(durable_nats_server() is None, reason=NO_DURABLE_NATS)


@pytest.mark.timeout(400)
async def test_the_short_seeded_campaign_breaks_no_guarantee(tmp_path: Path) -> None:
    for seed in SHORT_SEEDS:
        report = await run_campaign(seed, SCHEDULE_S, root=tmp_path / f"seed-{seed}")
        print(report.summary())
        assert report.injected, "the nemesis injected nothing"
        assert report.acked > 20, report.summary()
        assert not report.unknown, report.explain()


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    os.environ.get("AIPD_CHAOS_MUTATIONS") != "1",
    reason="two more 20 s campaigns of 3 workers each, which starve the suite's real-Hermes "
    "tests on 2 cores: run with AIPD_CHAOS_MUTATIONS=1 (or ./dev chaos --mutation NAME)",
)
@pytest.mark.parametrize(
    ("mutation", "rule"),
    [
        # A worker paused or cut off past its lease still settles: its result carries a
        # fence lower than the one the next owner acquired.
        ("stale_settle", "fence"),
        # The next owner re-sends an unbound operator start: two POST /v1/runs.
        ("resend_unbound_start", "start_once"),
    ],
)
async def test_the_checker_finds_a_planted_bug_within_the_short_campaign(
    tmp_path: Path, mutation: str, rule: str
) -> None:
    summaries = []
    for seed in MUTATION_SEEDS:
        report = await run_campaign(
            seed, SCHEDULE_S, mutation=mutation, root=tmp_path / f"seed-{seed}"
        )
        summaries.append(report.summary())
        print(report.summary())
        if rule in report.rules():
            return
    pytest.fail(f"mutation {mutation} was not found by rule {rule}: {summaries}")
