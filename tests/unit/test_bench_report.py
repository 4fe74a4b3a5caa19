"""The bench report's per-round lead: each round's ratio to the best peer of that round."""

from __future__ import annotations

from tests.bench.report import lead_by_round
from tests.bench.throughput import Throughput


def _sample(system: str, rate: float, round_: int, workers: int = 1) -> Throughput:
    return Throughput(
        system=system, workers=workers, actions=1000, seconds=1000 / rate,
        actions_per_s=rate, cpu_ms_per_action=2.0, redis_sent_per_action=8.0,
        redis_executed_per_action=64.0, http_per_action=2.0, nats_cpu=0.1, redis_cpu=0.1,
        fake_cpu=0.3, bench_cpu=0.1, sent_breakdown={}, round=round_,
    )  # fmt: skip


def test_each_round_is_divided_by_the_best_peer_of_that_round() -> None:
    results = [
        # A fast round and a slow one: the medians of the rates over rounds would pair
        # ours of one round with a peer of the other.
        _sample("ours", 600, 1), _sample("arq", 500, 1), _sample("faststream", 400, 1),
        _sample("ours", 300, 2), _sample("arq", 200, 2), _sample("faststream", 250, 2),
        _sample("ours", 450, 3), _sample("arq", 500, 3),
        _sample("ours", 900, 1, workers=2), _sample("arq", 600, 1, workers=2),
    ]  # fmt: skip

    lines = lead_by_round(results).splitlines()

    assert lines == [
        "ours x1 / the best peer of the same round: median 1.20x over 3 round(s) "
        "(1.20, 1.20, 0.90)",
        "ours x2 / the best peer of the same round: median 1.50x over 1 round(s) (1.50)",
    ]


def test_samples_without_a_round_or_a_peer_give_no_ratio() -> None:
    alone = [_sample("ours", 500, 0), _sample("arq", 400, 0), _sample("ours", 500, 1)]

    assert lead_by_round(alone) == "(no round measured ours beside a peer)"
