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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from schemas.codec import encode
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.compose.test_compose_files import (
    ACTION_ID,
    COMPOSE,
    ENDPOINT,
    INBOX_PREFIXES,
    compose_nats,
    run_compose_nats,
)
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
from worker.trust.signing import generate_keypair

__all__ = ["compose_nats"]  # the fixture, imported so pytest finds it here

#: An endpoint the compose worker user does not serve.
OTHER_ENDPOINT = "hermes-2"
SUBJECTS = Subjects()
ACTIONS = SUBJECTS.stream_name("actions")
RESULTS = SUBJECTS.stream_name("results")
AUDIT = SUBJECTS.stream_name("audit")
CHUNKS = SUBJECTS.stream_name("chunks")
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
        url,
        nkeys_seed=str(COMPOSE / "secrets" / seed),
        error_cb=on_error,
        allow_reconnect=False,
        inbox_prefix=INBOX_PREFIXES[seed],
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


async def test_no_role_but_admin_can_make_the_server_store_copies_in_a_work_queue(
    roles: dict[str, User],
) -> None:
    """Issue 24, finding 3: a push consumer on an output stream whose deliver subject a
    work-queue stream binds makes the server store a copy of every message in that queue
    (20,000 in each of ACTIONS, DELEGATIONS and EGRESS until EGRESS was full). Permissions
    cannot tell push from pull, so no role but admin may create a consumer in any form."""
    worker = roles["worker"].nc.jetstream()
    await worker.publish(SUBJECTS.audit(ENDPOINT, ACTION_ID), b'{"event":"received"}')
    await worker.publish(SUBJECTS.results(ENDPOINT, ACTION_ID), b"{}")
    await worker.publish(SUBJECTS.chunks(ENDPOINT, ACTION_ID), b"{}")
    admin = roles["admin"].nc.jetstream()
    work_streams = [SUBJECTS.stream_name(kind) for kind in ("actions", "delegations", "egress")]
    before = [(await admin.stream_info(name)).state.messages for name in work_streams]
    targets = [
        SUBJECTS.actions(ENDPOINT), SUBJECTS.delegations(ENDPOINT), SUBJECTS.egress(ENDPOINT)
    ]  # fmt: skip
    attempts = []
    for name in ("gateway", "worker"):
        for stream in (AUDIT, RESULTS, CHUNKS):
            for target in targets:
                config = {"deliver_subject": target, "ack_policy": "none"}
                named = {**config, "name": "spy"}
                durable = {**config, "durable_name": "spy"}
                only = SUBJECTS.results(ENDPOINT, ACTION_ID)
                filtered = {**named, "filter_subject": only}
                for api_subject, body in (
                    (f"$JS.API.CONSUMER.CREATE.{stream}", config),
                    (f"$JS.API.CONSUMER.CREATE.{stream}.spy", named),
                    (f"$JS.API.CONSUMER.CREATE.{stream}.spy.{only}", filtered),
                    (f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.spy", durable),
                ):
                    request = {"stream_name": stream, "config": body}
                    attempts.append((name, roles[name].api(api_subject, request)))
    answers = await asyncio.gather(*(attempt for _, attempt in attempts))
    assert [name for (name, _), answer in zip(attempts, answers, strict=True) if answer] == []
    await asyncio.sleep(1.0)
    assert [(await admin.stream_info(name)).state.messages for name in work_streams] == before
    for stream in (AUDIT, RESULTS, CHUNKS):
        assert (await admin.stream_info(stream)).state.consumer_count == 0, stream
    # The request is well-formed: the admin's is answered (the one role that may).
    probe = {"deliver_subject": "_INBOX_admin.x", "ack_policy": "none"}
    answered = await roles["admin"].api(
        f"$JS.API.CONSUMER.CREATE.{AUDIT}", {"stream_name": AUDIT, "config": probe}
    )
    assert answered is not None
    assert "error" not in answered, answered


async def _spy(user: User, subjects: list[str]) -> tuple[list[bytes], list[str]]:
    """Subscribe `user` to each subject; (what arrives, the subjects the server refused)."""
    seen: list[bytes] = []

    async def record(msg: Msg) -> None:
        seen.append(msg.data)

    before = len(user.violations)
    for subject in subjects:
        await user.nc.subscribe(subject, cb=record)
    await user.nc.flush(timeout=2)
    await asyncio.sleep(0.1)
    reported = user.violations[before:]
    refused = [s for s in subjects if any(s.lower() in v and "subscription" in v for v in reported)]
    return seen, refused


async def test_no_other_role_reads_an_action_as_it_is_delivered_to_a_worker(
    roles: dict[str, User],
) -> None:
    """Issue 24, finding 2: pull deliveries travel on the puller's inbox, and every role
    could subscribe to `_INBOX.>`: the gateway credential received a queued, signed Action
    as it was delivered to a worker. Now each role may subscribe to its own prefix only."""
    gateway, worker = roles["gateway"], roles["worker"]
    worker_inboxes = INBOX_PREFIXES["nats_worker.nk"] + ".>"
    spies = ["_INBOX.>", worker_inboxes, INBOX_PREFIXES["nats_worker.nk"] + ".*"]
    seen, refused = await _spy(gateway, spies)
    assert refused == spies
    ack = await gateway.nc.jetstream().publish(
        SUBJECTS.actions(ENDPOINT), b'{"queued":"secret"}', headers={"Nats-Msg-Id": ACTION_ID}
    )
    assert ack.stream == ACTIONS
    # A worker pulls it the way the real one does: its durable consumer, its own inbox.
    sub = await worker.nc.jetstream().pull_subscribe_bind(WORK_CONSUMER, stream=ACTIONS)
    delivered = await sub.fetch(1, timeout=5)
    assert [msg.data for msg in delivered] == [b'{"queued":"secret"}']
    assert (delivered[0].reply or "").startswith("$JS.ACK.")
    await delivered[0].ack()
    await asyncio.sleep(0.3)
    assert seen == []
    # The admin cannot read the workers' inboxes either.
    seen, refused = await _spy(roles["admin"], ["_INBOX.>", worker_inboxes])
    assert refused == ["_INBOX.>", worker_inboxes]
    assert seen == []


def _second_pool(public_key: str) -> Callable[[str], str]:
    """nats.conf with a hermes-2 worker pool made as its header says: the hermes-1 block
    copied with every `hermes-1` and `hermes_hermes_1_` replaced, and its own nkey user."""

    def edit(conf: str) -> str:
        start = conf.index("WORKER_HERMES_1_PERMISSIONS = {")
        end = conf.index("\n}\n", start) + 3
        block = conf[start:end]
        copy = (
            block.replace("WORKER_HERMES_1_", "WORKER_HERMES_2_")
            .replace("hermes-1", OTHER_ENDPOINT)
            .replace("hermes_hermes_1_", "hermes_hermes_2_")
        )
        assert "hermes-1" not in copy
        assert "hermes_1" not in copy
        user = f"{{ nkey: {public_key}, permissions: $WORKER_HERMES_2_PERMISSIONS }}"
        conf = conf[:end] + "\n" + copy + conf[end:]
        marker = "permissions: $WORKER_HERMES_1_PERMISSIONS }"
        return conf.replace(marker, marker + "\n      " + user)

    return edit


@pytest.fixture
async def two_pools(tmp_path: Path) -> AsyncIterator[tuple[dict[str, User], User]]:
    """The compose roles plus a second worker pool (hermes-2) of the header's template."""
    pair = generate_keypair()
    seed = tmp_path / "nats_worker_2.nk"
    seed.write_bytes(pair.seed)
    started = run_compose_nats(tmp_path, _second_pool(pair.public_key))
    url = next(started)
    users = {
        "admin": await _connect(url, "admin", "nats_admin.nk"),
        "gateway": await _connect(url, "gateway", "nats_gateway.nk"),
        "worker": await _connect(url, "worker", "nats_worker.nk"),
    }
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower().replace("'", "").replace('"', ""))

    other = User(
        "worker-2",
        await nats.connect(
            url, nkeys_seed=str(seed), error_cb=on_error, allow_reconnect=False,
            inbox_prefix=f"_INBOX_worker_{OTHER_ENDPOINT}",
        ),
        violations,
    )  # fmt: skip
    await provision(
        users["admin"].nc.jetstream(), SUBJECTS, [ENDPOINT, OTHER_ENDPOINT], StreamPolicy()
    )
    try:
        yield users, other
    finally:
        for user in (*users.values(), other):
            await user.nc.close()
        started.close()


async def test_one_worker_pool_sees_no_action_of_another_endpoint(
    two_pools: tuple[dict[str, User], User],
) -> None:
    """Issue 24, finding 2: one worker pool's credential saw 65 of another endpoint's
    Actions in 4 s on `_INBOX.>`. The hermes-1 pool may read its own inboxes only."""
    users, other = two_pools
    worker = users["worker"]
    spies = [
        "_INBOX.>", f"_INBOX_worker_{OTHER_ENDPOINT}.>", INBOX_PREFIXES["nats_gateway.nk"] + ".>"
    ]  # fmt: skip
    seen, refused = await _spy(worker, spies)
    assert refused == spies
    gateway = users["gateway"].nc.jetstream()
    for n in range(5):
        await gateway.publish(
            SUBJECTS.actions(OTHER_ENDPOINT), b'{"other":%d}' % n,
            headers={"Nats-Msg-Id": f"act_{n:032x}"},
        )  # fmt: skip
    durable = SUBJECTS.durable(OTHER_ENDPOINT, "actions")
    sub = await other.nc.jetstream().pull_subscribe_bind(durable, stream=ACTIONS)
    delivered = await sub.fetch(5, timeout=5)
    assert len(delivered) == 5
    assert not other.violations, other.violations
    await asyncio.sleep(0.3)
    assert seen == []
    # Nor can it pull from the other pool's consumer (its own works: the config is real).
    before = len(worker.violations)
    await worker.nc.publish(
        f"$JS.API.CONSUMER.MSG.NEXT.{ACTIONS}.{durable}", b'{"batch":1}',
        reply=worker.nc.new_inbox(),
    )  # fmt: skip
    await worker.nc.flush(timeout=2)
    await asyncio.sleep(0.05)
    assert any(durable.lower() in v for v in worker.violations[before:])


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
        try:
            identity: dict[str, Any] = {
                "principal_id": USER_UNTENANTED,
                "principal_kind": PRINCIPAL_KIND,
                "authentication_issuer": ISSUER,
                "credential_revision": REVISION,
            }
            action = client.build_action(
                endpoint_id=ENDPOINT, operation="models", input={}, **identity
            )
            handle = await client.publish(action)
            result = await handle.result(timeout_s=30)
            # `models` does not stream (as upstream AIP): the chunk follower, reading by
            # message gets (the gateway user may create no consumer), ends on its result
            # with nothing yielded.
            assert [chunk async for chunk in handle.chunks(idle_timeout_s=10)] == []
            assert result.last_chunk_sha256 is None
            assert result.status.value == "completed", result.error
            # A streaming capability's chunks, read by message gets the same way.
            turn = {"messages": [{"role": "user", "content": "a short streamed answer"}]}
            streamed = await client.publish(
                client.build_action(
                    endpoint_id=ENDPOINT, operation="chat_stream", input=turn, **identity
                )
            )
            kinds = [chunk.kind.value async for chunk in streamed.chunks(idle_timeout_s=10)]
            assert kinds[-1] == "done", kinds
            assert (await streamed.result(timeout_s=30)).status.value == "completed"
            assert result.settled_by == "w-compose"
            receipts = await client.receipts(ENDPOINT, action.id)
            assert "settled" in [r.event.value for r in receipts]
            manifest = await client.manifest(ENDPOINT)
            assert manifest["compatibility"]["endpoints"] == [ENDPOINT]
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
