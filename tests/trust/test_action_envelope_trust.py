"""Action Envelope trust (docs/security.md): an AIP Action Envelope is admitted only when its
signature verifies and its `did:key` is a trusted gateway key, whichever spelling (`U…`
nkey or `did:key:z…`) the trust file lists it in. Envelopes are built from the AIP rules
(`tests/aip_actions.py`), not with the project's codec."""

from __future__ import annotations

import logging
from pathlib import Path

import nacl.signing
import pytest
from redis.asyncio import Redis
from trust_support import UNGOVERNED, endpoint

from schemas.errors import EnvelopeRejected, ErrorCode
from tests.aip_actions import action_envelope, canonical, did_of, key_of_nkey_seed, sign
from worker.errors import ConnectorError, TrustConfigError
from worker.settings import Settings
from worker.store.stores import Stores
from worker.testing.identities import (
    ISSUER,
    REVISION,
    USER_UNTENANTED,
    TrustFiles,
)
from worker.trust.gate import TrustGate
from worker.trust.signing import (
    TrustedGatewayKeys,
    generate_keypair,
    sign_envelope,
    verify_envelope,
)
from worker.wire.actions import decode_action


def _signed(key: nacl.signing.SigningKey) -> bytes:
    envelope = action_envelope(
        endpoint="hermes-a", principal=USER_UNTENANTED, issuer=ISSUER, revision=REVISION
    )
    return canonical(sign(envelope, key))


def _signer(gate: TrustGate, payload: bytes) -> str | None:
    return gate.verify_action_signer(decode_action(payload)[1].verified)


def _refused(gate: TrustGate, payload: bytes) -> ConnectorError:
    with pytest.raises(ConnectorError) as caught:
        _signer(gate, payload)
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION
    return caught.value


def _gate(trust_files: TrustFiles, keys_file: Path, *, allow_unsigned: bool = False) -> TrustGate:
    overrides = trust_files.settings_overrides(allow_unsigned=allow_unsigned)
    overrides["trusted_gateway_keys_file"] = keys_file
    return TrustGate.from_settings(Settings(**overrides))


def _keys_file(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "gateway-keys"
    path.write_text("".join(f"{entry}\n" for entry in entries))
    path.chmod(0o600)
    return path


def test_an_nkey_entry_trusts_the_same_keys_action_envelopes(
    gate: TrustGate, trust_files: TrustFiles
) -> None:
    payload = _signed(key_of_nkey_seed(trust_files.seed))
    assert _signer(gate, payload) == trust_files.public_key  # named as the file spells it


def test_a_did_key_entry_trusts_the_same_key_in_both_signature_forms(
    tmp_path: Path, trust_files: TrustFiles
) -> None:
    key = key_of_nkey_seed(trust_files.seed)
    gate = _gate(trust_files, _keys_file(tmp_path, did_of(key)))
    assert _signer(gate, _signed(key)) == did_of(key)
    # The header signature of the subjects not yet on the AIP wire, by the same key.
    headers = sign_envelope(b"payload", trust_files.seed)
    assert gate.verify_signature(b"payload", headers) == trust_files.public_key


def test_the_same_key_listed_in_both_spellings_is_a_repeat(
    tmp_path: Path, trust_files: TrustFiles
) -> None:
    key = key_of_nkey_seed(trust_files.seed)
    path = _keys_file(tmp_path, trust_files.public_key, did_of(key))
    with pytest.raises(TrustConfigError, match="line 2 repeats the key of line 1"):
        TrustedGatewayKeys.load(path)


@pytest.mark.parametrize(
    "entry",
    [
        "did:key:z6Mk",  # too short
        "did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme",  # secp256k1, not Ed25519
        "did:web:example.com",
    ],
)
def test_a_malformed_did_entry_names_its_line(tmp_path: Path, entry: str) -> None:
    path = _keys_file(tmp_path, generate_keypair().public_key, entry)
    with pytest.raises(TrustConfigError, match="line 2"):
        TrustedGatewayKeys.load(path)


def test_an_untrusted_did_key_is_refused_and_named(gate: TrustGate) -> None:
    stranger = nacl.signing.SigningKey.generate()
    error = _refused(gate, _signed(stranger))
    assert did_of(stranger) in error.message
    assert "not a trusted gateway key" in error.message


def test_an_unsigned_envelope_is_refused_unless_development_allows_it(
    tmp_path: Path, trust_files: TrustFiles, caplog: pytest.LogCaptureFixture
) -> None:
    unsigned = action_envelope(endpoint="hermes-a", principal=USER_UNTENANTED)
    unsigned["from"] = {"id": "service:test-gateway", "kind": "service"}
    payload = canonical(unsigned)
    keys = _keys_file(tmp_path, trust_files.public_key)
    assert "unsigned" in _refused(_gate(trust_files, keys), payload).message
    caplog.set_level(logging.WARNING, logger="worker.trust.gate")
    development = _gate(trust_files, keys, allow_unsigned=True)
    assert _signer(development, payload) is None
    assert any("UNSIGNED" in r.getMessage() for r in caplog.records)
    # A present signature is verified all the same: an altered Envelope never passes.
    altered = sign(unsigned, key_of_nkey_seed(trust_files.seed))
    altered["body"]["action"]["input"] = {"altered": True}
    with pytest.raises(EnvelopeRejected) as caught:
        decode_action(canonical(altered))
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION


def test_without_gateway_keys_every_action_envelope_is_refused(trust_files: TrustFiles) -> None:
    settings = Settings(**{**trust_files.settings_overrides(), "trusted_gateway_keys_file": None})
    gate = TrustGate.from_settings(settings)
    error = _refused(gate, _signed(key_of_nkey_seed(trust_files.seed)))
    assert "AIPD_TRUSTED_GATEWAY_KEYS_FILE" in error.message


async def test_admission_of_a_rule_built_envelope_names_the_signer(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    payload = _signed(key_of_nkey_seed(trust_files.seed))
    decision = await gate.admit(
        payload=payload, endpoint=endpoint("hermes-a"), spec=UNGOVERNED, stores=Stores.over(redis)
    )
    assert decision.signer == trust_files.public_key
    assert decision.principal_id == USER_UNTENANTED


def test_header_verification_of_a_did_listed_key(tmp_path: Path) -> None:
    pair = generate_keypair()
    key = key_of_nkey_seed(pair.seed)
    trusted = TrustedGatewayKeys.load(_keys_file(tmp_path, did_of(key)))
    assert verify_envelope(b"x", sign_envelope(b"x", pair.seed), trusted) == pair.public_key


