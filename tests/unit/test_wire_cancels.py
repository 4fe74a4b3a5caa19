"""The cancel subject's codec (`worker.wire.cancels`) on its own: what it refuses, and how an
answer names the Cancel it answers. The wire itself is checked against the AIP rules by
tests/unit/test_aip_message_vectors.py and tests/integration/test_aip_cancel_wire.py."""

from __future__ import annotations

import json

import pytest

from schemas.aip.extensions import CancelFacts
from schemas.errors import EnvelopeRejected, ErrorCode
from tests.aip_actions import cancel_envelope, canonical
from worker.aip.signing import AipSigner
from worker.errors import protocol_error
from worker.wire.cancels import (
    claimed_reply,
    decode_cancel,
    decode_cancel_reply,
    encode_cancel,
    encode_error,
    requester_principal,
)
from worker.wire.envelopes import ReplyRecipe

ACTION_ID = "act_" + "a" * 32
GATEWAY = AipSigner.from_seed(bytes([21]) * 32)
WORKER = AipSigner.from_seed(bytes([92]) * 32)


def test_a_cancel_round_trips_with_its_requester_and_wait() -> None:
    data = encode_cancel(
        ACTION_ID,
        requester=requester_principal("user:alice"),
        signer=GATEWAY,
        reason="changed my mind",
        wait_ms=1500,
    )
    request = decode_cancel(data)
    assert (request.action_id, request.requested_by, request.reason, request.wait_ms) == (
        ACTION_ID,
        "user:alice",
        "changed my mind",
        1500,
    )
    assert request.opened.verified is not None
    assert request.opened.verified.did == GATEWAY.did
    assert json.loads(data)["from"]["kind"] == "human"


@pytest.mark.parametrize(
    ("principal_id", "kind"),
    [("user:a", "human"), ("agent:b", "agent"), ("service:c", "service"), ("ops", "service")],
)
def test_the_requester_kind_is_read_from_the_id_prefix(principal_id: str, kind: str) -> None:
    assert requester_principal(principal_id) == {"id": principal_id, "kind": kind}
    assert requester_principal(principal_id, "system")["kind"] == "system"


def _refused(document: dict[str, object]) -> EnvelopeRejected:
    with pytest.raises(EnvelopeRejected) as refused:
        decode_cancel(canonical(document))
    return refused.value


def test_a_cancel_without_a_requester_a_session_target_or_a_long_reason_is_refused() -> None:
    no_from = cancel_envelope(ACTION_ID)
    assert "requester" in _refused(no_from).reason
    session = cancel_envelope(ACTION_ID)
    session["from"] = {"id": "user:alice", "kind": "human"}
    session["body"]["cancel"]["target"] = {"session": "sess_" + "0" * 32}
    assert "session" in _refused(session).reason
    long_reason = cancel_envelope(ACTION_ID, reason="x" * 1025)
    long_reason["from"] = {"id": "user:alice", "kind": "human"}
    assert "reason" in _refused(long_reason).reason
    too_long_a_wait = cancel_envelope(ACTION_ID, wait_ms=120_001)
    too_long_a_wait["from"] = {"id": "user:alice", "kind": "human"}
    assert _refused(too_long_a_wait).code is ErrorCode.SCHEMA_ENVELOPE_INVALID
    with pytest.raises(EnvelopeRejected):
        encode_cancel(ACTION_ID + "0", requester={"id": "u", "kind": "human"}, signer=None)


def test_an_error_names_what_a_request_claims_even_when_it_did_not_open() -> None:
    claimed = cancel_envelope(ACTION_ID)
    claimed["from"] = {"id": "user:alice", "kind": "human"}
    reply = claimed_reply(canonical(claimed) + b"garbage")
    assert reply == ReplyRecipe()  # not JSON: nothing is claimed
    reply = claimed_reply(canonical(claimed))
    assert reply.in_response_to == claimed["message_id"]
    error = protocol_error(ErrorCode.HOST_AUTHENTICATION, "no", endpoint_id="h1")
    answer = json.loads(
        encode_error(error, reply=reply, signer=WORKER, endpoint_id="h1", action_id=None)
    )
    assert answer["in_response_to"] == claimed["message_id"]
    assert answer["to"] == claimed["from"]
    # A claimed `from` that is no Principal is not echoed: the error is still answered.
    bogus = ReplyRecipe(in_response_to="msg_1", to={"id": "x", "kind": "wizard"})
    answer = json.loads(
        encode_error(
            error,
            reply=bogus,
            signer=WORKER,
            endpoint_id="h1",
            action_id=ACTION_ID,
            cancel=CancelFacts(accepted=False, state="unknown"),
        )
    )
    assert "to" not in answer
    outcome, opened = decode_cancel_reply(canonical(answer))
    assert opened.verified is not None
    assert opened.verified.did == WORKER.did
    assert outcome.error is not None
    assert (outcome.action_id, outcome.accepted, outcome.state, outcome.error.code) == (
        ACTION_ID,
        False,
        "unknown",
        ErrorCode.HOST_AUTHENTICATION,
    )


def test_an_answer_of_another_type_is_refused() -> None:
    cancel = encode_cancel(ACTION_ID, requester={"id": "u", "kind": "human"}, signer=GATEWAY)
    with pytest.raises(EnvelopeRejected):
        decode_cancel_reply(cancel)
