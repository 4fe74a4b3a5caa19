"""The command line people reach for (issue 28 item 4): help for every flag of every
command, settings flags scoped to what a command reads, `--version`, `keys public`, shell
completion that bash accepts and that completes, ISO 8601 UTC times, and one table of exit
codes that README.md states as the code defines it."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from worker.aip.did_key import public_key_from_nkey
from worker.commands.cli import build_parser
from worker.commands.completion import bash_script, walk
from worker.commands.exit_codes import Exit, for_status
from worker.commands.failures import explain
from worker.commands.timestamps import iso_utc, with_iso
from worker.trust.signing import generate_keypair, write_seed_file

README = Path(__file__).resolve().parents[2] / "README.md"


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env=os.environ,
        check=False,
    )


def _commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return [(path, parser) for path, parser in walk(build_parser()) if path]


def test_every_flag_and_argument_of_every_command_has_help() -> None:
    missing = []
    for path, parser in walk(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    if not (choice.help or "").strip():
                        missing.append(f"{' '.join(path)} {choice.dest}")
                continue
            if not (action.help or "").strip():
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_every_command_has_a_non_empty_help_page() -> None:
    for path, parser in _commands():
        page = parser.format_help()
        assert page.count("\n") > 3, path
        # A description, a helped flag or argument, or subcommands (each helped, above).
        assert (parser.description or "").strip() or any(
            action.help or isinstance(action, argparse._SubParsersAction)
            for action in parser._actions
            if action.dest != "help"
        ), path


def test_settings_flags_are_scoped_to_what_a_command_reads() -> None:
    tree = dict(_commands())
    approve = tree[("approve",)].format_help()
    assert "--approver-redis-url" in approve
    assert "--approval-authority-file" in approve
    for worker_only in (
        "--lease-ttl-ms",
        "--concurrency",
        "--hermes-operator-model",
        "--metrics-port",
    ):
        assert worker_only not in approve, worker_only
    assert "--lease-ttl-ms" in tree[("run",)].format_help()  # a worker takes every setting
    assert "--nats-url" in tree[("escalations", "list")].format_help()
    assert "--concurrency" not in tree[("escalations", "list")].format_help()


def test_gateway_help_lists_the_settings_it_reads() -> None:
    from worker.gateway.settings import GatewaySettings

    page = run_cli("gateway", "--help")
    assert page.returncode == 0
    for name in GatewaySettings.model_fields:
        assert f"AIPD_{name.upper()}" in page.stdout
    assert "AIPD_GATEWAY_SIGNING_KEY_FILE" in page.stdout


def test_version_is_the_installed_distribution_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"aip-hermes-worker {version('aip-hermes-worker')}"


def test_keys_public_prints_the_nkey_and_the_did_key(tmp_path: Path) -> None:
    pair = generate_keypair()
    seed_file = tmp_path / "approver.seed"
    write_seed_file(seed_file, pair.seed)
    expected = [pair.public_key, public_key_from_nkey(pair.public_key).did]
    from_file = run_cli("keys", "public", str(seed_file))
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout.split() == expected
    assert expected[1].startswith("did:key:z6Mk")
    from_stdin = run_cli("keys", "public", "-", stdin=pair.seed.decode())
    assert from_stdin.stdout.split() == expected
    given = run_cli("keys", "public", pair.seed.decode())
    assert given.stdout.split() == expected
    assert "visible to other users" in given.stderr  # a seed on a command line is warned
    assert pair.seed.decode() not in given.stderr + given.stdout


def test_keys_public_refuses_what_is_not_a_seed_in_one_line(tmp_path: Path) -> None:
    unsafe = tmp_path / "unsafe.seed"
    write_seed_file(unsafe, generate_keypair().seed)
    unsafe.chmod(0o644)
    for argument in (str(unsafe), "-"):
        done = run_cli("keys", "public", argument, stdin="not a seed")
        assert done.returncode == Exit.CONFIGURATION
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_completion_script_is_valid_bash_and_completes(tmp_path: Path) -> None:
    script = tmp_path / "completion.bash"
    done = run_cli("completion", "bash")
    assert done.returncode == 0
    script.write_text(done.stdout)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert done.stdout == bash_script(build_parser())

    def complete(*words: str) -> list[str]:
        probe = (
            f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
            f"COMP_CWORD={len(words) - 1}; _aip_hermes_worker; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        ran = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
        return ran.stdout.split()

    assert complete("aip-hermes-worker", "ke") == ["keys"]
    assert complete("aip-hermes-worker", "keys", "") == ["generate", "public", "-h", "--help"]
    assert complete("aip-hermes-worker", "tail", "act_x", "--format", "") == ["json", "text"]
    assert "--sign-key" in complete("aip-hermes-worker", "submit", "--endpoint", "h1", "--")
    assert "--sign-key" not in complete("aip-hermes-worker", "tail", "--")
    assert complete("aip-hermes-worker", "completion", "") == ["bash", "zsh", "-h", "--help"]
    zsh = run_cli("completion", "zsh")
    assert zsh.returncode == 0
    assert "bashcompinit" in zsh.stdout
    assert done.stdout in zsh.stdout


def test_timestamps_are_iso_8601_utc_with_milliseconds() -> None:
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1_764_641_075_123) == "2025-12-02T02:04:35.123Z"
    document = {
        "escalation": {"raised_at_unix_ms": 1_000, "kind": "approval"},
        "resolution": None,
        "chunks": [{"ts_unix_ms": 2_500}],
        "deadline_unix_ms": None,
    }
    assert with_iso(document) == {
        "escalation": {
            "raised_at_unix_ms": 1_000,
            "raised_at_utc": "1970-01-01T00:00:01.000Z",
            "kind": "approval",
        },
        "resolution": None,
        "chunks": [{"ts_unix_ms": 2_500, "ts_utc": "1970-01-01T00:00:02.500Z"}],
        "deadline_unix_ms": None,
    }


def test_the_readme_exit_code_table_is_the_exit_enum() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Exit codes") :]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", section, flags=re.MULTILINE)
    assert [(int(code), name) for code, name in rows] == [(int(e), e.name.lower()) for e in Exit]


def test_every_result_status_has_its_exit_code() -> None:
    from schemas.result import ResultStatus

    assert for_status(ResultStatus.COMPLETED) is Exit.OK
    assert for_status(ResultStatus.FAILED) is Exit.FAILED
    assert for_status(ResultStatus.CANCELLED) is Exit.FAILED
    assert for_status(ResultStatus.REQUIRES_HUMAN) is Exit.REQUIRES_HUMAN


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (FileNotFoundError(2, "No such file or directory", "/x/action.json"), Exit.CONFIGURATION),
        (ConnectionRefusedError(111, "Connection refused"), Exit.UNREACHABLE),
        (ValueError("not a user nkey seed"), Exit.CONFIGURATION),
    ],
)
def test_expected_failures_become_one_line_and_bugs_do_not(exc: BaseException, code: Exit) -> None:
    args = argparse.Namespace(command="submit", nats_url="nats://127.0.0.1:4222")
    explained = explain(exc, args)
    assert explained is not None
    assert explained[0] is code
    assert "\n" not in explained[1]
    assert explain(RuntimeError("a bug"), args) is None
    assert explain(KeyError("a bug"), args) is None
