"""`worker.wire.escalations` against the hand-written vectors and against bad input.

The valid vectors (tests/vectors/aip/message_envelopes.json, written by make_vectors.py from
the published rules, signed with PyNaCl) decode into the internal escalation and
resolution with the documented mapping; what the codec writes for them is byte for byte
what the rules give. Anything else on these subjects (garbage, another message type, a
form or result of another shape, a status that contradicts its choice, a link to no
escalation, a signature that does not verify) is refused with a typed `EnvelopeRejected`,
never another exception.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.escalation import EscalationKind, ResolutionKind
from schemas.operator import ApprovalChoice
from schemas.result import ResultStatus
from worker.aip.signing import AipSigner
from worker.wire.escalations import (
    decode_escalation,
    decode_resolution,
    encode_escalation,
    encode_resolution,
)

VECTORS = json.loads(
    (Path(__file__).parents[1] / "vectors" / "aip" / "message_envelopes.json").read_text("utf-8")
)["message_types"]
ESCALATIONS = [case["envelope"] for case in VECTORS["aip.core.v1.escalation"]["valid"]]
RESOLUTIONS = [case["envelope"] for case in VECTORS["aip.core.v1.escalation_resolution"]["valid"]]
T0_MS = 1796083200000


def _bytes(envelope: dict[str, Any]) -> bytes:
    return json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()


def _seed(number: int) -> AipSigner:
    return AipSigner.from_seed(bytes([number]) * 32)


def test_the_approval_vector_decodes_as_documented_and_re_encodes_to_its_bytes() -> None:
    escalation, opened = decode_escalation(_bytes(ESCALATIONS[0]))
    assert opened.verified is not None
    assert opened.verified.did == _seed(92).did
    assert escalation.escalation_id == "esc_0000000000000000000000000000e501"
    assert escalation.kind is EscalationKind.APPROVAL
    assert escalation.status is ResultStatus.REQUIRES_HUMAN
    assert escalation.message is None  # the reason is the decision: no diagnostic
    assert escalation.raised_by == "worker-h1-1"
    assert escalation.raised_at_unix_ms == T0_MS
    assert escalation.deadline_unix_ms == T0_MS + 900_000
    assert escalation.approval is not None
    assert escalation.approval.choices == [
        ApprovalChoice.ONCE,
        ApprovalChoice.SESSION,
        ApprovalChoice.DENY,
    ]
    assert (escalation.principal_id, escalation.tenant_id) == ("user:demo", None)
    # What the codec writes for it is the vector, byte for byte (Ed25519 is deterministic).
    assert encode_escalation(escalation, signer=_seed(92), risk="high") == _bytes(ESCALATIONS[0])


def test_the_decision_vector_is_an_uncertain_outcome_with_its_diagnostic() -> None:
    escalation, _ = decode_escalation(_bytes(ESCALATIONS[1]))
    assert escalation.kind is EscalationKind.DECISION
    assert escalation.uncertain_outcome is True
    assert escalation.code is not None
    assert escalation.code.value == "connector.hermes_agent.operator_outcome_unknown"
    assert escalation.message == "the run may have started: POST /v1/runs got no answer"
    assert escalation.approval is None
    assert escalation.deadline_unix_ms is None
    assert encode_escalation(escalation, signer=_seed(92)) == _bytes(ESCALATIONS[1])


@pytest.mark.parametrize(
    ("index", "kind", "choice"),
    [(0, ResolutionKind.ANSWERED, ApprovalChoice.ONCE), (1, ResolutionKind.ACKNOWLEDGED, None)],
)
def test_the_resolution_vectors_decode_and_link_to_their_escalation(
    index: int, kind: ResolutionKind, choice: ApprovalChoice | None
) -> None:
    resolution, opened = decode_resolution(_bytes(RESOLUTIONS[index]))
    assert opened.verified is not None
    assert opened.verified.did == _seed(91).did
    escalation, _ = decode_escalation(_bytes(ESCALATIONS[index]))
    assert resolution.escalation_id == escalation.escalation_id
    assert resolution.action_id == escalation.action_id
    assert (resolution.kind, resolution.choice) == (kind, choice)
    assert resolution.resolved_by == "ops:erin"
    assert resolution.resolved_at_unix_ms == T0_MS


def test_a_deny_is_rejected_and_a_repeat_is_byte_identical() -> None:
    answered, _ = decode_resolution(_bytes(RESOLUTIONS[0]))
    denied = msgspec.structs.replace(answered, choice=ApprovalChoice.DENY)
    data = encode_resolution(denied, signer=_seed(91))
    assert json.loads(data)["body"]["escalation_resolution"]["status"] == "rejected"
    assert decode_resolution(data)[0] == denied
    assert encode_resolution(denied, signer=_seed(91)) == data


def _resigned(envelope: dict[str, Any], seed: int) -> bytes:
    """`envelope` signed again by `seed`, by the rules (so a refusal is never the
    signature's doing)."""
    import nacl.signing

    from tests.aip_actions import canonical, did_of

    key = nacl.signing.SigningKey(bytes([seed]) * 32)
    out = copy.deepcopy(envelope)
    out["from"]["did"] = did_of(key)
    out["security"] = {"did": did_of(key)}
    out["security"]["signature"] = base64.b64encode(key.sign(canonical(out)).signature).decode()
    return canonical(out)


def _escalation_with(mutate: Any) -> bytes:
    envelope = copy.deepcopy(ESCALATIONS[0])
    mutate(envelope)
    return _resigned(envelope, 92)


def _resolution_with(mutate: Any) -> bytes:
    envelope = copy.deepcopy(RESOLUTIONS[0])
    mutate(envelope)
    return _resigned(envelope, 91)


def _body(envelope: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = next(iter(envelope["body"].values()))
    return value


@pytest.mark.parametrize(
    ("why", "data"),
    [
        ("not JSON", b"\xff{"),
        ("a JSON array", b"[]"),
        ("an action_result", _bytes(VECTORS["aip.core.v1.action_result"]["valid"][0]["envelope"])),
        ("a resolution on the escalations subject", _bytes(RESOLUTIONS[0])),
        ("our old internal document", b'{"escalation_id":"esc_00","kind":"approval"}'),
        (
            "a message_id that names no escalation",
            _escalation_with(lambda e: e.update(message_id="msg_1")),
        ),
        (
            "kind `input`, which this worker never raises",
            _escalation_with(lambda e: _body(e).update(kind="input")),
        ),
        (
            "a form key of no one's",
            _escalation_with(lambda e: _body(e)["form"].update(priority=1)),
        ),
        ("no form", _escalation_with(lambda e: _body(e).pop("form"))),
        (
            "allowed_decisions that contradict the choices",
            _escalation_with(lambda e: _body(e).update(allowed_decisions=["approve"])),
        ),
        (
            "a choice this worker cannot send",
            _escalation_with(lambda e: _body(e)["form"]["approval"].update(choices=["maybe"])),
        ),
        (
            "no extension",
            _escalation_with(lambda e: e.pop("extensions")),
        ),
        (
            "an altered reason under the original signature",
            _bytes(
                {
                    **ESCALATIONS[0],
                    "body": {"escalation": {**_body(ESCALATIONS[0]), "reason": "ls -la"}},
                }
            ),
        ),
    ],
)
def test_bad_escalation_input_is_a_typed_refusal(why: str, data: bytes) -> None:
    with pytest.raises(EnvelopeRejected) as refused:
        decode_escalation(data)
    assert refused.value.code in {
        ErrorCode.ENVELOPE_DECODE_INVALID,
        ErrorCode.SCHEMA_ENVELOPE_INVALID,
        ErrorCode.HOST_AUTHENTICATION,
    }, why


@pytest.mark.parametrize(
    ("why", "data"),
    [
        ("an escalation on the resolutions subject", _bytes(ESCALATIONS[0])),
        ("no in_response_to", _resolution_with(lambda e: e.pop("in_response_to"))),
        (
            "in_response_to names no escalation",
            _resolution_with(lambda e: e.update(in_response_to="corr_1")),
        ),
        (
            "approved with the choice deny",
            _resolution_with(lambda e: _body(e)["result"].update(choice="deny")),
        ),
        (
            "handoff_completed with a choice",
            _resolution_with(lambda e: _body(e).update(status="handoff_completed")),
        ),
        (
            "a status this project never writes (modified)",
            _resolution_with(lambda e: _body(e).update(status="modified")),
        ),
        (
            "resolved_by another than the sender",
            _resolution_with(lambda e: _body(e)["resolved_by"].update(id="ops:mallory")),
        ),
        (
            "resolved_at and resolved_at_unix_ms disagree",
            _resolution_with(lambda e: _body(e).update(resolved_at="2026-12-01T00:00:01Z")),
        ),
        ("a result of another shape", _resolution_with(lambda e: _body(e).update(result=[1]))),
        ("no result", _resolution_with(lambda e: _body(e).pop("result"))),
        (
            "a resolved_at Python cannot read",
            _resolution_with(
                lambda e: _body(e).update(resolved_at="2026-12-01T00:00:00.123456789Z")
            ),
        ),
    ],
)
def test_bad_resolution_input_is_a_typed_refusal(why: str, data: bytes) -> None:
    with pytest.raises(EnvelopeRejected):
        decode_resolution(data)


def test_random_corruptions_are_typed_refusals_never_crashes() -> None:
    """Every single-byte corruption of a valid Envelope, at random places: a refusal is
    always EnvelopeRejected (a change that leaves a valid document is only a key order or
    whitespace change, which a signature does not cover, or an accepted copy)."""
    rng = random.Random(25)
    for source, decode in (
        (ESCALATIONS[0], decode_escalation),
        (RESOLUTIONS[0], decode_resolution),
    ):
        data = _bytes(source)
        for _ in range(400):
            at = rng.randrange(len(data))
            mutated = data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
            try:
                decode(mutated)  # type: ignore[operator]
            except EnvelopeRejected:
                continue
