"""The compose Redis ACL (compose/redis/users.acl) replayed against issue 24's attacks.

The attack pass found that the workers' Redis user could delete a denial (after which an
approval ran the Action), delete the evidence an approval key keeps, `SCAN` every key and
run `FUNCTION FLUSH`; and that `escalations resolve` and the `escalations_open` gauge needed
the admin password. Here compose/redis/redis.conf runs with that very ACL file: the worker's
user may only read approvals and escalation resolutions, a separate approver user writes
them, and a real worker process holding only the worker password completes Actions, one of
them approved through the `approve` command as the approver.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import redis
import redis.asyncio
from redis.exceptions import NoPermissionError

from schemas.escalation import Escalation, EscalationKind, EscalationResolution, ResolutionKind
from schemas.ids import capability_id, new_action_id
from schemas.result import ResultStatus
from subjects.grammar import Subjects
from tests.compose.test_compose_files import (
    COMPOSE,
    ENDPOINT,
    INBOX_PREFIXES,
    compose_nats,
    compose_redis,
)
from tests.compose.test_role_attacks import User, roles
from tests.integration.stack import fake_stack
from worker.bus.publisher import BusPublisher
from worker.escalation.build import escalation_id
from worker.escalation.gauge import EndpointEscalations
from worker.escalation.ledger import record_resolution
from worker.store.keys import approvals_key, binding_key, escalation_resolution_key
from worker.store.operator_store import OperatorStore
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    write_trust_files,
)
from worker.testing.services import ServiceHandle
from worker.trust.approval_ledger import ApprovalRecords
from worker.trust.responses import ResponseSigner
from worker.trust.signing import TrustedGatewayKeys, generate_keypair, write_seed_file

__all__ = ["compose_nats", "compose_redis", "roles"]  # fixtures, imported so pytest finds them

DENIED_ID = "act_" + "d" * 32
ESCALATION_ID = "esc_" + "e" * 32


def _password(name: str) -> str:
    return (COMPOSE / "secrets" / name).read_text(encoding="utf-8").strip()


def _client(port: int, user: str, secret: str) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(port=port, username=user, password=_password(secret))


def _secret_copy(tmp_path: Path, name: str) -> Path:
    """An owner-only copy (a checkout leaves the committed file group-readable)."""
    path = tmp_path / name
    shutil.copyfile(COMPOSE / "secrets" / name, path)
    os.chmod(path, 0o600)
    return path


async def test_the_worker_user_cannot_undo_a_decision_or_sweep_the_store(
    compose_redis: int,
) -> None:
    admin = _client(compose_redis, "admin", "redis_admin_password")
    worker = _client(compose_redis, "aipworker", "redis_worker_password")
    try:
        # A denial, as the approver's script stores it, and a resolved escalation.
        denial = approvals_key(DENIED_ID)
        slot = "decision:approver:demo"
        await admin.hset(
            denial, mapping={slot: "denied", "record:approver:demo": "{}", "revision": 1}
        )
        resolution = escalation_resolution_key(ESCALATION_ID)
        await admin.set(resolution, b"{}")
        for attempt in (
            lambda: worker.delete(denial),
            lambda: worker.unlink(denial),
            lambda: worker.hset(denial, slot, "approved"),
            lambda: worker.hdel(denial, slot),
            lambda: worker.expire(denial, 1),
            lambda: worker.rename(denial, denial + ":x"),
            lambda: worker.delete(resolution),
            lambda: worker.set(resolution, b"forged"),
            lambda: worker.scan(0),
            lambda: worker.keys("*"),
            lambda: worker.randomkey(),
            lambda: worker.execute_command("FUNCTION", "FLUSH"),
            lambda: worker.execute_command("FUNCTION", "LIST"),
            lambda: worker.execute_command("SCRIPT", "FLUSH"),
            lambda: worker.flushall(),
            lambda: worker.flushdb(),
            # A script may not do it for the worker either: EVAL's keys count as written.
            lambda: worker.eval("return redis.call('DEL', KEYS[1])", 1, denial),
        ):
            with pytest.raises(NoPermissionError):
                await attempt()
        # Both are still there, unchanged, and the worker still reads the denial.
        assert await admin.hget(denial, slot) == b"denied"
        assert await admin.get(resolution) == b"{}"
        assert await worker.hget(denial, slot) == b"denied"
        assert await worker.exists(resolution) == 1
        # Its approval reads are read-only scripts (EVALSHA_RO), which its rights allow.
        stored, now_ms = await ApprovalRecords(worker).read_at(new_action_id())
        assert stored == []
        assert abs(now_ms - time.time_ns() // 1_000_000) < 60_000
    finally:
        await worker.aclose()
        await admin.aclose()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False,
    )  # fmt: skip


async def test_a_worker_runs_under_its_user_and_only_the_approver_decides(
    compose_redis: int, nats_server: ServiceHandle, tmp_path: Path
) -> None:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    worker_url = f"redis://aipworker@127.0.0.1:{compose_redis}/0"
    worker_password = _secret_copy(tmp_path, "redis_worker_password")
    approver_password = _secret_copy(tmp_path, "redis_approver_password")
    async with fake_stack(
        tmp_path, nats_server.url, worker_url, trust, lease_ttl_ms=3000,
        AIPD_REDIS_PASSWORD_FILE=str(worker_password),
    ) as stack:  # fmt: skip
        worker = await stack.spawn("w-acl")
        read = stack.action("models")
        result = await (await stack.publish(read)).result(timeout_s=30)
        assert result.status is ResultStatus.COMPLETED, result.error
        governed = stack.action("operator", {"objective": "list the files"})
        action_file = tmp_path / "action.json"
        action_file.write_bytes(trust.seal_action(governed, signed=False))
        approve = (
            "approve", governed.id, "--action-file", str(action_file),
            "--as", APPROVER_UNTENANTED, "--reason", "checked by the test",
            "--key", str(trust.approver_seed_files[APPROVER_UNTENANTED]),
        )  # fmt: skip
        base = {
            "AIPD_REDIS_URL": worker_url,
            "AIPD_REDIS_PASSWORD_FILE": str(worker_password),
            "AIPD_APPROVAL_AUTHORITY_FILE": str(trust.authority_file),
            "AIPD_HERMES_ENDPOINTS": stack.env["AIPD_HERMES_ENDPOINTS"],
        }
        # With the workers' credentials a decision cannot be written (Redis says NOPERM).
        as_worker = _cli(*approve, env=base)
        assert as_worker.returncode == 3, as_worker.stderr
        approver = {
            **base,
            "AIPD_APPROVER_REDIS_URL": f"redis://aipapprover@127.0.0.1:{compose_redis}/0",
            "AIPD_APPROVER_REDIS_PASSWORD_FILE": str(approver_password),
        }
        approved = _cli(*approve, env=approver)
        assert approved.returncode == 0, approved.stderr
        shown = _cli("approval", "show", governed.id, env=approver)
        assert shown.returncode == 0, shown.stderr
        assert APPROVER_UNTENANTED in shown.stdout
        result = await (await stack.publish(governed)).result(timeout_s=60)
        assert result.status is ResultStatus.COMPLETED, result.error
        await asyncio.to_thread(worker.terminate, 20.0)
    log = worker.log_text()
    assert "NOPERM" not in log, worker.log_tail(60)
    assert "permission" not in log.lower(), worker.log_tail(60)


async def test_the_open_escalations_gauge_reports_under_the_compose_roles(
    roles: dict[str, User], compose_redis: int, tmp_path: Path
) -> None:
    """Under the compose NATS roles and Redis ACL the gauge never reported: the worker role
    could not read the escalations stream nor its user the resolutions. It counts now, and
    the approver's resolution closes the escalation."""
    subjects = Subjects()
    worker_nc = roles["worker"].nc
    action_id = new_action_id()
    escalation = Escalation(
        escalation_id=escalation_id(action_id, 0),
        kind=EscalationKind.DECISION,
        action_id=action_id,
        endpoint_id=ENDPOINT,
        capability=capability_id(ENDPOINT, "operator"),
        status=ResultStatus.FAILED,
        decision="reconcile with the run owner",
        runbook="runbook.md#operator_outcome_unknown",
        principal_id="user:alice",
        principal_kind="user",
        evidence=[],
        raised_by="w-compose",
        fence=1,
        raised_at_unix_ms=time.time_ns() // 1_000_000,
    )
    # Signed by the compose workers' key: readers believe only what a trusted worker signed.
    signer = ResponseSigner.load(_secret_copy(tmp_path, "worker_signing.nk"))
    worker_keys = COMPOSE / "config" / "worker-keys.txt"
    await BusPublisher(worker_nc.jetstream(), subjects, signer=signer).escalation(escalation)
    worker_redis = _client(compose_redis, "aipworker", "redis_worker_password")
    approver_redis = _client(compose_redis, "aipapprover", "redis_approver_password")
    try:
        gauge = EndpointEscalations(
            worker_nc.jetstream(),
            worker_redis,
            subjects,
            ENDPOINT,
            trusted=TrustedGatewayKeys.load(worker_keys),
        )
        assert await gauge.refresh()
        assert gauge.counts()[EscalationKind.DECISION] == 1
        forged = EscalationResolution(
            escalation_id=escalation.escalation_id,
            action_id=action_id,
            endpoint_id=ENDPOINT,
            kind=ResolutionKind.ACKNOWLEDGED,
            resolved_by="w-compose",
            reason="nothing to see",
            resolved_at_unix_ms=time.time_ns() // 1_000_000,
        )
        with pytest.raises(NoPermissionError):  # the workers' user cannot resolve one
            await record_resolution(worker_redis, forged)
        # The escalation CLI under roles of its own: the gateway's NATS user (it publishes
        # the resolution record) and the approver's Redis user (the write-once record).
        url = roles["admin"].nc.connected_url
        assert url is not None
        erin_key = tmp_path / "erin.nk"  # signs the resolution Envelope on the stream
        write_seed_file(erin_key, generate_keypair().seed)
        resolved = _cli(
            "escalations", "resolve", escalation.escalation_id, "--endpoint", ENDPOINT,
            "--as", "ops:erin", "--key", str(erin_key), "--reason", "taken over",
            env={
                "AIPD_NATS_URL": f"nats://{url.hostname}:{url.port}",
                "AIPD_NATS_NKEY_SEED_FILE": str(_secret_copy(tmp_path, "nats_gateway.nk")),
                "AIPD_NATS_INBOX_PREFIX": INBOX_PREFIXES["nats_gateway.nk"],
                "AIPD_APPROVER_REDIS_URL": f"redis://aipapprover@127.0.0.1:{compose_redis}/0",
                "AIPD_APPROVER_REDIS_PASSWORD_FILE": str(
                    _secret_copy(tmp_path, "redis_approver_password")
                ),
                "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}=http://127.0.0.1:1",
                "AIPD_TRUSTED_WORKER_KEYS_FILE": str(worker_keys),
            },
        )  # fmt: skip
        assert resolved.returncode == 0, resolved.stderr
        assert '"resolved_by":"ops:erin"' in resolved.stdout
        stored = await approver_redis.get(escalation_resolution_key(escalation.escalation_id))
        assert stored is not None
        assert msgspec.json.decode(stored, type=EscalationResolution).resolved_by == "ops:erin"
        assert await gauge.refresh()
        assert gauge.counts()[EscalationKind.DECISION] == 0
    finally:
        await worker_redis.aclose()
        await approver_redis.aclose()
    assert not roles["worker"].violations, roles["worker"].violations


async def test_the_approver_reads_a_runs_binding_but_cannot_change_it(
    compose_redis: int,
) -> None:
    """`escalations show/resolve` show the command from the run's own binding: the approver's
    user reads bindings (EVALSHA_RO, `OperatorStore.reader`) and writes none."""
    admin = _client(compose_redis, "admin", "redis_admin_password")
    approver = _client(compose_redis, "aipapprover", "redis_approver_password")
    key = binding_key(new_action_id())
    try:
        await admin.hset(key, mapping={"doc": b'{"state":"awaiting_approval"}', "revision": 3})
        stored = await OperatorStore.reader(approver).read(key)
        assert (stored.doc, stored.revision) == (b'{"state":"awaiting_approval"}', 3)
        for attempt in (
            lambda: approver.hset(key, "doc", b"{}"),
            lambda: approver.delete(key),
            # A plain EVALSHA names its keys as written: refused for a read-only pattern.
            lambda: OperatorStore(approver).read(key),
        ):
            with pytest.raises(NoPermissionError):
                await attempt()
        assert await admin.hget(key, "revision") == b"3"
    finally:
        await approver.aclose()
        await admin.aclose()
