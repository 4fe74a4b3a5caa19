"""`python -m tests.bench.our_worker`: the production `aip-hermes-worker run`, counted.

The same process as `python -m worker run` plus the Redis send counter of
`tests.bench.counting`. It refuses to start when the runtime does not register the operator
capability, so a table can never report another operation under the operator's name.
"""

from __future__ import annotations

import cProfile
import os
import sys

from tests.bench import counting
from worker import wiring
from worker.settings import Settings

PROFILE_ENV = "AIPD_BENCH_PROFILE"


def _check_operator_registered() -> None:
    registry = wiring.build_registry(Settings())
    if registry.get("operator") is None:
        sys.exit("the runtime registry has no `operator` capability: nothing to benchmark")


def _run() -> int:
    from worker.commands.cli import main

    return main(["run"])


if __name__ == "__main__":
    counting.install()
    _check_operator_registered()
    profile_to = os.environ.get(PROFILE_ENV)
    if not profile_to:
        sys.exit(_run())
    # Finding where the CPU goes: `AIPD_BENCH_PROFILE=out.prof` writes cProfile stats
    # (slower by about 2x, so never set while measuring a figure).
    profiler = cProfile.Profile()
    code = profiler.runcall(_run)
    profiler.dump_stats(profile_to)
    sys.exit(code)
