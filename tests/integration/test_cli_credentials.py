"""Every CLI command honours the Redis and NATS credential settings a worker does (issue 19):
`approve`, `approval show`, `binding show` and `reconcile` read `AIPD_REDIS_PASSWORD_FILE`
(nothing in the URL), and `provision` takes the NATS user and password file from its flags."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nats_process import nats_process
from worker.client import AipClient
from worker.operator.binding import BindingState, OperatorBinding, encode_binding
from worker.store.keys import binding_key
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
    write_trust_files,
)
from worker.testing.redis_server import RedisServer

PASSWORD = "cli-redis-password-" + "7" * 16
EXIT_FAILED = 1
UNKNOWN_ID = "act_" + "d" * 32
BOUND_ID = "act_" + "e" * 32


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )


def _unknown_binding() -> bytes:
    """An operator binding whose start outcome is unknown: what `reconcile` is for."""
    return encode_binding(
        OperatorBinding(
            action_id=BOUND_ID,
            request_fingerprint="f",
            endpoint_id="h1",
            session_id=f"aip-operator-{BOUND_ID}",
            status=BindingState.OUTCOME_UNKNOWN,
            created_at=0,
            updated_at=0,
        )
    )


def _secret(path: Path, value: str) -> Path:
    path.write_text(value)
    path.chmod(0o600)
    return path


@pytest.fixture
def locked_redis() -> Iterator[RedisServer]:
    with RedisServer(appendonly=False, password=PASSWORD) as server:
        yield server


def test_redis_commands_use_the_password_file(locked_redis: RedisServer, tmp_path: Path) -> None:
    trust = write_trust_files(tmp_path)
    action = AipClient(None, sign_key=trust.seed_file).build_action(  # type: ignore[arg-type]
        endpoint_id="h1",
        operation="models",
        input={},
        principal_id=USER_UNTENANTED,
        principal_kind=PRINCIPAL_KIND,
        authentication_issuer=ISSUER,
        credential_revision=REVISION,
    )
    action_file = tmp_path / "action.json"
    action_file.write_bytes(trust.seal_action(action, signed=False))  # as --write-action
    base = {
        "AIPD_REDIS_URL": locked_redis.url,  # no password in it
        "AIPD_APPROVAL_AUTHORITY_FILE": str(trust.authority_file),
        "AIPD_HERMES_ENDPOINTS": "h1=http://127.0.0.1:1",
    }
    approve = (
        "approve", action.id, "--action-file", str(action_file),
        "--as", APPROVER_UNTENANTED, "--reason", "checked by the test",
        "--key", str(trust.approver_seed_files[APPROVER_UNTENANTED]),
    )  # fmt: skip
    commands = {
        "approve": approve,
        "approval show": ("approval", "show", action.id),
        "binding show": ("binding", "show", UNKNOWN_ID),
        "reconcile": (
            "reconcile", UNKNOWN_ID, "--decision", "escalated", "--decided-by", "ops",
            "--note", "test",
        ),
    }

    # Without the password file Redis refuses every one of them.
    for name, args in commands.items():
        refused = run_cli(*args, env=base)
        assert refused.returncode == 3, (name, refused.stderr)

    with_file = {**base, "AIPD_REDIS_PASSWORD_FILE": str(_secret(tmp_path / "pw", PASSWORD))}
    approved = run_cli(*approve, env=with_file)
    assert approved.returncode == 0, approved.stderr
    shown = run_cli(*commands["approval show"], env=with_file)
    assert shown.returncode == 0, shown.stderr
    assert action.id in shown.stdout
    assert APPROVER_UNTENANTED in shown.stdout
    # Connected and answered: no binding exists for this id (a command failure, exit 1).
    for name in ("binding show", "reconcile"):
        done = run_cli(*commands[name], env=with_file)
        assert done.returncode == EXIT_FAILED, (name, done.stderr)
        assert "no operator binding exists" in done.stderr
    # And with a binding to show and reconcile, both succeed.
    with locked_redis.client(decode_responses=False) as admin:
        # The fields the operator scripts write (operator_create.lua).
        fields = {"doc": _unknown_binding(), "revision": 1, "state": "outcome_unknown"}
        admin.hset(binding_key(BOUND_ID), mapping=fields)  # type: ignore[arg-type]
    bound = run_cli("binding", "show", BOUND_ID, env=with_file)
    assert bound.returncode == 0, bound.stderr
    assert '"status": "outcome_unknown"' in bound.stdout
    reconciled = run_cli(
        "reconcile", BOUND_ID, "--decision", "escalated", "--decided-by", "ops", "--note", "test",
        env=with_file,
    )  # fmt: skip
    assert reconciled.returncode == 0, reconciled.stderr
    assert '"status": "recorded"' in reconciled.stdout
    # The same through the flag instead of the environment.
    flagged = run_cli(
        *commands["approval show"], "--redis-password-file", str(tmp_path / "pw"), env=base
    )
    assert flagged.returncode == 0, flagged.stderr
    everything = (
        approved.stdout + approved.stderr + shown.stderr + flagged.stderr
        + bound.stdout + bound.stderr + reconciled.stdout + reconciled.stderr
    )  # fmt: skip
    assert PASSWORD not in everything


def test_provision_uses_the_nats_user_and_password_file_of_its_flags(tmp_path: Path) -> None:
    with nats_process(
        "-js", "-sd", str(tmp_path), "--user", "provisioner", "--pass", PASSWORD
    ) as url:
        base = {"AIPD_NATS_URL": url}
        # PATH's nats-server may be older than the release check accepts (Debian: 2.9.10);
        # that check is tests/integration/test_provision_store.py's.
        args = (
            "provision", "--hermes-endpoints", "h1=http://127.0.0.1:1",
            "--allow-nats-below-minimum",
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while (anonymous := run_cli(*args, env=base)).returncode != 3:
            assert time.monotonic() < deadline, anonymous.stderr
            time.sleep(0.2)
        password_file = _secret(tmp_path / "nats_pw", PASSWORD)
        done = run_cli(
            *args, "--nats-user", "provisioner", "--nats-password-file", str(password_file),
            env=base,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "AIP_HERMES_ACTIONS" in done.stdout
        assert PASSWORD not in done.stdout + done.stderr
