"""Header signature trust (docs/security.md): on the subjects still signed by headers (a
cancel, a delegation), only envelopes a trusted gateway key signed are accepted. Actions
carry an AIP Envelope signature instead: tests/trust/test_action_envelope_trust.py."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

import pytest

from schemas.errors import ErrorCode
from worker.errors import ConnectorError, TrustConfigError
from worker.settings import Settings
from worker.testing.identities import TrustFiles
from worker.trust.gate import TrustGate
from worker.trust.signing import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    TrustedGatewayKeys,
    generate_keypair,
    read_seed_file,
    sign_envelope,
    verify_envelope,
)

PAYLOAD = b'{"id":"act_00000000000000000000000000000001"}'


def refused(gate: TrustGate, payload: bytes, headers: dict[str, str]) -> ConnectorError:
    with pytest.raises(ConnectorError) as caught:
        gate.verify_signature(payload, headers)
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION
    return caught.value


def test_signed_envelope_is_accepted_and_names_its_signer(
    gate: TrustGate, trust_files: TrustFiles
) -> None:
    headers = trust_files.sign(PAYLOAD)
    assert gate.verify_signature(PAYLOAD, headers) == trust_files.public_key
    assert headers[SIGNER_HEADER] == trust_files.public_key
    assert "=" not in headers[SIGNATURE_HEADER]


def test_unsigned_envelope_is_refused(gate: TrustGate) -> None:
    assert "unsigned" in refused(gate, PAYLOAD, {}).message


def test_signature_of_an_untrusted_key_is_refused(gate: TrustGate) -> None:
    stranger = generate_keypair()
    error = refused(gate, PAYLOAD, sign_envelope(PAYLOAD, stranger.seed))
    assert "not a trusted gateway key" in error.message


def test_altered_payload_with_a_replayed_signature_is_refused(
    gate: TrustGate, trust_files: TrustFiles
) -> None:
    headers = trust_files.sign(PAYLOAD)
    altered = PAYLOAD.replace(b"1", b"2")
    error = refused(gate, altered, headers)
    assert "does not match the payload" in error.message


def test_a_signature_made_for_another_payload_is_refused(
    gate: TrustGate, trust_files: TrustFiles
) -> None:
    other = trust_files.sign(b"another envelope")
    refused(gate, PAYLOAD, other)


def _signature_variants(valid: str) -> list[str]:
    raw = base64.urlsafe_b64decode(valid + "==")
    return [
        valid + "==",  # padded
        base64.b64encode(raw).decode(),  # standard alphabet, padded
        valid[:-1],  # too short
        valid + "A",  # too long
        valid[:10] + "!" + valid[11:],  # not base64url
        valid[:-1] + ("B" if valid[-1] == "A" else "A"),  # non-canonical or other bytes
        "",
    ]


def test_malformed_signatures_are_refused(gate: TrustGate, trust_files: TrustFiles) -> None:
    headers = trust_files.sign(PAYLOAD)
    for variant in _signature_variants(headers[SIGNATURE_HEADER]):
        refused(gate, PAYLOAD, {**headers, SIGNATURE_HEADER: variant})


@pytest.mark.parametrize(
    "mangle",
    [
        lambda key: key.lower(),
        lambda key: "A" + key[1:],  # an account key's prefix
        lambda key: key[:-1] + ("B" if key[-1] == "A" else "A"),  # checksum broken
        lambda key: key[:-2],
        lambda key: key + "\r\nX-Injected: 1",
    ],
    ids=["lowercase", "account-prefix", "checksum", "short", "crlf"],
)
def test_malformed_signer_is_refused(
    gate: TrustGate, trust_files: TrustFiles, mangle: object
) -> None:
    headers = trust_files.sign(PAYLOAD)
    assert callable(mangle)
    error = refused(gate, PAYLOAD, {**headers, SIGNER_HEADER: mangle(headers[SIGNER_HEADER])})
    assert "\r" not in error.message


def test_a_seed_sent_as_signer_is_refused_and_not_echoed(
    gate: TrustGate, trust_files: TrustFiles
) -> None:
    headers = {**trust_files.sign(PAYLOAD), SIGNER_HEADER: trust_files.seed.decode()}
    assert trust_files.seed.decode() not in refused(gate, PAYLOAD, headers).message


def test_signer_and_signature_must_come_together(gate: TrustGate, trust_files: TrustFiles) -> None:
    headers = trust_files.sign(PAYLOAD)
    refused(gate, PAYLOAD, {SIGNER_HEADER: headers[SIGNER_HEADER]})
    refused(gate, PAYLOAD, {SIGNATURE_HEADER: headers[SIGNATURE_HEADER]})


def test_header_names_match_case_insensitively_but_never_twice(
    gate: TrustGate, trust_files: TrustFiles
) -> None:
    headers = trust_files.sign(PAYLOAD)
    lowered = {name.lower(): value for name, value in headers.items()}
    assert gate.verify_signature(PAYLOAD, lowered) == trust_files.public_key
    stranger = sign_envelope(PAYLOAD, generate_keypair().seed)
    doubled = {**headers, SIGNER_HEADER.upper(): stranger[SIGNER_HEADER]}
    assert "more than once" in refused(gate, PAYLOAD, doubled).message


def test_every_key_in_the_file_is_trusted_so_keys_can_rotate(tmp_path: Path) -> None:
    old, new = generate_keypair(), generate_keypair()
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# rotation\n\n{old.public_key}  # retiring\n{new.public_key}\n")
    trusted = TrustedGatewayKeys.load(keys_file)
    assert len(trusted) == 2
    for pair in (old, new):
        assert verify_envelope(PAYLOAD, sign_envelope(PAYLOAD, pair.seed), trusted) == (
            pair.public_key
        )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{good}\nUNOTAKEY\n", "line 2"),
        ("# only a comment\n\n", "holds no key"),
        ("# header\n{good}\n\n{good}\n", "line 4 repeats the key of line 2"),
        ("{seed}\n", "line 1"),
    ],
)
def test_keys_file_errors_name_the_line(tmp_path: Path, content: str, expected: str) -> None:
    pair = generate_keypair()
    keys_file = tmp_path / "keys"
    keys_file.write_text(content.format(good=pair.public_key, seed=pair.seed.decode()))
    with pytest.raises(TrustConfigError, match=expected) as caught:
        TrustedGatewayKeys.load(keys_file)
    assert pair.seed.decode() not in str(caught.value)


def test_keys_file_others_may_write_is_refused(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(generate_keypair().public_key + "\n")
    os.chmod(keys_file, 0o646)  # noqa: S103 (the refused mode)
    with pytest.raises(TrustConfigError, match="write"):
        TrustedGatewayKeys.load(keys_file)


def test_startup_error_names_the_setting(tmp_path: Path, trust_files: TrustFiles) -> None:
    bad = tmp_path / "bad-keys"
    bad.write_text("not-a-key\n")
    settings = Settings(**{**trust_files.settings_overrides(), "trusted_gateway_keys_file": bad})
    with pytest.raises(TrustConfigError, match=r"^AIPD_TRUSTED_GATEWAY_KEYS_FILE: .*line 1"):
        TrustGate.from_settings(settings)


def test_without_gateway_keys_every_envelope_is_refused(trust_files: TrustFiles) -> None:
    settings = Settings(**{**trust_files.settings_overrides(), "trusted_gateway_keys_file": None})
    gate = TrustGate.from_settings(settings)
    error = refused(gate, PAYLOAD, trust_files.sign(PAYLOAD))
    assert "AIPD_TRUSTED_GATEWAY_KEYS_FILE" in error.message


def test_unsigned_envelopes_in_development_are_accepted_with_a_warning_each_time(
    trust_files: TrustFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="worker.trust.gate")
    gate = TrustGate.from_settings(Settings(**trust_files.settings_overrides(allow_unsigned=True)))
    assert any("Development only" in r.getMessage() for r in caplog.records)
    caplog.clear()
    assert gate.verify_signature(PAYLOAD, {}) is None
    assert gate.verify_signature(PAYLOAD, {}) is None
    unsigned = [r for r in caplog.records if "UNSIGNED" in r.getMessage()]
    assert len(unsigned) == 2
    assert all(r.levelno == logging.WARNING for r in unsigned)


def test_development_mode_still_refuses_a_bad_signature(trust_files: TrustFiles) -> None:
    gate = TrustGate.from_settings(Settings(**trust_files.settings_overrides(allow_unsigned=True)))
    headers = trust_files.sign(PAYLOAD)
    refused(gate, PAYLOAD + b" ", headers)
    assert gate.verify_signature(PAYLOAD, headers) == trust_files.public_key


def test_seed_file_is_owner_only_and_round_trips(trust_files: TrustFiles) -> None:
    assert trust_files.seed_file.stat().st_mode & 0o777 == 0o600
    assert read_seed_file(trust_files.seed_file) == trust_files.seed
    assert trust_files.seed.decode() not in repr(trust_files)
