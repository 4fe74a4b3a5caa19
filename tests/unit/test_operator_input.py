"""The operator input (spec "Submit a direct objective" / "Resume a provider approval"):
exactly one flat branch, refused alike by the decoder and by the published JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from schemas.codec import decode_operator_input
from schemas.errors import EnvelopeRejected
from schemas.operator import ApprovalChoice, OperatorObjective, OperatorResume

SCHEMA = json.loads(
    (Path(__file__).parents[2] / "schemas" / "json" / "OperatorInput.json").read_text()
)
SOURCE = "act_0123456789abcdef0123456789abcdef"

#: The spec's own bounded objective, verbatim.
SPEC_OBJECTIVE: dict[str, Any] = {
    "objective": "Read the open support case and prepare a factual summary.",
    "context": {"case_id": "case-example-2030"},
    "candidate_capabilities": ["cap:support:case.get"],
    "constraints": {"allow_mutations": False},
}
#: The spec's own resume, verbatim.
SPEC_RESUME: dict[str, Any] = {
    "resume": {"source_action_id": SOURCE, "choice": "once", "resolve_all": False}
}

#: (input, what the refusal message says): every shape the spec does not allow.
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({}, "exactly one"),
    ({"context": {"case_id": "c"}}, "exactly one"),
    ({**SPEC_OBJECTIVE, **SPEC_RESUME}, "exactly one"),
    ({"objective": "x", **SPEC_RESUME}, "exactly one"),
    ({**SPEC_RESUME, "context": None}, "beside it: context"),
    ({**SPEC_RESUME, "context": {"case_id": "c"}}, "beside it: context"),
    ({**SPEC_RESUME, "candidate_capabilities": []}, "beside it: candidate_capabilities"),
    ({**SPEC_RESUME, "constraints": {}}, "beside it: constraints"),
    # The withdrawn nested form is no longer a second way in.
    ({"objective": {"objective": "x"}}, "Expected `str`"),
    ({"objective": ""}, "length >= 1"),
    ({"objective": "x", "candidate_capabilities": ["c"] * 257}, "length <= 256"),
    ({"objective": "x", "candidate_capabilities": [""]}, "length >= 1"),
    ({"objective": "x", "constraints": ["no"]}, "Expected `object`"),
    ({"objective": "x", "identity": {"principal_id": "admin"}}, "unknown field"),
    ({"resume": {"source_action_id": SOURCE, "choice": "yes"}}, "Invalid enum"),
    ({"resume": {"source_action_id": "act_x", "choice": "once"}}, "matching regex"),
    ({"resume": {"source_action_id": SOURCE, "choice": "once", "why": 1}}, "unknown field"),
]


def test_the_spec_objective_decodes_flat_with_every_field() -> None:
    branch = decode_operator_input(SPEC_OBJECTIVE).branch()
    assert branch == OperatorObjective(
        objective=SPEC_OBJECTIVE["objective"],
        context={"case_id": "case-example-2030"},
        candidate_capabilities=["cap:support:case.get"],
        constraints={"allow_mutations": False},
    )


def test_an_objective_alone_takes_the_spec_defaults() -> None:
    branch = decode_operator_input({"objective": "x"}).branch()
    assert branch == OperatorObjective(
        objective="x", context=None, candidate_capabilities=[], constraints={}
    )


def test_the_spec_resume_decodes_alone() -> None:
    branch = decode_operator_input(SPEC_RESUME).branch()
    assert branch == OperatorResume(
        source_action_id=SOURCE, choice=ApprovalChoice.ONCE, resolve_all=False
    )


@pytest.mark.parametrize(("value", "reason"), REFUSED)
def test_a_shape_the_spec_does_not_allow_is_refused(value: dict[str, Any], reason: str) -> None:
    with pytest.raises(EnvelopeRejected, match="input: ") as refused:
        decode_operator_input(value)
    assert reason in refused.value.reason


@pytest.mark.parametrize("value", [SPEC_OBJECTIVE, {"objective": "x"}, SPEC_RESUME])
def test_the_published_schema_accepts_what_the_decoder_accepts(value: dict[str, Any]) -> None:
    jsonschema.validate(value, SCHEMA, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize(("value", "reason"), REFUSED)
def test_the_published_schema_refuses_what_the_decoder_refuses(
    value: dict[str, Any], reason: str
) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(value, SCHEMA, cls=jsonschema.Draft202012Validator)
