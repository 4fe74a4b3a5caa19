"""The gateway process runs with nothing but the compose gateway credential.

The compose NATS roles (compose/nats/nats.conf, run for real by `compose_nats`): the admin
provisions every stream including the runtime's, and the native binding's message-id bucket
(as `provision --runtime-stores` does); then `python -m worker gateway` holding only
`nats_gateway.nk` serves a real `aip_call` that a worker holding only `nats_worker.nk`
executes: the records are written, the result followed, the events read, the receipts filed.
The same gateway serves the native AIP binding to a client holding only
`nats_aip_client.nk`: a sync Action's result, and a replayed message id refused. Neither
process hits a permission violation.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from typing import Any

import nacl.signing
import nats
from nats.aio.client import Client as NATS

from schemas.ids import new_action_id
from tests.aip_actions import did_of, request_envelope, sign
from tests.compose.test_compose_files import (
    AIP_CLIENT_INBOX,
    COMPOSE,
    ENDPOINT,
    INBOX_PREFIXES,
    compose_nats,
)
from tests.compose.test_role_attacks import User, roles
from worker.gateway.native_trust import MessageClaims
from worker.testing._procs import free_port
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import (
    MCP_ISSUER,
    call_tool,
    directory_entry,
    gateway_env,
    gateway_process,
    hermes_principal_id,
    principal_entry,
    write_principals_file,
)
from worker.testing.identities import identity_entries, write_api_key_file, write_trust_files
from worker.testing.services import ServiceHandle
from worker.testing.workers import WorkerProcess

__all__ = ["compose_nats", "roles"]  # fixtures, imported so pytest finds them here

TOKEN = "compose-gateway-test-token-" + "0" * 16
#: The native binding's request subjects with the compose values (trust domain `local`).
NATIVE = "aip.v1.local.aip-hermes-worker.v1"


async def _native(client: NATS, envelope: dict[str, Any]) -> dict[str, Any]:
    subject = f"{NATIVE}.{envelope['message_type'].replace('.', '_')}"
    msg = await client.request(subject, json.dumps({"envelope": envelope}).encode(), timeout=30)
    answer: dict[str, Any] = json.loads(msg.data)["envelope"]
    return answer


def _seed(tmp_path: Path, name: str) -> Path:
    seed = tmp_path / name
    shutil.copyfile(COMPOSE / "secrets" / name, seed)
    os.chmod(seed, 0o600)
    return seed


async def test_the_gateway_serves_aip_call_with_only_its_role(
    roles: dict[str, User], redis_server: ServiceHandle, tmp_path: Path
) -> None:
    nats_url = roles["admin"].nc.connected_url
    assert nats_url is not None
    url = f"nats://{nats_url.hostname}:{nats_url.port}"
    principal = hermes_principal_id(ENDPOINT)
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    identities = [*identity_entries(), directory_entry(principal)]
    trust = write_trust_files(trust_dir, identities=identities)
    principals = write_principals_file(trust_dir, [principal_entry(TOKEN, principal)])
    api_key, key_file = write_api_key_file(tmp_path)
    caller = nacl.signing.SigningKey.generate()
    signers = tmp_path / "aip-signers.txt"
    signers.write_text(f"{did_of(caller)} {principal} kind=agent revision=1 issuer={MCP_ISSUER}\n")
    # What `provision --runtime-stores` adds for the binding, as the admin: the gateway
    # role may not create it.
    await MessageClaims.open(roles["admin"].nc.jetstream())
    port = free_port()
    gateway = gateway_process(
        "g-compose",
        gateway_env(
            url, principals, trust.seed_file, port,
            AIPD_NATS_NKEY_SEED_FILE=str(_seed(tmp_path, "nats_gateway.nk")),
            AIPD_NATS_INBOX_PREFIX=INBOX_PREFIXES["nats_gateway.nk"],
            AIPD_TRUSTED_WORKER_KEYS_FILE=str(trust.worker_keys_file),  # as compose does
            AIPD_AIP_TRUSTED_SIGNERS_FILE=str(signers),
        ),
        tmp_path,
    )  # fmt: skip
    async with FakeHermes(api_key=api_key, port=0) as fake:
        worker = WorkerProcess(
            worker_id="w-compose",
            env={
                "AIPD_NATS_URL": url,
                "AIPD_NATS_NKEY_SEED_FILE": str(_seed(tmp_path, "nats_worker.nk")),
                "AIPD_NATS_INBOX_PREFIX": INBOX_PREFIXES["nats_worker.nk"],
                "AIPD_REDIS_URL": redis_server.url,
                "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={fake.url}",
                "AIPD_HERMES_API_KEY_FILE": str(key_file),
                "AIPD_LEASE_TTL_MS": "3000",
                **trust.environment(),
            },
            log_dir=tmp_path,
        )
        await asyncio.to_thread(worker.start, wait_ready_s=20.0)
        await asyncio.to_thread(gateway.start, wait_ready_s=20.0)
        try:
            await asyncio.sleep(1.5)  # at least two recovery sweeps (every 500 ms here)
            mcp = f"http://127.0.0.1:{port}/mcp"
            child_id = new_action_id()
            arguments = {
                "action_id": child_id,
                "capability_id": f"cap:hermes_agent:{ENDPOINT}:models",
                "input": {},
                "mode": "sync",
                "timeout_ms": 20_000,
            }
            answer = await call_tool(mcp, TOKEN, "aip_call", arguments)
            assert not answer.is_error, answer.document
            assert answer.aip["status"] == "completed"
            assert answer.document["data"][0]["id"] == "hermes-agent"
            # The caller reads its Action by its own id (namespaced on the bus).
            events = await call_tool(mcp, TOKEN, "aip_action_events", {"action_id": child_id})
            assert events.body["terminal"] is True
            listed = await call_tool(mcp, TOKEN, "aip_capabilities")
            assert not listed.is_error, listed.document

            client = await nats.connect(
                url, nkeys_seed=str(COMPOSE / "secrets" / "nats_aip_client.nk"),
                inbox_prefix=AIP_CLIENT_INBOX, allow_reconnect=False,
            )  # fmt: skip
            try:
                body = {
                    "id": new_action_id(),
                    "capability_id": f"cap:hermes_agent:{ENDPOINT}:models",
                    "input": {},
                    "mode": "sync",
                    "timeout_ms": 20_000,
                }
                sender = {"id": principal, "kind": "agent"}
                native = await _native(
                    client, sign(request_envelope("aip.core.v1.action", body), caller, sender)
                )
                assert native["message_type"] == "aip.core.v1.action_result", native["body"]
                assert native["body"]["action_result"]["status"] == "completed"
                beat = sign(
                    request_envelope("aip.core.v1.heartbeat", {"sequence": 1}), caller, sender
                )
                assert (await _native(client, beat))["message_type"] == "aip.core.v1.heartbeat_ack"
                replay = await _native(client, beat)  # the KV read of a taken key, allowed
                assert replay["body"]["error"]["error"]["code"] == "replay.message_id"
            finally:
                await client.close()
        finally:
            await asyncio.to_thread(gateway.terminate, 20.0)
            await asyncio.to_thread(worker.terminate, 20.0)
    for proc in (gateway, worker):
        assert "permission" not in proc.log_text().lower(), proc.log_tail(60)
    # The recovery sweep (message gets on the queue stream) ran without failing.
    assert "sweep failed" not in gateway.log_text(), gateway.log_tail(60)
