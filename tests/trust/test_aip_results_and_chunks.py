"""The results and chunks subjects against the AIP 1.0 rules (shared/reference/aip-1.0-wire.md
§1.3-§1.5, §2, §7.2-§7.4), checked from the rules, not by the codec against itself:

- Envelopes a consumer builds by hand (plain `json`, PyNaCl, the seeds and did:keys of
  tests/vectors/aip/make_vectors.py) are read, or refused, by `decode_result` and
  `AipClient.believe_result`;
- what `encode_result` / `encode_chunk` write is checked field by field against
  hand-written expectations, and the result's signature with PyNaCl over canonical JSON
  rebuilt with `json.dumps` (§2.1: sorted keys, compact; ASCII content, where it equals
  serde_json's text).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from schemas.action import Action, Identity, Received, Trace
from schemas.chunk import ChunkKind, make_chunk
from schemas.errors import EnvelopeRejected, ErrorCategory, ErrorCode, ProtocolError
from schemas.result import ActionResult, ResultStatus
from tests.vectors.aip.make_vectors import did, key, sign
from worker.aip.did_key import parse_public_key
from worker.aip.signing import AipSigner
from worker.client import AipClient
from worker.errors import UnverifiedResponse
from worker.trust.responses import ChunkChain, sha256_hex
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.chunks import decode_chunk, encode_chunk
from worker.wire.results import as_sent, decode_result, encode_result

ACTION = "act_" + "c" * 32
OURS = "org.aip-hermes-worker"
SEED = 7  # crates/aip-crypto did_key_round_trips / aip-connector-host tests
STRANGER = 9


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _hand_result(
    *,
    seed: int | None = SEED,
    body: dict[str, Any] | None = None,
    extension: dict[str, Any] | None = None,
) -> bytes:
    """An `action_result` Envelope as a consumer in another language would sign it (§2.2:
    `from` and `security.did` set, the canonical JSON signed, padded base64 added)."""
    envelope: dict[str, Any] = {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.action_result",
        "message_id": "msg_0190a5b4c3d27e8f9a0b1c2d3e4f5a6b",
        "sent_at": "2026-12-01T10:00:00Z",
        "in_response_to": "msg_0190a5b4c3d27e8f9a0b1c2d3e4f0000",
        "body": {
            "action_result": body
            or {"action_id": ACTION, "status": "completed", "output": {"models": ["m1"]}}
        },
        "extensions": {
            OURS: extension
            or {
                "capability": "cap:hermes_agent:h1:models",
                "endpoint_id": "h1",
                "settled_by": "w1",
                "fence": 1,
                "settled_at_unix_ms": 1_796_000_000_000,
                "last_chunk_sha256": "a" * 64,
            }
        },
    }
    principal = {"id": "agent:hermes_operator:h1", "kind": "agent"}
    if seed is None:
        envelope["from"] = principal
        return _canonical(envelope)
    envelope["from"] = {**principal, "did": did(seed)}
    envelope["security"] = {"did": did(seed)}
    envelope["security"]["signature"] = sign(seed, _canonical(envelope))
    return _canonical(envelope)


def _resigned(data: bytes, signature: str) -> bytes:
    """`data` with another (well-formed) `security.signature`."""
    envelope = json.loads(data)
    envelope["security"]["signature"] = signature
    return _canonical(envelope)


def _trusting(seed: int, *, as_did: bool = False) -> AipClient:
    """A client that trusts the key of `seed`, given as its `U…` nkey (the trust files'
    form); `as_did`: as the did:key, the other spelling of the same key."""
    entry = did(seed) if as_did else parse_public_key(did(seed)).nkey
    return AipClient(None, trusted_worker_keys=TrustedGatewayKeys.of([entry]))  # type: ignore[arg-type]


# --- a consumer's Envelope, read by ours ---------------------------------------------------


def test_a_hand_signed_result_is_read_and_names_its_signer() -> None:
    result, opened = decode_result(_hand_result())
    assert opened.verified is not None
    assert opened.verified.did == did(SEED)
    assert (result.action_id, result.status, result.output) == (
        ACTION,
        ResultStatus.COMPLETED,
        {"models": ["m1"]},
    )
    assert (result.capability, result.endpoint_id, result.settled_by, result.fence) == (
        "cap:hermes_agent:h1:models",
        "h1",
        "w1",
        1,
    )
    assert result.last_chunk_sha256 == "a" * 64


@pytest.mark.parametrize("as_did", [False, True], ids=["nkey-entry", "did-key-entry"])
def test_the_client_believes_a_trusted_key_s_result_however_the_key_is_written(
    as_did: bool,
) -> None:
    assert _trusting(SEED, as_did=as_did).believe_result(_hand_result()).fence == 1


@pytest.mark.parametrize("forgery", ["unsigned", "stranger", "tampered", "bad_signature"])
def test_the_client_refuses_a_forged_result(forgery: str) -> None:
    data = {
        "unsigned": lambda: _hand_result(seed=None),
        "stranger": lambda: _hand_result(seed=STRANGER),
        "tampered": lambda: _hand_result().replace(b'"m1"', b'"m2"'),
        "bad_signature": lambda: _resigned(_hand_result(), sign(SEED, b"other bytes")),
    }[forgery]()
    with pytest.raises(UnverifiedResponse) as refused:
        _trusting(SEED).believe_result(data)
    assert refused.value.code is ErrorCode.HOST_RESPONSE_SIGNING


def test_a_tampered_result_does_not_even_open() -> None:
    with pytest.raises(EnvelopeRejected) as refused:
        decode_result(_hand_result().replace(b'"m1"', b'"m2"'))
    assert refused.value.code is ErrorCode.HOST_AUTHENTICATION


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"action_id": ACTION, "status": "pending_approval"}, "pending_approval"),
        ({"action_id": ACTION, "status": "completed", "extra": 1}, "extra"),
        (
            {
                "action_id": ACTION,
                "status": "failed",
                "error": {"code": "economic.budget", "message": "m", "category": "economic"},
            },
            "economic",
        ),
        (
            {
                "action_id": ACTION,
                "status": "failed",
                "error": {"code": "auth.nope", "message": "m", "category": "auth"},
            },
            "auth.nope",
        ),
    ],
)
def test_what_this_connector_has_no_value_for_is_refused_typed(
    body: dict[str, Any], why: str
) -> None:
    with pytest.raises(EnvelopeRejected, match=why) as refused:
        decode_result(_hand_result(body=body))
    assert refused.value.code is ErrorCode.SCHEMA_ENVELOPE_INVALID


def test_a_result_without_our_settle_facts_is_refused() -> None:
    with pytest.raises(EnvelopeRejected, match="extensions"):
        decode_result(_hand_result(extension={"endpoint_id": "h1"}))


# --- ProtocolError (§1.4, §7.4) -------------------------------------------------------------


def test_an_aip_error_maps_back_from_details_and_source() -> None:
    body = {
        "action_id": ACTION,
        "status": "failed",
        "error": {
            "code": "connector.hermes_agent.remote_temporary",
            "message": "Hermes answered 503",
            "category": "temporary",
            "retryable": True,
            "details": {"uncertain_outcome": True, "remote_status": 503, "endpoint_id": "h1"},
            "source": {"connector": "hermes-agent"},
        },
    }
    result, _ = decode_result(_hand_result(body=body))
    assert result.error == ProtocolError(
        code=ErrorCode.REMOTE_TEMPORARY,
        category=ErrorCategory.TEMPORARY,
        retryable=True,
        uncertain_outcome=True,
        message="Hermes answered 503",
        endpoint_id="h1",
        remote_status=503,
    )


def test_an_aip_error_without_details_is_certain_and_not_retryable() -> None:
    body = {
        "action_id": ACTION,
        "status": "failed",
        "error": {"code": "schema.envelope.invalid", "message": "no", "category": "permanent"},
    }
    result, _ = decode_result(_hand_result(body=body))
    assert result.error is not None
    assert (result.error.retryable, result.error.uncertain_outcome) == (False, False)
    assert (result.error.remote_status, result.error.endpoint_id) == (None, None)


def _sealed_error(error: ProtocolError) -> dict[str, Any]:
    result = ActionResult(
        action_id=ACTION,
        capability="cap:hermes_agent:h1:models",
        endpoint_id="h1",
        status=ResultStatus.FAILED,
        error=error,
        settled_by="w1",
        fence=2,
        settled_at_unix_ms=1,
    )
    data = encode_result(result, action=None, signer=None, endpoint_id="h1")
    return dict(json.loads(data)["body"]["action_result"]["error"])


@pytest.mark.aip_family("errors_uncertain_outcomes", assertions=["protocol_fields_preserved"])
def test_our_error_is_written_as_aip_s_protocol_error() -> None:
    error = ProtocolError(
        code=ErrorCode.TRANSPORT,
        category=ErrorCategory.TRANSPORT,
        retryable=False,
        uncertain_outcome=True,
        message="connection reset",
        endpoint_id="h1",
        remote_status=None,
    )
    assert _sealed_error(error) == {
        "code": "connector.hermes_agent.transport",
        "message": "connection reset",
        "category": "transport",
        "retryable": False,
        "details": {"uncertain_outcome": True, "endpoint_id": "h1"},
        "source": {"connector": "hermes-agent", "component": "aip-hermes-worker"},
    }


def test_a_long_message_is_cut_to_1024_bytes_on_a_character_boundary() -> None:
    error = ProtocolError(
        code=ErrorCode.STREAM_FAILED,
        category=ErrorCategory.PERMANENT,
        retryable=False,
        uncertain_outcome=False,
        message="é" * 1000,  # 2000 bytes
        remote_status=502,
    )
    written = _sealed_error(error)
    assert written["message"] == "é" * 512
    assert len(written["message"].encode()) == 1024
    assert written["details"] == {"uncertain_outcome": False, "remote_status": 502}


# --- what ours writes, checked by hand ------------------------------------------------------


def test_a_sealed_result_follows_the_reply_recipe_and_verifies_with_pynacl() -> None:
    signer = AipSigner.from_seed(bytes([SEED]) * 32)
    action = Action(
        id=ACTION,
        capability="cap:hermes_agent:h1:models",
        input={},
        identity=Identity(principal_id="user:a", principal_kind="human"),
        created_at_unix_ms=1,
        trace=Trace(correlation_id="corr_" + "1" * 32),
        received=Received(
            message_id="msg_" + "2" * 32, sender={"id": "service:gateway", "kind": "service"}
        ),
    )
    result = ActionResult(
        action_id=ACTION,
        capability=action.capability,
        endpoint_id="h1",
        status=ResultStatus.COMPLETED,
        output={"n": 1},
        settled_by="w1",
        fence=3,
        settled_at_unix_ms=5,
        last_chunk_sha256="b" * 64,
        action_sha256="c" * 64,
    )
    data = encode_result(result, action=action, signer=signer, endpoint_id="h1")
    envelope = json.loads(data)
    assert data == _canonical(envelope)  # canonical JSON on the wire
    assert envelope["message_type"] == "aip.core.v1.action_result"
    assert envelope["in_response_to"] == "msg_" + "2" * 32
    assert envelope["to"] == {"id": "service:gateway", "kind": "service"}
    assert envelope["correlation_id"] == "corr_" + "1" * 32
    assert envelope["from"] == {"id": "agent:hermes_operator:h1", "kind": "agent", "did": did(SEED)}
    assert envelope["body"] == {
        "action_result": {"action_id": ACTION, "status": "completed", "output": {"n": 1}}
    }
    assert envelope["extensions"] == {
        OURS: {
            "capability": "cap:hermes_agent:h1:models",
            "endpoint_id": "h1",
            "settled_by": "w1",
            "fence": 3,
            "settled_at_unix_ms": 5,
            "last_chunk_sha256": "b" * 64,
            "action_sha256": "c" * 64,
        }
    }
    security = envelope.pop("security")
    assert security["did"] == did(SEED)
    signature = base64.b64decode(security.pop("signature"), validate=True)
    envelope["security"] = security
    key(SEED).verify_key.verify(_canonical(envelope), signature)  # raises if it does not


def _chunk_envelope(data: bytes) -> dict[str, Any]:
    envelope = json.loads(data)
    assert data == _canonical(envelope)
    assert "security" not in envelope  # chunks are not signed
    return dict(envelope)


def test_sealed_chunks_are_stream_chunk_envelopes_chained_by_their_bytes() -> None:
    prev: str | None = None
    published: list[bytes] = []
    steps = [
        (ChunkKind.DATA, {"delta": "Hel"}, "message.delta", False),
        (ChunkKind.TOOL, {"tool": "t"}, "tool.started", True),
        (ChunkKind.DONE, {"status": "completed", "error": None}, None, False),
    ]
    for seq, (kind, payload, event, operator) in enumerate(steps):
        chunk = make_chunk(
            kind, action_id=ACTION, endpoint_id="h1", seq=seq, ts_unix_ms=1_796_000_000_000 + seq,
            payload=payload, provider_event=event, run_id="run_1", prev_sha256=prev,
        )  # fmt: skip
        published.append(encode_chunk(chunk, operator=operator))
        prev = sha256_hex(published[-1])
    first, second, last = (_chunk_envelope(d) for d in published)
    assert first["message_type"] == "aip.core.v1.stream_chunk"
    assert first["from"] == {"id": "agent:hermes_operator:h1", "kind": "agent"}
    assert first["sent_at"] == "2026-11-30T00:53:20Z"
    assert first["body"] == {
        "stream_chunk": {
            "action_id": ACTION,
            "sequence": 0,
            "kind": "data",
            "data": {"hermes_sse": {"event": "message.delta", "data": {"delta": "Hel"}}},
            "part": {"type": "text", "text": "Hel"},
        }
    }
    assert first["extensions"] == {
        OURS: {"endpoint_id": "h1", "run_id": "run_1", "ts_unix_ms": 1_796_000_000_000}
    }
    assert second["body"]["stream_chunk"]["data"] == {"hermes_operator": {"tool": "t"}}
    assert second["extensions"][OURS]["provider_event"] == "tool.started"
    assert second["extensions"][OURS]["prev_sha256"] == sha256_hex(published[0])
    assert last["body"]["stream_chunk"]["data"] == {
        "hermes_worker": {"status": "completed", "error": None}
    }
    assert last["body"]["stream_chunk"]["kind"] == "done"
    assert last["extensions"][OURS]["prev_sha256"] == sha256_hex(published[1])
    # The signed result naming the last chunk's hash closes the chain a reader followed.
    chain = ChunkChain()
    for data in published:
        chain.add(data)
    result = ActionResult(
        action_id=ACTION, capability="cap:hermes_agent:h1:chat", endpoint_id="h1",
        status=ResultStatus.COMPLETED, settled_by="w1", fence=1, settled_at_unix_ms=1,
        last_chunk_sha256=sha256_hex(published[-1]),
    )  # fmt: skip
    chain.close(result)


def test_a_hand_written_chunk_envelope_is_read() -> None:
    envelope = {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.stream_chunk",
        "message_id": "msg_0190a5b4c3d27e8f9a0b1c2d3e4f5a6b",
        "sent_at": "2026-12-01T10:00:00.5Z",
        "body": {
            "stream_chunk": {
                "action_id": ACTION,
                "sequence": 4,
                "kind": "thought",
                "data": {"hermes_sse": {"event": "reasoning.available", "data": {"text": "t"}}},
            }
        },
        "extensions": {OURS: {"endpoint_id": "h1", "ts_unix_ms": 9, "prev_sha256": "d" * 64}},
    }
    chunk, opened = decode_chunk(_canonical(envelope))
    assert opened.verified is None
    assert (chunk.seq, chunk.kind, chunk.provider_event, chunk.payload, chunk.prev_sha256) == (
        4,
        ChunkKind.THOUGHT,
        "reasoning.available",
        {"text": "t"},
        "d" * 64,
    )
    envelope["body"]["stream_chunk"]["data"] = {"provider": "x"}  # type: ignore[index]
    with pytest.raises(EnvelopeRejected, match="hermes_sse"):
        decode_chunk(_canonical(envelope))
    envelope["body"]["stream_chunk"]["kind"] = "preview"  # type: ignore[index]
    envelope["body"]["stream_chunk"]["data"] = {"hermes_worker": None}  # type: ignore[index]
    with pytest.raises(EnvelopeRejected, match="preview"):
        decode_chunk(_canonical(envelope))


def test_a_settled_result_reads_back_as_it_was_kept_in_process() -> None:
    """A settle keeps the error as sent (`as_sent`), so what the outputs and the terminal
    chunk saw is what a republish decodes from the stored Envelope."""
    error = as_sent(
        ProtocolError(
            code=ErrorCode.STREAM_FAILED,
            category=ErrorCategory.PERMANENT,
            retryable=False,
            uncertain_outcome=True,
            message="x" * 2000,
            endpoint_id="h1",
            remote_status=500,
        )
    )
    assert len(error.message) == 1024
    result = ActionResult(
        action_id=ACTION, capability="cap:hermes_agent:h1:models", endpoint_id="h1",
        status=ResultStatus.FAILED, output={"partial": [1.5, "é"]}, error=error,
        settled_by="w1", fence=2, settled_at_unix_ms=7, last_chunk_sha256="e" * 64,
        action_sha256="f" * 64, original_action_id="act_" + "d" * 32,
    )  # fmt: skip
    signer = AipSigner.from_seed(bytes([SEED]) * 32)
    data = encode_result(result, action=None, signer=signer, endpoint_id="h1")
    assert decode_result(data)[0] == result


def _validator(message_type: str) -> Draft202012Validator:
    path = Path(__file__).parents[2] / "schemas" / "json" / f"{message_type}.json"
    return Draft202012Validator(json.loads(path.read_text("utf-8")))


@pytest.mark.parametrize("operator", [False, True])
def test_what_the_worker_writes_validates_against_the_exported_envelope_schemas(
    operator: bool,
) -> None:
    """docs/publishing.md tells a consumer to validate with `schemas/json/`: every data form
    and a signed and an unsigned failed result must pass."""
    chunks = _validator("aip.core.v1.stream_chunk")
    for seq, (kind, payload, event) in enumerate(
        [
            (ChunkKind.DATA, {"delta": "x"}, "message.delta"),
            (ChunkKind.TOOL, {"tool": "t"}, None),
            (ChunkKind.DONE, {"status": "completed", "error": None}, None),
        ]
    ):
        chunk = make_chunk(
            kind, action_id=ACTION, endpoint_id="h1", seq=seq, ts_unix_ms=1_796_000_000_000,
            payload=payload, provider_event=event, run_id="run_1",
            prev_sha256=None if seq == 0 else "a" * 64,
        )  # fmt: skip
        document = json.loads(encode_chunk(chunk, operator=operator))
        assert [e.message for e in chunks.iter_errors(document)] == []
    results = _validator("aip.core.v1.action_result")
    result = ActionResult(
        action_id=ACTION, capability="cap:hermes_agent:h1:models", endpoint_id="h1",
        status=ResultStatus.FAILED, error=as_sent(ProtocolError(
            code=ErrorCode.STREAM_FAILED, category=ErrorCategory.PERMANENT, retryable=False,
            uncertain_outcome=True, message="m", remote_status=500, endpoint_id="h1",
        )),
        settled_by="w1", fence=1, settled_at_unix_ms=1, last_chunk_sha256="a" * 64,
        action_sha256="b" * 64,
    )  # fmt: skip
    for signer in (AipSigner.from_seed(bytes([SEED]) * 32), None):
        document = json.loads(encode_result(result, action=None, signer=signer, endpoint_id="h1"))
        assert [e.message for e in results.iter_errors(document)] == []
