"""Every Hermes route as a capability, invoked over NATS through a real worker process,
against the fake Hermes and the real hermes-agent 0.19.0 alike (issue: the whole surface).

The tour is the qualification driver's item 1 (`worker.qualify.tour`): each call is a signed
Action, approval-requiring capabilities get a durable approval first, every Action must end
with exactly one completed ActionResult (a streaming capability's after a gap-free chunk
sequence and a terminal chunk, any other's with no chunk, as upstream), and every operation
of the worker's manifest must be reached.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.integration.stack import ENDPOINT, Stack
from worker.qualify.deployment import Deployment, Evidence
from worker.qualify.items import Context
from worker.qualify.settings import QualifySettings
from worker.qualify.tour import Tour
from worker.settings import Settings
from worker.testing.identities import APPROVER_UNTENANTED
from worker.testing.scenario import reply_text


@pytest.fixture
async def tour(route_stack: Stack) -> AsyncIterator[Tour]:
    """The driver's tour of the stack's endpoint, as the stack's caller and approver."""
    stack = route_stack
    await stack.spawn("w1")
    trust = stack.trust
    settings = Settings(
        nats_url=stack.nats_url,
        redis_url=stack.redis_url,
        hermes_endpoints=stack.env["AIPD_HERMES_ENDPOINTS"],
        hermes_api_key_file=stack.env["AIPD_HERMES_API_KEY_FILE"],
        **trust.settings_overrides(),
    )
    qualify = QualifySettings(
        gateway_signing_key_file=trust.seed_file,
        trusted_worker_keys_file=trust.worker_keys_file,
        qualify_approver_key_file=trust.approver_seed_files[APPROVER_UNTENANTED],
    )
    deployment = await Deployment.connect(settings, qualify)
    try:
        deployment.manifests[ENDPOINT] = await deployment.client.manifest(ENDPOINT)
        yield Tour(Context(deployment, [ENDPOINT]), Evidence(), ENDPOINT)
    finally:
        await deployment.close()


async def test_every_route_is_invocable_over_nats(tour: Tour) -> None:
    chat = await tour.ok("chat", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat["choices"][0]["message"]["content"] == reply_text("hi")
    await tour.everything()
    manifest = tour.deployment.manifests[ENDPOINT]
    assert tour.seen == {entry["name"] for entry in manifest["capabilities"]}
    assert len(tour.seen) == 35
