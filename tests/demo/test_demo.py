"""`aip-hermes-worker demo` as a new user runs it: the whole story works, quickly, and leaves
nothing behind — also when it is interrupted half way."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker.demo.console import SUMMARY_TITLE, VERDICT_PREFIX
from worker.testing._procs import port_accepts
from worker.testing.pytest_plugin import service_unavailable
from worker.testing.services import find_nats_server, find_redis_server

pytestmark = pytest.mark.demo

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("a", "b", "c", "d1", "d2", "e", "f", "g", "h")
#: The issue's promise on a 2-core machine, for the whole command (start to cleanup).
BUDGET_S = 60.0


def _env() -> dict[str, str]:
    # The demo ignores AIPD_* itself; the test also keeps fault points and URLs out of it.
    return {k: v for k, v in os.environ.items() if not k.startswith("AIPD_")}


@pytest.fixture(autouse=True)
def _servers_exist() -> None:
    if find_nats_server() is None or find_redis_server() is None:
        service_unavailable("the demo needs nats-server and redis-server (or their wheels)")


def _summary_rows(output: str) -> dict[str, str]:
    """Step key -> its summary row, from the table after the `summary` line."""
    lines = output.splitlines()
    start = lines.index(SUMMARY_TITLE)
    rows = {}
    for line in lines[start + 3 :]:
        if not line.strip():
            break
        key = line.split()[0]
        rows[key] = line
    return rows


def test_short_demo_reaches_every_expected_state_within_a_minute() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "worker", "demo", "--short"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=BUDGET_S * 2,
    )
    elapsed = time.monotonic() - started
    output = done.stdout
    assert done.returncode == 0, output + done.stderr
    rows = _summary_rows(output)
    assert sorted(rows) == sorted(STEPS), output
    for key in STEPS:
        assert rows[key].rstrip().endswith(" yes"), rows[key]
    verdict = [line for line in output.splitlines() if line.startswith(VERDICT_PREFIX)]
    assert verdict[0].startswith(f"{VERDICT_PREFIX} 9/9 steps reached"), output
    # Live output: every Action's chunks were printed as they came, with status lines.
    assert output.count("→ published") == 8
    # Step h follows the delivery Action the channel egress rule made of step a's result.
    assert output.count("■ act_") == 9
    assert "pending_approval" in output
    assert "kill -9 demo-w" in output
    assert elapsed < BUDGET_S, f"the demo took {elapsed:.1f} s"


def test_interrupted_demo_stops_every_process_it_started() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "demo"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    output: list[str] = []
    try:
        deadline = time.monotonic() + BUDGET_S
        for line in proc.stdout:
            output.append(line)
            if line.startswith("[c]") or time.monotonic() > deadline:
                break
        text = "".join(output)
        assert "[c]" in text, text
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        rest, _ = proc.communicate(timeout=60)
        text += rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, text
    assert "every process it started is stopped" in text
    ports = [int(p) for p in re.findall(r"://127\.0\.0\.1:(\d+)", text.split("[a]")[0])]
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", text)]
    assert len(ports) == 4, text  # nats, redis, the AIP MCP server, hermes
    assert len(pids) == 2, text  # the two workers
    assert not [port for port in ports if port_accepts(port)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
