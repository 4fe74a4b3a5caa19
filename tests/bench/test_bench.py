"""The figures as pytest cases (`pytest tests/bench -m bench -s`), at a smaller scale.

They print the same tables as `python -m tests.bench`. None asserts a timing: what they
check is what every figure presupposes, the work itself — every Action completed, exactly
the operator's two HTTP requests, every relayed event arrived, no start repeated after a
kill, no lease lost while holding many runs. Timings are for the tables, never for a verdict.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.bench import BenchExtraMissing, require

try:
    require("psutil")
except BenchExtraMissing as exc:
    # Collected by every run (and deselected by `-m 'not bench'`): without the bench extra the
    # module is skipped with the install command instead of failing collection.
    pytest.skip(str(exc), allow_module_level=True)

from tests.bench import counting, inflight, recovery, relay, report, throughput
from tests.bench.env import Bench

pytestmark = [
    pytest.mark.bench,
    # arq 0.28 (installed --no-deps beside redis-py 8) still passes redis-py's deprecated
    # `retry_on_timeout`; the warning is arq's, and every other warning stays an error.
    pytest.mark.filterwarnings("ignore:.*retry_on_timeout.*:DeprecationWarning"),
]

ACTIONS = 300
FLOOD = 3_000


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    counting.install()
    session = Bench.start()
    try:
        yield session
    finally:
        session.close()


async def test_throughput_one_process_every_system(bench: Bench) -> None:
    results = [await throughput.measure(bench, s, 1, ACTIONS) for s in throughput.SYSTEMS]
    print("\n" + report.throughput_table(results))
    print(report.breakdown_table(results))
    # measure() raises unless every Action completed; each takes POST + one event stream.
    for result in results:
        assert result.http_per_action == pytest.approx(2.0), result.system


async def test_chunk_relay_delivers_every_event(bench: Bench) -> None:
    ours, sample = await relay.ours_max_rate(bench, FLOOD)
    raw = await relay.raw_publish_rate(bench, sample, FLOOD)
    latency = [await relay.ours_latency(bench, 500), await relay.raw_relay_latency(bench, 500)]
    print("\n" + report.relay_tables([ours, raw], latency))
    # Every flooded event and every event of the run itself, each exactly once.
    assert ours.chunks == FLOOD + relay.OWN_EVENTS


async def test_kill_nine_reowns_without_a_second_start(bench: Bench) -> None:
    results = [await recovery.measure(bench, s) for s in ("ours", "raw")]
    print("\n" + report.recovery_table(results))
    ours = results[0]
    assert ours.in_flight == recovery.IN_FLIGHT_RUNS
    assert ours.reowned == ours.in_flight
    assert ours.duplicate_starts == 0


async def test_many_runs_held_without_losing_a_lease(bench: Bench) -> None:
    held = await inflight.measure(bench, 300)
    print("\n" + report.inflight_table([held]))
    assert held.started == held.runs
    assert held.leases_lost == 0
    assert held.ackwait_expiries == 0
