"""The operator input in the spec's own shapes, through a real worker process over NATS.

The spec's bounded objective example, copied verbatim, must complete end to end against the
fake Hermes and the real hermes-agent 0.19.0 alike; every shape the spec does not allow must
fail typed before a single request reaches Hermes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from schemas.chunk import DoneChunk
from schemas.result import ResultStatus
from tests.integration.stack import Stack
from worker.operator.start import PAYLOAD_KIND

#: "Submit a direct objective", verbatim.
SPEC_OBJECTIVE: dict[str, Any] = {
    "objective": "Read the open support case and prepare a factual summary.",
    "context": {"case_id": "case-example-2030"},
    "candidate_capabilities": ["cap:support:case.get"],
    "constraints": {"allow_mutations": False},
}
OUTPUT_SCHEMA = json.loads(
    (Path(__file__).parents[2] / "schemas" / "json" / "OperatorOutput.json").read_text()
)
SOURCE = "act_0123456789abcdef0123456789abcdef"
RESUME = {"source_action_id": SOURCE, "choice": "once", "resolve_all": False}

#: Each shape the spec refuses: both branches, neither, objective fields beside `resume`,
#: and the withdrawn nested objective.
REFUSED: dict[str, dict[str, Any]] = {
    "both_branches": {**SPEC_OBJECTIVE, "resume": RESUME},
    "neither_branch": {},
    "context_only": {"context": {"case_id": "case-example-2030"}},
    "context_beside_resume": {"resume": RESUME, "context": {"case_id": "case-example-2030"}},
    "null_context_beside_resume": {"resume": RESUME, "context": None},
    "capabilities_beside_resume": {"resume": RESUME, "candidate_capabilities": ["cap:x"]},
    "constraints_beside_resume": {"resume": RESUME, "constraints": {}},
    "nested_objective": {"objective": {"objective": SPEC_OBJECTIVE["objective"]}},
}


async def test_the_spec_objective_example_completes_end_to_end(route_stack: Stack) -> None:
    stack = route_stack
    await stack.spawn("w1")
    action = stack.action("operator", SPEC_OBJECTIVE)
    await stack.approve(action)
    handle = await stack.publish(action)
    result = await handle.result(timeout_s=120)
    assert result.status is ResultStatus.COMPLETED, result.error
    output = result.output
    assert output["source_action_id"] == action.id
    assert output["session_id"] == f"aip-operator-{action.id}"
    assert output["status"] == "completed"
    assert output["last_event"] == "run.completed"
    jsonschema.validate(output, OUTPUT_SCHEMA, cls=jsonschema.Draft202012Validator)
    chunks = [c async for c in handle.chunks(idle_timeout_s=30)]
    assert isinstance(chunks[-1], DoneChunk)
    # What the model was given: the run's session holds the user turn Hermes received, the
    # spec's four fields as data under the connector's payload kind.
    read = stack.action("session_messages", {"session_id": output["session_id"]})
    messages = await (await stack.publish(read)).result(timeout_s=60)
    assert messages.status is ResultStatus.COMPLETED, messages.error
    user_turns = [m["content"] for m in messages.output["data"] if m["role"] == "user"]
    assert [json.loads(turn) for turn in user_turns] == [
        {"kind": PAYLOAD_KIND, "operator_action_id": action.id, **SPEC_OBJECTIVE}
    ]


@pytest.mark.parametrize("shape", sorted(REFUSED))
@pytest.mark.aip_family("schema_enforcement", assertions=["invalid_input_rejected"])
async def test_a_shape_the_spec_refuses_fails_typed_and_sends_nothing(
    stack: Stack, shape: str
) -> None:
    await stack.spawn("w1")
    action = stack.action("operator", REFUSED[shape])
    await stack.approve(action)  # so only the input can be what refuses it
    result = await (await stack.publish(action)).result(timeout_s=30)
    assert result.status is ResultStatus.FAILED
    assert result.error is not None
    assert result.error.code == "connector.hermes_agent.configuration_or_input"
    assert (result.error.retryable, result.error.uncertain_outcome) == (False, False)
    assert "input" in result.error.message
    await stack.settled_and_acked()
    assert len(await stack.results(action.id)) == 1
    assert stack.fake is not None
    assert sum(stack.fake.stats().routes.values()) == 0
