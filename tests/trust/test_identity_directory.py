"""The trusted identity directory: bad entries stop startup; bad claims are refused."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from trust_support import UNGOVERNED, action_document, encode_action, endpoint, now_ms

from schemas.errors import ErrorCode
from worker.errors import ConnectorError, TrustConfigError
from worker.settings import Settings
from worker.store.clock import FixedClock
from worker.store.stores import Stores
from worker.testing.identities import (
    TENANT_A,
    TENANT_B,
    USER_A,
    USER_UNTENANTED,
    TrustFiles,
    identity_entries,
    write_json,
)
from worker.trust.gate import TrustGate
from worker.trust.identities import IdentityDirectory

Entries = list[dict[str, Any]]


def _set(index: int, **fields: Any) -> Callable[[Entries], None]:
    def mutate(entries: Entries) -> None:
        entries[index].update(fields)

    return mutate


def _duplicate(entries: Entries) -> None:
    entries.append(copy.deepcopy(entries[0]))


def _drop_principal(entries: Entries) -> None:
    del entries[1]["principal_id"]


STARTUP_REJECTIONS: list[tuple[str, Callable[[Entries], None], str]] = [
    (
        "zero-revision",
        _set(1, revision=0),
        r"entry 1 \(principal 'user:bob'\): revision must be non-zero",
    ),
    ("revoked", _set(2, revoked=True), r"entry 2 \(principal 'user:demo'\): is revoked"),
    (
        "expired-and-revoked",
        _set(2, revoked=True, expires_at_unix_ms=1),
        r"entry 2 \(principal 'user:demo'\): is revoked",
    ),
    ("duplicate", _duplicate, r"entry 6 \(principal 'user:alice'\): duplicate of entry 0"),
    (
        "negative-revision",
        _set(1, revision=-1),
        r"entry 1 \(principal 'user:bob'\): Expected `int` >= 0",
    ),
    ("unknown-field", _set(1, admin=True), "entry 1 .*unknown field `admin`"),
    ("no-principal", _drop_principal, "entry 1 .*principal_id"),
    ("bad-identity", _set(0, identity={"password": "x"}), "entry 0 .*unknown field"),
    ("credential-not-text", _set(3, credential=17), "entry 3 .*credential"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [(m, e) for _, m, e in STARTUP_REJECTIONS],
    ids=[name for name, _, _ in STARTUP_REJECTIONS],
)
def test_bad_entries_stop_startup_naming_entry_but_never_credential(
    tmp_path: Path, mutate: Callable[[Entries], None], expected: str
) -> None:
    entries = identity_entries()
    mutate(entries)
    path = write_json(tmp_path / "identities.json", entries)
    with pytest.raises(TrustConfigError, match=expected) as caught:
        IdentityDirectory.load(path, now_ms=now_ms())
    assert "opaque-credential" not in str(caught.value)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "empty"),
        ("{}", "non-empty JSON array"),
        ("[]", "non-empty JSON array"),
        ("[{", "not JSON"),
    ],
)
def test_unusable_files_stop_startup(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "identities.json"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(TrustConfigError, match=expected):
        IdentityDirectory.load(path, now_ms=now_ms())


def test_file_with_credentials_must_be_owner_only(tmp_path: Path) -> None:
    path = write_json(tmp_path / "identities.json", identity_entries(), mode=0o640)
    with pytest.raises(TrustConfigError, match="chmod 600"):
        IdentityDirectory.load(path, now_ms=now_ms())
    without = [{k: v for k, v in e.items() if k != "credential"} for e in identity_entries()]
    write_json(path, without, mode=0o644)
    assert len(IdentityDirectory.load(path, now_ms=now_ms())) == len(without)


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_file_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_json(tmp_path / "identities.json", identity_entries(), mode=mode)
    with pytest.raises(TrustConfigError, match="write"):
        IdentityDirectory.load(path, now_ms=now_ms())


def test_directories_and_huge_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TrustConfigError, match="not a regular file"):
        IdentityDirectory.load(tmp_path, now_ms=now_ms())
    huge = tmp_path / "huge.json"
    huge.write_text("[" + " " * 1_048_576 + "]")
    os.chmod(huge, 0o600)
    with pytest.raises(TrustConfigError, match="1 MiB"):
        IdentityDirectory.load(huge, now_ms=now_ms())


def test_startup_error_names_the_setting(trust_files: TrustFiles) -> None:
    entries = identity_entries()
    entries[0]["revision"] = 0
    write_json(trust_files.identity_file, entries)
    with pytest.raises(TrustConfigError, match=r"^AIPD_TRUSTED_IDENTITY_FILE: .*entry 0"):
        TrustGate.from_settings(Settings(**trust_files.settings_overrides()))


def test_credential_never_shows_in_repr(trust_files: TrustFiles) -> None:
    directory = IdentityDirectory.load(trust_files.identity_file, now_ms=now_ms())
    identity = directory.get(USER_A)
    assert identity is not None
    assert identity.credential is not None
    assert identity.credential.reveal() == f"opaque-credential-of-{USER_A}"
    assert "opaque-credential" not in repr(identity)


async def _admit(gate: TrustGate, redis: Redis, trust_files: TrustFiles, **doc: Any) -> Any:
    _, payload = encode_action(action_document(**doc), trust_files)
    return await gate.admit(
        payload=payload,
        endpoint=endpoint(),
        spec=UNGOVERNED,
        stores=Stores.over(redis),
    )


async def test_a_known_principal_is_admitted_with_its_verified_facts(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles
) -> None:
    decision = await _admit(gate, redis, trust_files)
    assert (decision.principal_id, decision.tenant_id) == (USER_A, TENANT_A)
    assert decision.signer == trust_files.public_key
    assert decision.receipt_details()["credential_revision"] == 3
    assert "opaque-credential" not in repr(decision) + repr(decision.receipt_details())


REFUSED_CLAIMS: list[tuple[str, dict[str, Any], ErrorCode]] = [
    ("unknown", {"principal": "user:mallory"}, ErrorCode.HOST_AUTHENTICATION),
    ("other-revision", {"revision": 2}, ErrorCode.HOST_CREDENTIAL_REVISION_DENIED),
    ("no-revision", {"revision": None}, ErrorCode.HOST_CREDENTIAL_REVISION_DENIED),
    ("other-tenant", {"tenant": TENANT_B}, ErrorCode.TENANT_MISMATCH),
    ("no-tenant", {"tenant": None}, ErrorCode.TENANT_MISMATCH),
    ("tenant-when-none", {"principal": USER_UNTENANTED}, ErrorCode.TENANT_MISMATCH),
]


@pytest.mark.parametrize(
    ("claim", "code"), [(c, k) for _, c, k in REFUSED_CLAIMS], ids=[n for n, _, _ in REFUSED_CLAIMS]
)
async def test_claims_the_directory_does_not_back_are_refused(
    gate: TrustGate, redis: Redis, trust_files: TrustFiles, claim: dict[str, Any], code: ErrorCode
) -> None:
    with pytest.raises(ConnectorError) as caught:
        await _admit(gate, redis, trust_files, **claim)
    assert caught.value.code is code


async def test_principal_kind_and_issuer_are_checked_when_the_directory_pins_them(
    trust_files: TrustFiles,
) -> None:
    directory = IdentityDirectory.load(trust_files.identity_file, now_ms=now_ms())
    action, _ = encode_action(action_document())
    clock = FixedClock(now_ms())
    for field, value in (("principal_kind", "service"), ("authentication_issuer", "https://evil")):
        forged = action.identity.__class__(
            **{
                **{f: getattr(action.identity, f) for f in action.identity.__struct_fields__},
                field: value,
            }
        )
        with pytest.raises(ConnectorError) as caught:
            await directory.verify(forged, clock)
        assert caught.value.code is ErrorCode.HOST_AUTHENTICATION


async def test_an_entry_that_expires_while_running_is_refused_from_then_on(
    trust_files: TrustFiles,
) -> None:
    entries = identity_entries()
    entries[0]["expires_at_unix_ms"] = now_ms() + 60_000
    write_json(trust_files.identity_file, entries)
    directory = IdentityDirectory.load(trust_files.identity_file, now_ms=now_ms())
    action, _ = encode_action(action_document())
    assert (await directory.verify(action.identity, FixedClock(now_ms()))).principal_id == USER_A
    with pytest.raises(ConnectorError) as caught:
        await directory.verify(action.identity, FixedClock(now_ms() + 61_000))
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION
    assert "expired" in caught.value.message


async def test_an_entry_expired_at_startup_is_skipped_and_counted_not_fatal(
    trust_files: TrustFiles, caplog: pytest.LogCaptureFixture
) -> None:
    # The renewal appended beside the expired entry: no duplicate, since expired is skipped.
    entries = identity_entries()
    renewed = copy.deepcopy(entries[0])
    entries[0]["expires_at_unix_ms"] = 1
    entries[1]["expires_at_unix_ms"] = now_ms() - 1
    entries.append(renewed)
    write_json(trust_files.identity_file, entries)
    gate = TrustGate.from_settings(Settings(**trust_files.settings_overrides()))
    assert gate.identities is not None
    assert gate.expired_entries["identity"] == 2
    assert gate.identities.get(USER_A) is not None  # the renewed entry stands
    assert gate.identities.get(entries[1]["principal_id"]) is None  # refused from now on
    assert "entry 0 (principal 'user:alice'): has expired; skipped" in caplog.text
    assert "opaque-credential" not in caplog.text


async def test_without_a_directory_governed_execution_fails_closed(
    trust_files: TrustFiles, redis: Redis
) -> None:
    gate = TrustGate.from_settings(
        Settings(**{**trust_files.settings_overrides(), "trusted_identity_file": None})
    )
    with pytest.raises(ConnectorError) as caught:
        await _admit(gate, redis, trust_files)
    assert caught.value.code is ErrorCode.HOST_AUTHENTICATION
    assert "AIPD_TRUSTED_IDENTITY_FILE" in caught.value.message
