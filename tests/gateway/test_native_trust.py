"""The trusted signers file of the native NATS binding, and its subject rule: read like every
trust file (owner-only writes, strict lines, refused at start), the sanitising of §3.1."""

from __future__ import annotations

from pathlib import Path

import nacl.signing
import pytest

from tests.aip_actions import did_of
from worker.errors import NativeRefusal, TrustConfigError
from worker.gateway.native_subjects import request_subject, service_subject
from worker.gateway.native_trust import TrustedSigners, check_sent_at

DID = did_of(nacl.signing.SigningKey(b"\x07" * 32))


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "signers.txt"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_subjects_follow_the_reference_sanitising() -> None:
    assert (
        request_subject("example.com", "gateway", "v1", "aip.core.v1.action")
        == "aip.v1.example_com.gateway.v1.aip_core_v1_action"
    )
    assert service_subject("local example", "aip-daemon", "v/1\\") == (
        "aip.v1.local_example.aip-daemon.v_1_"
    )


def test_a_binding_is_read_with_its_facts(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"# comment\n\n{DID} agent:hermes kind=agent revision=3 issuer=https://i.test tenant=t1\n",
    )
    signers = TrustedSigners.load(path)
    binding = signers.sender_of(DID, {"id": "agent:hermes", "kind": "agent", "did": DID})
    identity = binding.identity()
    assert (identity.principal_id, identity.principal_kind) == ("agent:hermes", "agent")
    assert identity.credential_revision == 3
    assert identity.authentication_issuer == "https://i.test"
    assert identity.tenant_id == "t1"
    with pytest.raises(NativeRefusal) as refused:
        signers.sender_of(DID, {"id": "agent:hermes", "kind": "service"})
    assert refused.value.code == "auth.claim_mismatch"
    other = did_of(nacl.signing.SigningKey(b"\x08" * 32))
    with pytest.raises(NativeRefusal) as refused:
        signers.sender_of(other, {"id": "agent:hermes", "kind": "agent"})
    assert refused.value.code == "auth.unverified_actor"


@pytest.mark.parametrize(
    ("text", "mode", "says"),
    [
        (f"{DID} svc:a\n", 0o620, "group or others"),
        (f"{DID}\n", 0o600, "expected"),
        ("did:key:zNotAKey svc:a\n", 0o600, "did:key"),
        (f"{DID} svc:a colour=blue\n", 0o600, "kind="),
        (f"{DID} svc:a kind=robot\n", 0o600, "principal kind"),
        (f"{DID} svc:a revision=0\n", 0o600, "revision"),
        (f"{DID} svc:a\n{DID} svc:b\n", 0o600, "repeats"),
        ("# nothing\n", 0o600, "no signer"),
    ],
)
def test_a_bad_file_stops_the_start(tmp_path: Path, text: str, mode: int, says: str) -> None:
    with pytest.raises(TrustConfigError, match=says):
        TrustedSigners.load(write(tmp_path, text, mode))


def test_sent_at_window() -> None:
    now = 1_800_000_000_000
    check_sent_at(now - 299_000, now)
    check_sent_at(now + 29_000, now)
    for sent in (now - 301_000, now + 31_000):
        with pytest.raises(NativeRefusal) as refused:
            check_sent_at(sent, now)
        assert refused.value.code == "replay.message_id"
