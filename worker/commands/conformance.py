"""`aip-hermes-worker conformance --out DIR [--provider deterministic|live]`: run the tests
tagged with an AIP conformance family and write `DIR/conformance.json`, the 13 checks of
upstream's connector kit (docs/aip.md "Conformance report").

It needs a source checkout with the `test` extra: the evidence is this project's own test
suite, run by pytest in a child process with `worker.testing.conformance_plugin`.
`deterministic` runs every tagged test on the fake Hermes 0.19.0; `live` also runs the
variants that start a real hermes-agent 0.19.0 (with `CI=true`, so a real Hermes that cannot
be had fails those tests instead of skipping them). Exit codes: 0 every check passed, 1 a
check failed (the file is written either way), 2 no checkout or no outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from worker.commands.exit_codes import Exit

ROOT = Path(__file__).resolve().parents[2]
MARK = "mark.aip_family("
CONFORMANCE_ENDPOINT = "conformance"


def add_commands(subparsers: Any) -> None:
    """Register `conformance` (called from `worker.commands.cli.build_parser`)."""
    conformance = subparsers.add_parser(
        "conformance",
        help="run the family-tagged tests and write the AIP conformance report",
    )
    conformance.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="write DIR/conformance.json"
    )
    conformance.add_argument(
        "--provider",
        choices=("deterministic", "live"),
        default="deterministic",
        help="the fake Hermes 0.19.0 only, or also the real hermes-agent 0.19.0 variants",
    )
    conformance.add_argument(
        "--processes", type=int, default=2, metavar="N", help="pytest-xdist workers (0: none)"
    )
    conformance.set_defaults(func=cmd_conformance)


def tagged_files(tests: Path) -> list[Path]:
    """The test files that tag at least one test with a family (pytest collects only these)."""
    return sorted(p for p in tests.rglob("test_*.py") if MARK in p.read_text(encoding="utf-8"))


def manifest_and_admission() -> tuple[dict[str, Any], str, list[str]]:
    """The manifest a worker publishes for one endpoint under the default settings, its
    digest (`sha256:` + hex of its canonical JSON) and its admission issues."""
    import msgspec
    from jsonschema import Draft202012Validator

    from worker.aip.canonical import canonical_bytes
    from worker.conformance.admission import admit
    from worker.control import manifest_of
    from worker.endpoints import Endpoint, EndpointDescriptor
    from worker.settings import Settings
    from worker.wiring import build_registry

    url = "http://127.0.0.1:1"
    registry = build_registry(Settings(hermes_endpoints=f"{CONFORMANCE_ENDPOINT}={url}"))
    endpoint = Endpoint(
        descriptor=EndpointDescriptor(id=CONFORMANCE_ENDPOINT, url=url), api_key=None
    )
    manifest = msgspec.to_builtins(
        manifest_of(
            registry, endpoint, actions_subject=f"aip.hermes.{CONFORMANCE_ENDPOINT}.actions"
        )
    )
    digest = "sha256:" + hashlib.sha256(canonical_bytes(manifest)).hexdigest()
    issues = admit(manifest, registry, compile_schema=Draft202012Validator.check_schema)
    return manifest, digest, [str(issue) for issue in issues]


def run_pytest(files: list[Path], provider: str, processes: int, out: Path) -> int:
    """pytest on `files` with the conformance plugin; its exit status."""
    import subprocess

    command = [
        sys.executable, "-m", "pytest", *map(str, files),
        "-p", "worker.testing.conformance_plugin",
        "--aip-conformance-out", str(out),
        "--aip-conformance-provider", provider,
        "-q", "-p", "no:cacheprovider", "-rfE",
    ]  # fmt: skip
    if processes > 0:
        command += ["-n", str(processes)]
    env = dict(os.environ)
    if provider == "live":
        env["CI"] = "true"
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


def read_outcomes(path: Path) -> list[Any]:
    from worker.conformance.report import NodeOutcome, Tag

    rows = json.loads(path.read_text())["nodes"]
    return [
        NodeOutcome(
            nodeid=row["nodeid"],
            outcome=row["outcome"],
            hermes=row["hermes"],
            tags=tuple(Tag(t["family"], tuple(t["assertions"])) for t in row["tags"]),
            recorded=tuple(row["recorded"]),
        )
        for row in rows
    ]


async def cmd_conformance(args: argparse.Namespace) -> int:
    from worker.conformance.report import build_report
    from worker.operations.catalog import CONNECTOR_ID

    tests = ROOT / "tests"
    if not tests.is_dir():
        print(f"conformance needs a source checkout: no {tests}", file=sys.stderr)
        return Exit.CONFIGURATION
    files = tagged_files(tests)
    manifest, digest, issues = manifest_and_admission()
    with tempfile.TemporaryDirectory() as scratch:
        outcomes_file = Path(scratch) / "outcomes.json"
        status = await asyncio.to_thread(
            run_pytest, files, args.provider, args.processes, outcomes_file
        )
        if not outcomes_file.exists():
            print(f"pytest wrote no outcomes (exit {status})", file=sys.stderr)
            return Exit.CONFIGURATION
        outcomes = read_outcomes(outcomes_file)
    report = build_report(
        manifest=manifest,
        manifest_digest=digest,
        connector_id=CONNECTOR_ID,
        admission_issues=issues,
        provider=args.provider,
        outcomes=outcomes,
    )
    report["pytest_exit_status"] = status
    # Worker and Hermes start-up bounds are wall-clock: a report is read with its machine.
    report["machine"] = {
        "cpus": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "conformance.json"
    target.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    for check in report["checks"]:
        print(f"{'PASS' if check['passed'] else 'FAIL'} {check['name']}")
    print(f"wrote {target}")
    return Exit.OK if report["passed"] else Exit.FAILED
