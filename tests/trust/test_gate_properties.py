"""Property tests: whatever arrives, the gate never crashes and never admits what it should not.

Random or mutated envelopes and headers always end in a typed `ConnectorError` (or, for a
genuinely signed and backed Action, a decision whose facts the directory vouches for).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from trust_support import GOVERNED, UNGOVERNED, action_document, encode_action, endpoint, now_ms

from schemas.action import Action
from schemas.errors import EnvelopeRejected, ErrorCode
from worker.errors import ConnectorError
from worker.settings import Settings
from worker.store.stores import Stores
from worker.testing.identities import (
    REVISION,
    TENANT_A,
    TENANT_B,
    USER_A,
    USER_B,
    USER_UNTENANTED,
    TrustFiles,
    write_trust_files,
)
from worker.testing.services import ServiceHandle
from worker.trust.gate import AdmitDecision, TrustGate
from worker.trust.identities import IdentityDirectory
from worker.trust.projection import MAX_HEADER_VALUE_BYTES
from worker.trust.signing import SIGNATURE_HEADER, SIGNER_HEADER
from worker.wire.actions import decode_action

ADMISSION_CODES = {
    ErrorCode.HOST_AUTHENTICATION,
    ErrorCode.HOST_CREDENTIAL_REVISION_DENIED,
    ErrorCode.HOST_ROUTE_MISMATCH,
    ErrorCode.TENANT_MISMATCH,
    ErrorCode.HOST_APPROVAL_AUTHORIZATION_UNAVAILABLE,
    ErrorCode.HOST_APPROVAL_AUTHORIZATION_CONFLICT,
    ErrorCode.CONFIGURATION_OR_INPUT,
}
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrustFiles, TrustGate]:
    files = write_trust_files(Path(tmp_path_factory.mktemp("trust")))
    return files, TrustGate.from_settings(Settings(**files.settings_overrides()))


def _signed_payload(files: TrustFiles) -> tuple[bytes, dict[str, str]]:
    """A header-signed payload, as the cancel and delegation subjects take one."""
    payload = msgspec.json.encode(action_document())
    return payload, files.sign(payload)


def _sealed(files: TrustFiles) -> tuple[Action, bytes]:
    """A genuine Action and its AIP Action Envelope, signed by the gateway key."""
    return encode_action(action_document(), files)


@PROPERTY_SETTINGS
@given(payload=st.binary(max_size=512))
def test_random_bytes_on_the_actions_subject_are_a_typed_refusal(payload: bytes) -> None:
    with pytest.raises(EnvelopeRejected) as caught:
        decode_action(payload)
    assert caught.value.code in {
        ErrorCode.ENVELOPE_DECODE_INVALID,
        ErrorCode.SCHEMA_ENVELOPE_INVALID,
        ErrorCode.HOST_AUTHENTICATION,
    }


header_names = st.sampled_from(
    [
        SIGNER_HEADER,
        SIGNATURE_HEADER,
        SIGNER_HEADER.lower(),
        SIGNATURE_HEADER.upper(),
        "Nats-Msg-Id",
    ]
) | st.text(max_size=20)


@PROPERTY_SETTINGS
@given(
    payload=st.binary(max_size=512),
    headers=st.dictionaries(header_names, st.text(max_size=120), max_size=4),
)
def test_random_payloads_and_headers_are_refused_as_authentication(
    world: tuple[TrustFiles, TrustGate], payload: bytes, headers: dict[str, str]
) -> None:
    _, gate = world
    with pytest.raises(ConnectorError) as caught:
        gate.verify_signature(payload, headers)
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION


mutations = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
)


def _mutate(payload: bytes, mutation: tuple[str, int, int]) -> bytes:
    kind, position, value = mutation
    at = position % len(payload)
    if kind == "flip":
        return payload[:at] + bytes([payload[at] ^ value]) + payload[at + 1 :]
    if kind == "insert":
        return payload[:at] + bytes([value]) + payload[at:]
    if kind == "delete":
        return payload[:at] + payload[at + 1 :]
    return payload[:at]


@PROPERTY_SETTINGS
@given(mutation=mutations)
def test_any_change_to_a_header_signed_payload_is_refused(
    world: tuple[TrustFiles, TrustGate], mutation: tuple[str, int, int]
) -> None:
    files, gate = world
    payload, headers = _signed_payload(files)
    altered = _mutate(payload, mutation)
    with pytest.raises(ConnectorError) as caught:
        gate.verify_signature(altered, headers)
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION


@PROPERTY_SETTINGS
@given(mutation=mutations)
def test_any_change_to_a_signed_action_envelope_is_refused_or_means_the_same(
    world: tuple[TrustFiles, TrustGate], mutation: tuple[str, int, int]
) -> None:
    """A mutated Envelope is refused with a typed error, unless it still parses to the very
    same Envelope (whitespace inserted between tokens): the signature is over the
    canonical form, so such a spelling verifies, and it carries the same Action."""
    files, gate = world
    action, payload = _sealed(files)
    altered = _mutate(payload, mutation)
    try:
        decoded, opened = decode_action(altered)
    except EnvelopeRejected as exc:
        event(f"refused: {exc.code.value}")
        return
    if opened.verified is None:
        # Still an Envelope, but no longer a signed one (a byte of `"signature"` went):
        # the gate refuses it as unsigned.
        with pytest.raises(ConnectorError) as caught:
            gate.verify_action_signer(opened.verified)
        assert caught.value.code is ErrorCode.HOST_AUTHENTICATION
        event("refused: unsigned")
        return
    event("same meaning")
    assert gate.verify_action_signer(opened.verified) == files.public_key
    assert decoded == action


@PROPERTY_SETTINGS
@given(position=st.integers(0, 200), replacement=st.characters(codec="ascii"))
def test_any_change_to_an_action_envelopes_signature_is_refused(
    world: tuple[TrustFiles, TrustGate], position: int, replacement: str
) -> None:
    files, _ = world
    _, payload = _sealed(files)
    envelope = json.loads(payload)
    signature = envelope["security"]["signature"]
    at = position % len(signature)
    changed = signature[:at] + replacement + signature[at + 1 :]
    if changed == signature:
        return
    envelope["security"]["signature"] = changed
    with pytest.raises(EnvelopeRejected) as caught:
        decode_action(json.dumps(envelope).encode())
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION


@PROPERTY_SETTINGS
@given(position=st.integers(0, 200), replacement=st.characters(codec="ascii"))
def test_any_change_to_the_signature_header_is_refused(
    world: tuple[TrustFiles, TrustGate], position: int, replacement: str
) -> None:
    files, gate = world
    payload, headers = _signed_payload(files)
    signature = headers[SIGNATURE_HEADER]
    at = position % len(signature)
    changed = signature[:at] + replacement + signature[at + 1 :]
    if changed == signature:
        return
    with pytest.raises(ConnectorError) as caught:
        gate.verify_signature(payload, {**headers, SIGNATURE_HEADER: changed})
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION


short_text = st.text(min_size=1, max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
#: Each known principal with its directory tenant: claims start valid and drift at random.
KNOWN = {USER_A: TENANT_A, USER_B: TENANT_B, USER_UNTENANTED: None}


def _drifts(draw: st.DrawFn) -> bool:
    """True one time in four: mostly-valid claims reach the later checks too."""
    return draw(st.integers(0, 3)) == 0


@st.composite
def identity_claims(draw: st.DrawFn) -> dict[str, Any]:
    principal = draw(st.sampled_from(sorted(KNOWN)))
    if _drifts(draw):
        principal = draw(short_text)
    tenant = KNOWN.get(principal)
    if _drifts(draw):
        tenant = draw(st.sampled_from([TENANT_A, TENANT_B, None]) | short_text)
    revision: int | None = REVISION
    if _drifts(draw):
        revision = draw(st.none() | st.integers(0, 5))
    return {"principal": principal, "tenant": tenant, "revision": revision}


claims = st.fixed_dictionaries(
    {
        "input": st.dictionaries(st.text(max_size=8), json_values, max_size=4),
        "endpoint": st.sampled_from(["hermes-a", "hermes-b"]),
    },
    optional={
        "idempotency_key": short_text,
        "trace": st.fixed_dictionaries({}, optional={"trace_id": short_text}),
        "approval": st.fixed_dictionaries({"decision_id": short_text}),
        "delegation": st.fixed_dictionaries(
            {"delegation_id": short_text, "chain": st.lists(short_text, max_size=4)}
        ),
    },
)


async def _admit(url: str, gate: TrustGate, files: TrustFiles, case: dict[str, Any]) -> Any:
    binding = case.pop("binding")
    governed = case.pop("governed")
    try:
        _, payload = encode_action(action_document(**case), files)
    except EnvelopeRejected:
        return None
    client = Redis.from_url(url)
    try:
        return await gate.admit(
            payload=payload,
            endpoint=endpoint("hermes-a", tenant=binding),
            spec=GOVERNED if governed else UNGOVERNED,
            stores=Stores.over(client),
        )
    except ConnectorError as exc:
        return exc
    finally:
        await client.aclose()


# One Redis database for all examples, as the gate meets it in production: every example
# admits an Action of its own id, and nothing is approved, so no example reads another's keys.
@settings(
    parent=PROPERTY_SETTINGS,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    identity=identity_claims(),
    case=claims,
    binding=st.sampled_from([TENANT_A, TENANT_B, None]),
    governed=st.booleans(),
)
def test_signed_actions_with_arbitrary_claims_end_in_a_backed_decision_or_typed_refusal(
    world: tuple[TrustFiles, TrustGate],
    redis_server: ServiceHandle,
    identity: dict[str, Any],
    case: dict[str, Any],
    binding: str | None,
    governed: bool,
) -> None:
    files, gate = world
    case = {**case, **identity}
    outcome = asyncio.run(
        _admit(
            redis_server.url, gate, files, {**case, "binding": binding, "governed": governed}
        )
    )
    if outcome is None or isinstance(outcome, ConnectorError):
        event("schema-invalid" if outcome is None else f"refused: {outcome.code.value}")
        assert outcome is None or outcome.code in ADMISSION_CODES
        return
    event("admitted")
    assert isinstance(outcome, AdmitDecision)
    assert not governed, "nothing was approved, so no governed Action may be admitted"
    directory = IdentityDirectory.load(files.identity_file, now_ms=now_ms())
    known = directory.get(case["principal"])
    assert known is not None
    assert case["revision"] == known.revision
    assert case["tenant"] == known.tenant_id == outcome.tenant_id
    assert binding is None or binding == outcome.tenant_id
    assert case["endpoint"] == "hermes-a"
    for value in outcome.headers.values():
        assert value.isascii()
        assert value.isprintable()
        assert len(value.encode()) <= MAX_HEADER_VALUE_BYTES
