"""The attacks of issue 19 replayed against the compose NATS roles, and the legitimate flow.

The server runs compose/nats/nats.conf itself (rendered on free ports by the `compose_nats`
fixture, no copy of its permissions here). The admin provisions the streams; then the
gateway and worker users try what the attack pass did with the old `$JS.API.>` grant:
change the results stream with a subject transform, delete an audit receipt, delete a work
consumer, read a queued Action, publish results for an endpoint the worker does not serve.
Each must be refused by the server, and the state must be unchanged (read back as admin).
The same requests sent by the admin are answered, so each refusal is the role's, not a
malformed request. Last, a real worker process holding only the worker credential completes
an Action the gateway user published, and the gateway reads the result and the receipts.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from schemas.codec import encode
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.compose.test_compose_files import ACTION_ID, COMPOSE, ENDPOINT, compose_nats
from worker.client import AipClient
from worker.testing.fake_hermes import FakeHermes
from worker.testing.identities import (
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
    write_api_key_file,
    write_trust_files,
)
from worker.testing.services import ServiceHandle
from worker.testing.workers import WorkerProcess

__all__ = ["compose_nats"]  # the fixture, imported so pytest finds it here

#: An endpoint the compose worker user does not serve.
OTHER_ENDPOINT = "hermes-2"
SUBJECTS = Subjects()
ACTIONS = SUBJECTS.stream_name("actions")
RESULTS = SUBJECTS.stream_name("results")
AUDIT = SUBJECTS.stream_name("audit")
WORK_CONSUMER = SUBJECTS.durable(ENDPOINT, "actions")


@dataclass
class User:
    """One compose NATS user, with the permission violations the server reported to it."""

    name: str
    nc: NATS
    violations: list[str]

    async def api(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """A JetStream API request; None when the server refused to let it through."""
        before = len(self.violations)
        try:
            reply = await self.nc.request(subject, json.dumps(body or {}).encode(), timeout=1.0)
        except nats.errors.TimeoutError:
            reply = None
        await asyncio.sleep(0.05)
        refused = any(subject.lower() in v for v in self.violations[before:])
        if refused:
            assert reply is None
            return None
        assert reply is not None, f"{self.name}: no answer to {subject}, and no refusal"
        answer: dict[str, Any] = json.loads(reply.data)
        return answer

    async def publish_refused(self, subject: str) -> bool:
        before = len(self.violations)
        await self.nc.publish(subject, b"{}")
        await self.nc.flush(timeout=2)
        await asyncio.sleep(0.05)
        return any(subject.lower() in v and "publish" in v for v in self.violations[before:])


async def _connect(url: str, name: str, seed: str) -> User:
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower().replace("'", "").replace('"', ""))

    nc = await nats.connect(
        url, nkeys_seed=str(COMPOSE / "secrets" / seed), error_cb=on_error, allow_reconnect=False
    )
    return User(name, nc, violations)


@pytest.fixture
async def roles(compose_nats: str) -> AsyncIterator[dict[str, User]]:
    users = {
        "admin": await _connect(compose_nats, "admin", "nats_admin.nk"),
        "gateway": await _connect(compose_nats, "gateway", "nats_gateway.nk"),
        "worker": await _connect(compose_nats, "worker", "nats_worker.nk"),
    }
    await provision(
        users["admin"].nc.jetstream(),
        SUBJECTS,
        [ENDPOINT, OTHER_ENDPOINT],
        StreamPolicy(),
        runtime_stores=True,
    )
    try:
        yield users
    finally:
        for user in users.values():
            await user.nc.close()


async def test_no_role_but_admin_can_turn_its_publishes_into_results(
    roles: dict[str, User],
) -> None:
    admin = roles["admin"]
    info = await admin.api(f"$JS.API.STREAM.INFO.{RESULTS}")
    assert info is not None
    forged = dict(info["config"])
    forged["subjects"] = [*forged["subjects"], "aip.gateway.forged.>"]
    forged["subject_transform"] = {"src": "aip.gateway.forged.>", "dest": "aip.hermes.*.results.*"}
    for name in ("gateway", "worker"):
        assert await roles[name].api(f"$JS.API.STREAM.UPDATE.{RESULTS}", forged) is None, name
        for verb in ("DELETE", "PURGE"):
            assert await roles[name].api(f"$JS.API.STREAM.{verb}.{RESULTS}") is None, (name, verb)
    after = await admin.api(f"$JS.API.STREAM.INFO.{RESULTS}")
    assert after is not None
    assert after["config"]["subjects"] == info["config"]["subjects"]
    # The request itself is well-formed: the admin's copy is answered.
    answered = await admin.api(f"$JS.API.STREAM.UPDATE.{RESULTS}", forged)
    assert answered is not None


async def test_no_role_but_admin_can_delete_a_receipt_or_a_work_consumer(
    roles: dict[str, User],
) -> None:
    ack = await roles["worker"].nc.jetstream().publish(
        SUBJECTS.audit(ENDPOINT, ACTION_ID), b'{"event":"received"}'
    )
    for name in ("gateway", "worker"):
        user = roles[name]
        assert await user.api(f"$JS.API.STREAM.MSG.DELETE.{AUDIT}", {"seq": ack.seq}) is None
        assert await user.api(f"$JS.API.CONSUMER.DELETE.{ACTIONS}.{WORK_CONSUMER}") is None
    admin = roles["admin"].nc.jetstream()
    kept = await admin.get_msg(AUDIT, ack.seq)
    assert kept.data == b'{"event":"received"}'
    assert (await admin.consumer_info(ACTIONS, WORK_CONSUMER)).name == WORK_CONSUMER
    # Answered for the admin, which is how an operator repairs a deployment.
    assert await roles["admin"].api(f"$JS.API.STREAM.MSG.DELETE.{AUDIT}", {"seq": ack.seq})


async def test_a_gateway_consumer_cannot_deliver_worker_output_into_results(
    roles: dict[str, User],
) -> None:
    """Its output consumers are ephemeral, but their deliver subject is the gateway's to
    choose: pointed at a results subject, nothing may land on the results stream."""
    await roles["worker"].nc.jetstream().publish(
        SUBJECTS.audit(ENDPOINT, ACTION_ID), b'{"event":"received"}'
    )
    target = SUBJECTS.results(ENDPOINT, "act_" + "f" * 32)
    created = await roles["gateway"].api(
        f"$JS.API.CONSUMER.CREATE.{AUDIT}",
        {"stream_name": AUDIT, "config": {"deliver_subject": target, "ack_policy": "none"}},
    )
    assert created is not None  # allowed: reading receipts is the gateway's
    await asyncio.sleep(1.0)
    results = await roles["admin"].nc.jetstream().stream_info(RESULTS)
    assert results.state.messages == 0


async def test_the_gateway_cannot_read_a_queued_action(roles: dict[str, User]) -> None:
    gateway = roles["gateway"]
    subject = SUBJECTS.actions(ENDPOINT)
    ack = await gateway.nc.jetstream().publish(subject, b'{"queued":"secret"}')
    assert ack.stream == ACTIONS  # publishing Actions is the gateway's job
    attempts: list[tuple[str, dict[str, Any]]] = [
        (f"$JS.API.STREAM.MSG.GET.{ACTIONS}", {"seq": ack.seq}),
        (f"$JS.API.STREAM.MSG.GET.{ACTIONS}", {"last_by_subj": subject}),
        (f"$JS.API.DIRECT.GET.{ACTIONS}", {"seq": ack.seq}),
        (f"$JS.API.CONSUMER.MSG.NEXT.{ACTIONS}.{WORK_CONSUMER}", {"batch": 1, "no_wait": True}),
        (
            f"$JS.API.CONSUMER.CREATE.{ACTIONS}",
            {"stream_name": ACTIONS, "config": {"ack_policy": "explicit"}},
        ),
        (
            f"$JS.API.CONSUMER.DURABLE.CREATE.{ACTIONS}.spy",
            {"stream_name": ACTIONS, "config": {"durable_name": "spy", "ack_policy": "explicit"}},
        ),
    ]
    for api_subject, body in attempts:
        assert await gateway.api(api_subject, body) is None, api_subject
    # Nor by a plain subscription: Actions reach workers through their pull consumers only.
    before = len(gateway.violations)
    sub = await gateway.nc.subscribe(subject)
    await gateway.nc.flush(timeout=2)
    await asyncio.sleep(0.05)
    await sub.unsubscribe()
    assert any(subject in v and "subscription" in v for v in gateway.violations[before:])
    info = await roles["admin"].nc.jetstream().consumer_info(ACTIONS, WORK_CONSUMER)
    assert info.num_pending == 1  # still queued, unread, for the workers


async def test_a_worker_publishes_only_for_the_endpoints_it_serves(
    roles: dict[str, User],
) -> None:
    worker = roles["worker"]
    for endpoint, refused in ((ENDPOINT, False), (OTHER_ENDPOINT, True)):
        for subject in (
            SUBJECTS.results(endpoint, ACTION_ID),
            SUBJECTS.chunks(endpoint, ACTION_ID),
            SUBJECTS.audit(endpoint, ACTION_ID),
            SUBJECTS.dlq(endpoint),
            SUBJECTS.cancel_notice(endpoint),
        ):
            assert await worker.publish_refused(subject) is refused, subject
    # It pulls only from the consumers of its own endpoint.
    own = f"$JS.API.CONSUMER.MSG.NEXT.{ACTIONS}.{WORK_CONSUMER}"
    other = f"$JS.API.CONSUMER.MSG.NEXT.{ACTIONS}.{SUBJECTS.durable(OTHER_ENDPOINT, 'actions')}"
    before = len(worker.violations)
    await worker.nc.publish(own, b'{"batch":1,"no_wait":true}', reply=worker.nc.new_inbox())
    await worker.nc.publish(other, b'{"batch":1,"no_wait":true}', reply=worker.nc.new_inbox())
    await worker.nc.flush(timeout=2)
    await asyncio.sleep(0.05)
    reported = " ".join(worker.violations[before:])
    assert other.lower() in reported
    assert own.lower() not in reported
    # And it cannot publish an Action, a delegation or a runtime record.
    for subject in (
        SUBJECTS.actions(ENDPOINT),
        SUBJECTS.delegations(ENDPOINT),
        SUBJECTS.runtime_queue(ACTION_ID),
    ):
        assert await worker.publish_refused(subject), subject


async def test_a_worker_with_the_worker_credential_completes_a_gateway_action(
    roles: dict[str, User], redis_server: ServiceHandle, tmp_path: Path
) -> None:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    api_key, key_file = write_api_key_file(tmp_path)
    seed = tmp_path / "nats_worker.nk"
    shutil.copyfile(COMPOSE / "secrets" / "nats_worker.nk", seed)
    os.chmod(seed, 0o600)
    gateway = roles["gateway"]
    client = AipClient(gateway.nc, sign_key=trust.seed_file)
    async with FakeHermes(api_key=api_key, port=0) as fake:
        worker = WorkerProcess(
            worker_id="w-compose",
            env={
                "AIPD_NATS_URL": _url(gateway.nc),
                "AIPD_NATS_NKEY_SEED_FILE": str(seed),
                "AIPD_REDIS_URL": redis_server.url,
                "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={fake.url}",
                "AIPD_HERMES_API_KEY_FILE": str(key_file),
                "AIPD_LEASE_TTL_MS": "3000",
                **trust.environment(),
            },
            log_dir=tmp_path,
        )
        await asyncio.to_thread(worker.start, wait_ready_s=20.0)
        try:
            action = client.build_action(
                endpoint_id=ENDPOINT,
                operation="models",
                input={},
                principal_id=USER_UNTENANTED,
                principal_kind=PRINCIPAL_KIND,
                authentication_issuer=ISSUER,
                credential_revision=REVISION,
            )
            handle = await client.publish(action)
            result = await handle.result(timeout_s=30)
            assert result.status.value == "completed", result.error
            assert result.settled_by == "w-compose"
            receipts = await client.receipts(ENDPOINT, action.id)
            assert "settled" in [r.event.value for r in receipts]
            manifest = await client.manifest(ENDPOINT)
            assert manifest["endpoint_id"] == ENDPOINT
            assert encode(action)  # the Action the gateway signed is what the worker ran
        finally:
            await asyncio.to_thread(worker.terminate, 20.0)
        log = worker.log_text().lower()
        assert "permission" not in log, worker.log_tail(60)
    assert not gateway.violations, gateway.violations


def _url(nc: NATS) -> str:
    server = nc.connected_url
    assert server is not None
    return f"nats://{server.hostname}:{server.port}"
