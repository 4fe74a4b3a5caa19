"""The start fence against a Hermes newer than 0.19 (the fake's post-0.19 flags): a keyed
start whose answer was lost is re-sent byte for byte and binds the one run; the re-send is
refused whenever it could start a second run (the endpoint stopped advertising the
feature, the body changed) or is answered by a key conflict; and the features are read from
`GET /v1/capabilities` only as a literal advertisement. Real Redis, the fake over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from operator_support import Harness, error_code, fake_config, objective

from schemas.errors import ErrorCode
from schemas.result import ResultStatus
from worker.fingerprints import operator_fingerprint
from worker.hermes.feature_probe import read_features
from worker.hermes.features import NO_FEATURES, features_of
from worker.hermes.http_client import HermesClient
from worker.operator.binding import BindingState, encode_binding, session_id_for
from worker.operator.start import RUN_KEY_PREFIX, run_start_key
from worker.testing.fake_hermes import (
    FakeConfig,
    FakeHermes,
    RouteDelay,
    StartDrop,
    StartHang,
    StartServerError,
    upstream,
)
from worker.testing.fake_hermes.run_keys import KeyedRun
from worker.testing.scenario import SLOW_REPLY

START = "POST /v1/runs"


@pytest.fixture
def fake_settings() -> FakeConfig:
    return upstream(fake_config())


def created_runs(fake: FakeHermes, action_id: str) -> int:
    return fake.stats().session_starts.get(session_id_for(action_id), 0)


def start_keys(fake: FakeHermes) -> list[str | None]:
    keys = []
    for request in fake.requests():
        if request.route == START:
            headers = {k.lower(): v for k, v in request.headers.items()}
            keys.append(headers.get("idempotency-key"))
    return keys


async def _until_claimed(harness: Harness, action_id: str) -> None:
    while True:
        binding = await harness.binding(action_id)
        if binding is not None and binding.start_claim is not None:
            return
        await asyncio.sleep(0.01)


def test_only_a_literal_true_advertises_run_idempotency() -> None:
    assert features_of({"features": {"runs_idempotency": True}}).runs_idempotency
    for document in (
        {"features": {"runs_idempotency": "true"}},
        {"features": {"runs_idempotency": 1}},
        {"features": {}},
        {"features": None},
        [],
        None,
    ):
        assert features_of(document) == NO_FEATURES


async def test_the_probe_reads_what_each_hermes_advertises(
    hermes: HermesClient, fake: FakeHermes
) -> None:
    assert hermes.features.runs_idempotency  # the conftest's probe, as a worker's at start
    fake.state.config = dataclasses.replace(fake.state.config, runs_idempotency=False)
    found = await read_features(hermes)
    assert found is not None
    assert not found.runs_idempotency
    assert fake.stats().count("GET /v1/capabilities") == 0  # counted as probes, apart


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(StartServerError(), id="5xx-after-create"),
        pytest.param(StartDrop(), id="dropped-after-create"),
    ],
)
async def test_an_ambiguous_keyed_start_is_re_sent_and_binds_the_one_run(
    harness: Harness, fake: FakeHermes, fault: StartServerError | StartDrop
) -> None:
    # 0.19: the same faults settle `operator_outcome_unknown` (test_operator_start_claim.py).
    fake.faults.add(fault)
    action = harness.action(objective("ambiguous, keyed"))
    outcome, _ = await harness.run(action)

    assert outcome.status is ResultStatus.COMPLETED, outcome.error
    assert fake.stats().count(START) == 2
    assert created_runs(fake, action.id) == 1
    keys = start_keys(fake)
    assert len(set(keys)) == 1
    assert (keys[0] or "").startswith(RUN_KEY_PREFIX)
    binding = await harness.require_binding(action.id)
    assert binding.status is BindingState.COMPLETED
    assert binding.start_claim is None


async def test_a_lost_start_is_learnt_by_the_next_owner_with_the_same_key(
    harness: Harness, fake: FakeHermes
) -> None:
    """The claim holder dies inside `POST /v1/runs` (the run exists); its replacement
    re-sends the recorded request and binds that run instead of settling unknown."""
    fake.faults.add(StartHang(create_run=True))
    action = harness.action(objective("do the thing"))
    first = await harness.lease(action)
    doomed = asyncio.create_task(harness.execute(first))
    await _until_claimed(harness, action.id)
    claim = (await harness.require_binding(action.id)).start_claim
    assert claim is not None
    assert claim.idempotency_key is not None
    await asyncio.sleep(0.1)  # the request is in flight (and the run exists in Hermes)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed

    second = await harness.replace_owner(first)
    outcome = await harness.execute(second)

    assert outcome.status is ResultStatus.COMPLETED, outcome.error
    assert fake.stats().count(START) == 2
    assert created_runs(fake, action.id) == 1
    assert set(start_keys(fake)) == {claim.idempotency_key}


async def test_no_re_send_once_the_endpoint_stops_advertising_the_feature(
    harness: Harness, fake: FakeHermes
) -> None:
    """Hermes was replaced by one without durable keys between the two owners: a re-send
    could start a second run, so the lost start stays unknown, as on 0.19."""
    fake.faults.add(StartHang(create_run=True))
    action = harness.action(objective("downgraded"))
    first = await harness.lease(action)
    doomed = asyncio.create_task(harness.execute(first))
    await _until_claimed(harness, action.id)
    await asyncio.sleep(0.1)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    fake.state.config = dataclasses.replace(fake.state.config, runs_idempotency=False)

    outcome = await harness.execute(await harness.replace_owner(first))

    assert error_code(outcome) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    assert fake.stats().count(START) == 1


async def test_no_re_send_when_the_body_would_differ(harness: Harness, fake: FakeHermes) -> None:
    """The next owner runs another policy (other instructions): its request is not the one
    the claim recorded, so it is not sent under that key."""
    fake.faults.add(StartHang(create_run=True))
    action = harness.action(objective("policy changes"))
    first = await harness.lease(action)
    doomed = asyncio.create_task(harness.execute(first))
    await _until_claimed(harness, action.id)
    await asyncio.sleep(0.1)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    other = harness.with_policy(system_instructions="Other instructions.")

    outcome = await other.execute(await other.replace_owner(first))

    assert error_code(outcome) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    assert fake.stats().count(START) == 1


async def test_a_key_conflict_is_outcome_unknown_not_a_rejection(
    harness: Harness, fake: FakeHermes
) -> None:
    """Hermes already holds this Action's key for another body (a binding restored from an
    older Redis, say): a run may exist under it, so it is not `operator_start_rejected`."""
    action = harness.action(objective("conflicting"))
    endpoint_id = harness.hermes.endpoint.id
    key = run_start_key(endpoint_id, action.id, operator_fingerprint(endpoint_id, action))
    fake.state.run_keys.put(key, KeyedRun("another body", "run_" + "0" * 32))
    outcome, _ = await harness.run(action)

    assert error_code(outcome) == ErrorCode.OPERATOR_OUTCOME_UNKNOWN.value
    assert outcome.error is not None
    assert outcome.error.remote_status == 409
    assert created_runs(fake, action.id) == 0


async def test_a_hermes_restart_ends_the_bound_run_interrupted(
    harness: Harness, fake: FakeHermes
) -> None:
    action = harness.action(objective(f"long {SLOW_REPLY} restart"))
    ctx = await harness.lease(action)
    task = asyncio.create_task(harness.execute(ctx))
    while (binding := await harness.binding(action.id)) is None or binding.run_id is None:
        await asyncio.sleep(0.01)
    await fake.restart()
    outcome = await task

    assert error_code(outcome) == ErrorCode.OPERATOR_INTERRUPTED.value
    assert outcome.error is not None
    protocol = outcome.error.to_protocol(endpoint_id="e", read_only=False)
    assert protocol.uncertain_outcome
    assert not protocol.retryable
    stored = await harness.require_binding(action.id)
    assert stored.status is BindingState.FAILED
    assert stored.output is not None
    assert stored.output["event"] == "run.interrupted"


async def test_a_0_19_claim_is_stored_exactly_as_before(harness: Harness, fake: FakeHermes) -> None:
    """Without the advertisement the claim carries no key fields: the stored JSON of a
    0.19 deployment does not change."""
    harness.hermes.features = NO_FEATURES
    fake.faults.add(RouteDelay(route=START, delay_s=0.3))
    action = harness.action(objective("no key"))
    first = await harness.lease(action)
    task = asyncio.create_task(harness.execute(first))
    await _until_claimed(harness, action.id)
    binding = await harness.require_binding(action.id)
    assert binding.start_claim is not None
    assert b"idempotency_key" not in encode_binding(binding)
    assert b"request_sha256" not in encode_binding(binding)
    await task
