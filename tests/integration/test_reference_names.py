"""A worker configured with the reference connector's `AIP_HERMES_*` names only serves, and
its operator runs with what those names set (#26 item 6): the names reach Hermes, not just
the settings object."""

from __future__ import annotations

from schemas.result import ResultStatus
from tests.integration.stack import Stack

POST_RUNS = "POST /v1/runs"
INSTRUCTIONS = "Reference-named instructions: answer briefly."
MODEL = "reference-model"


async def test_a_worker_on_reference_names_serves_and_its_operator_uses_them(
    stack: Stack,
) -> None:
    assert stack.fake is not None
    endpoints = stack.env["AIPD_HERMES_ENDPOINTS"]
    await stack.spawn(
        "w1",
        unset=("AIPD_HERMES_ENDPOINTS",),
        AIP_HERMES_ENDPOINTS=endpoints + ";",
        AIP_HERMES_OPERATOR_INSTRUCTIONS=INSTRUCTIONS,
        AIP_HERMES_OPERATOR_MODEL=MODEL,
    )
    read = await (await stack.publish(stack.action("models"))).result(timeout_s=30)
    assert read.status is ResultStatus.COMPLETED, read.error
    _, handle = await stack.operator("say hello")
    result = await handle.result(timeout_s=60)
    assert result.status is ResultStatus.COMPLETED, result.error
    (start,) = [r for r in stack.fake.requests() if r.route == POST_RUNS]
    assert start.body["instructions"].startswith(INSTRUCTIONS)
    assert start.body["model"] == MODEL
