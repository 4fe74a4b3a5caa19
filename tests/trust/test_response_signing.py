"""Signed responses: the worker's key, the result's AIP signature, the chunk chain, DLQ
entries.

Pure functions and files; the same checks through live workers are in
tests/integration/test_signed_responses.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from schemas.chunk import ChunkKind, make_chunk
from schemas.errors import ErrorCode
from schemas.result import ActionResult, ResultStatus
from worker.errors import ResponseSigningConfigError, UnverifiedResponse
from worker.testing.identities import TrustFiles
from worker.trust.responses import (
    ChunkChain,
    ResponseSigner,
    sha256_hex,
    signer_from_settings,
    verify_dead_letter,
    verify_result,
)
from worker.trust.signing import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    TrustedGatewayKeys,
    generate_keypair,
    write_seed_file,
)
from worker.wire.chunks import encode_chunk
from worker.wire.dead_letters import dead_letter_facts, encode_dead_letter
from worker.wire.results import encode_result

ACTION = "act_" + "1" * 32


def _keys(trust_files: TrustFiles) -> TrustedGatewayKeys:
    return TrustedGatewayKeys.load(trust_files.worker_keys_file, what="trusted worker keys file")


def _chain(count: int) -> list[bytes]:
    """`count` published chunks of one Action, each naming the hash of the one before."""
    out: list[bytes] = []
    prev = None
    for seq in range(count):
        kind = ChunkKind.DONE if seq == count - 1 else ChunkKind.DATA
        data = encode_chunk(
            make_chunk(
                kind,
                action_id=ACTION,
                endpoint_id="h1",
                seq=seq,
                ts_unix_ms=1,
                payload={"n": seq},
                prev_sha256=prev,
            )
        )
        out.append(data)
        prev = sha256_hex(data)
    return out


def _result(last: bytes | None) -> ActionResult:
    return ActionResult(
        action_id=ACTION,
        capability="cap:hermes_agent:h1:models",
        endpoint_id="h1",
        status=ResultStatus.COMPLETED,
        output={"ok": True},
        settled_by="w1",
        fence=1,
        settled_at_unix_ms=1,
        last_chunk_sha256=None if last is None else sha256_hex(last),
    )


def _sealed(result: ActionResult, signer: ResponseSigner | None) -> bytes:
    return encode_result(
        result, action=None, signer=signer.aip if signer else None, endpoint_id="h1"
    )


def test_a_signed_result_verifies_and_names_its_signer(trust_files: TrustFiles) -> None:
    signer = ResponseSigner.load(trust_files.worker_seed_file)
    payload = _sealed(_result(None), signer)
    assert b'"did":"' + signer.aip.did.encode() + b'"' in payload
    assert signer.aip.public_key.nkey == signer.public_key  # one key, two spellings
    assert verify_result(payload, _keys(trust_files)).output == {"ok": True}


@pytest.mark.parametrize("forgery", ["unsigned", "untrusted_key", "altered_bytes"])
def test_a_forged_result_is_refused(trust_files: TrustFiles, forgery: str, tmp_path: Path) -> None:
    payload = _sealed(_result(None), None)
    reason = "unsigned"
    if forgery == "untrusted_key":
        other = tmp_path / "other.seed"
        write_seed_file(other, generate_keypair().seed)
        payload = _sealed(_result(None), ResponseSigner.load(other))
        reason = "not a trusted worker key"
    elif forgery == "altered_bytes":
        payload = _sealed(_result(None), ResponseSigner.load(trust_files.worker_seed_file))
        payload = payload.replace(b'"ok":true', b'"ok":false')
        reason = "does not match"
    with pytest.raises(UnverifiedResponse, match=rf"^result.*{reason}") as refused:
        verify_result(payload, _keys(trust_files))
    assert refused.value.code.value == "connector_host.response_signing"


def test_an_intact_chain_closes_on_the_result_that_names_its_last_chunk() -> None:
    published = _chain(5)
    chain = ChunkChain()
    assert [chain.add(data).seq for data in published] == [0, 1, 2, 3, 4]
    chain.close(_result(published[-1]))


def test_a_chain_read_from_a_later_seq_still_closes() -> None:
    published = _chain(5)
    chain = ChunkChain()
    for data in published[2:]:
        chain.add(data)
    chain.close(_result(published[-1]))


def test_a_forged_chunk_breaks_the_next_link() -> None:
    published = _chain(4)
    forged = encode_chunk(
        make_chunk(
            ChunkKind.DATA,
            action_id=ACTION,
            endpoint_id="h1",
            seq=1,
            ts_unix_ms=1,
            payload={"n": "forged"},
            prev_sha256=sha256_hex(published[0]),
        )
    )
    chain = ChunkChain()
    chain.add(published[0])
    chain.add(forged)  # it names the right predecessor: only the next link can tell
    with pytest.raises(UnverifiedResponse, match=r"chunk 2 .* does not follow chunk 1"):
        chain.add(published[2])


def test_a_forged_last_chunk_does_not_close_on_the_signed_result() -> None:
    published = _chain(3)
    forged_end = encode_chunk(
        make_chunk(
            ChunkKind.DONE,
            action_id=ACTION,
            endpoint_id="h1",
            seq=2,
            ts_unix_ms=1,
            payload={"status": "completed"},
            prev_sha256=sha256_hex(published[1]),
        )
    )
    chain = ChunkChain()
    for data in (*published[:2], forged_end):
        chain.add(data)
    with pytest.raises(UnverifiedResponse, match="does not end the chunk chain"):
        chain.close(_result(published[-1]))


def test_a_gap_in_seq_breaks_the_chain() -> None:
    published = _chain(3)
    chain = ChunkChain()
    chain.add(published[0])
    with pytest.raises(UnverifiedResponse, match="does not follow"):
        chain.add(published[2])


def test_a_dlq_entry_is_signed_over_its_reason_and_its_bytes(trust_files: TrustFiles) -> None:
    signer = ResponseSigner.load(trust_files.worker_seed_file)
    facts = dead_letter_facts(
        dlq_id="dlq_" + "1" * 32, endpoint_id="h1", code=ErrorCode.SCHEMA_ENVELOPE_INVALID,
        reason="missing id", subject="aip.hermes.h1.actions", stream_seq=3, worker_id="w1",
        payload=b'{"not": "an action"}', keep_bytes=4096,
    )
    data = encode_dead_letter(facts, action_id=None, signer=signer.aip)
    entry, key = verify_dead_letter(data, _keys(trust_files))
    assert key == signer.public_key
    assert (entry.facts, entry.action_id) == (facts, None)
    envelope = json.loads(data)
    ours = envelope["extensions"]["org.aip-hermes-worker"]["dead_letter"]
    for tampered in ({**ours, "reason": "something else"}, {**ours, "kept": "e30="}):
        envelope["extensions"]["org.aip-hermes-worker"]["dead_letter"] = tampered
        with pytest.raises(UnverifiedResponse):
            verify_dead_letter(json.dumps(envelope).encode(), _keys(trust_files))
    unsigned = encode_dead_letter(facts, action_id=None, signer=None)
    with pytest.raises(UnverifiedResponse, match="unsigned"):
        verify_dead_letter(unsigned, _keys(trust_files))
    assert verify_dead_letter(unsigned, None)[1] is None


@pytest.mark.parametrize("problem", ["missing", "group_readable", "not_a_seed", "empty"])
def test_a_signing_key_the_worker_cannot_use_refuses_the_start(
    tmp_path: Path, problem: str
) -> None:
    path = tmp_path / "worker.seed"
    if problem != "missing":
        content = {
            "group_readable": generate_keypair().seed,
            "not_a_seed": b"SUNOTASEED",
            "empty": b"",
        }[problem]
        path.write_bytes(content)
        os.chmod(path, 0o640 if problem == "group_readable" else 0o600)
    with pytest.raises(ResponseSigningConfigError, match=r"^connector_host\.response_signing: "):
        signer_from_settings(path, allow_unsigned=False)


def test_without_a_key_the_worker_signs_nothing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert signer_from_settings(None, allow_unsigned=False) is None
    assert "every Action is refused with connector_host.response_signing" in caplog.text
    caplog.clear()
    assert signer_from_settings(None, allow_unsigned=True) is None
    assert "Development only" in caplog.text


def test_the_signature_headers_are_the_envelope_format(trust_files: TrustFiles) -> None:
    """Header signatures stay for what is not an AIP Envelope yet (DLQ entries,
    escalations, receipts, channel messages)."""
    headers = ResponseSigner.load(trust_files.worker_seed_file).headers(b"x")
    assert set(headers) == {SIGNER_HEADER, SIGNATURE_HEADER}
    assert len(headers[SIGNATURE_HEADER]) == 86
