"""A trust file entry that expires on schedule does not stop the next restart (issue 27).

One expired membership or identity entry used to make every worker restart exit. Now an
expired entry is skipped with a warning and counted (`trust_entries_expired`); only a
malformed one (revoked, zero revision, duplicate, undecodable) stops start-up.
"""

from __future__ import annotations

import json

import httpx

from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.testing._procs import free_port
from worker.testing.identities import PRINCIPAL_KIND, REVISION, write_json
from worker.trust.signing import generate_keypair

FORMER_USER = "user:former-contractor"
FORMER_APPROVER = "approver:former"


def _expire_one_entry_of_each_file(stack: Stack) -> None:
    """Append an entry that expired a minute ago to the identity and authority files."""
    identities = json.loads(stack.trust.identity_file.read_text())
    identities.append(
        {
            "principal_id": FORMER_USER,
            "revision": REVISION,
            "identity": {"principal_kind": PRINCIPAL_KIND},
            "expires_at_unix_ms": 1_700_000_000_000,
        }
    )
    write_json(stack.trust.identity_file, identities)
    memberships = json.loads(stack.trust.authority_file.read_text())
    memberships.append(
        {
            "principal_id": FORMER_APPROVER,
            "revision": 1,
            "tenant_id": None,
            "public_key": generate_keypair().public_key,
            "capability_prefixes": ["cap:hermes_agent:"],
            "expires_at_unix_ms": 1_700_000_000_000,
        }
    )
    write_json(stack.trust.authority_file, memberships, mode=0o644)


async def test_a_restart_with_expired_entries_starts_serves_and_counts_them(
    stack: Stack,
) -> None:
    first = await stack.spawn("w1")
    _, handle = await stack.operator("before the entries expired")
    assert (await handle.result(timeout_s=30)).status is ResultStatus.COMPLETED
    first.kill()

    _expire_one_entry_of_each_file(stack)
    port = free_port()
    restarted = await stack.spawn("w2", AIPD_METRICS_PORT=str(port))
    assert restarted.alive, restarted.log_tail()
    # Governed work still runs: identity, approval (its membership) and execution.
    _, handle = await stack.operator("after the restart")
    result = await handle.result(timeout_s=30)
    assert result.status is ResultStatus.COMPLETED, result.error
    assert result.settled_by == "w2"
    log = restarted.log_text()
    assert f"principal '{FORMER_USER}'): has expired; skipped" in log
    assert f"principal '{FORMER_APPROVER}'): has expired; skipped" in log
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=10)).text
    assert 'aip_hermes_worker_trust_entries_expired{file="identity"} 1.0' in metrics
    assert 'aip_hermes_worker_trust_entries_expired{file="authority"} 1.0' in metrics


async def test_a_malformed_entry_still_stops_start_up(stack: Stack) -> None:
    identities = json.loads(stack.trust.identity_file.read_text())
    identities[0]["revoked"] = True
    write_json(stack.trust.identity_file, identities)
    worker = await stack.spawn("w1", wait=False)
    assert worker.wait_exit(30) not in (None, 0), worker.log_tail()
    assert "is revoked; remove the entry" in worker.log_text()
