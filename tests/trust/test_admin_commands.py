"""The operator commands: `keys generate`, `approve`, `approval show`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec
import pytest
from redis.asyncio import Redis
from trust_support import action_document, encode_action

from schemas.approval import ApprovalDecision, ApprovalRecord
from worker.commands.exit_codes import Exit
from worker.commands.trust_admin import add_commands
from worker.testing.identities import APPROVER_A, APPROVER_UNTENANTED, USER_B, TrustFiles
from worker.testing.services import ServiceHandle
from worker.trust.signing import (
    TrustedGatewayKeys,
    generate_keypair,
    read_seed_file,
    sign_envelope,
    verify_envelope,
    write_seed_file,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aip-hermes-worker")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


async def test_keys_generate_writes_an_owner_only_seed_and_prints_its_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gateway.seed"
    args = parse("keys", "generate", "--out", str(out))
    assert await args.func(args) == 0
    public_key = capsys.readouterr().out.strip()
    assert out.stat().st_mode & 0o777 == 0o600
    keys_file = tmp_path / "keys"
    keys_file.write_text(public_key + "\n")
    headers = sign_envelope(b"payload", read_seed_file(out))
    assert verify_envelope(b"payload", headers, TrustedGatewayKeys.load(keys_file)) == public_key
    seed = out.read_bytes()
    assert await args.func(args) == 1
    assert "never overwritten" in capsys.readouterr().err
    assert out.read_bytes() == seed


def _write_action(tmp_path: Path) -> tuple[str, Path]:
    """An action file as `submit --write-action` writes it: an unsigned AIP Action
    Envelope."""
    action, payload = encode_action(action_document())
    path = tmp_path / "action.json"
    path.write_bytes(payload)
    return action.id, path


def _store_flags(
    files: TrustFiles, server: ServiceHandle, *, key_of: str = APPROVER_A
) -> list[str]:
    """Where the store and the authority are, and whose signing key `--key` reads."""
    return [
        "--redis-url", server.url, "--approval-authority-file", str(files.authority_file),
        "--key", str(files.approver_seed_files[key_of]),
    ]  # fmt: skip


async def test_approve_records_the_decision_for_the_action_in_the_file(
    tmp_path: Path,
    trust_files: TrustFiles,
    redis_server: ServiceHandle,
    redis: Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    action_id, path = _write_action(tmp_path)
    flags = _store_flags(trust_files, redis_server)
    args = parse(
        "approve", action_id, "--action-file", str(path), "--as", APPROVER_A,
        "--reason", "ticket OPS-7", "--ttl-minutes", "5", *flags,
    )  # fmt: skip
    assert await args.func(args) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    # One member of a quorum of one: how many of N exist, and the AIP decision to carry.
    assert (document.pop("approvals"), document.pop("required")) == (1, 1)
    assert "1 of 1 approvals recorded" in err
    carried = document.pop("approval_decision")
    printed = msgspec.convert(document, ApprovalRecord)
    assert printed.decision is ApprovalDecision.APPROVED
    assert printed.expires_at_unix_ms - printed.created_at_unix_ms == 5 * 60_000
    assert carried["approval_id"] == "appr_" + action_id.removeprefix("act_")
    assert (carried["decision"], carried["decision_id"]) == ("approved", printed.decision_id)
    assert carried["approver"]["id"] == APPROVER_A
    assert carried["evidence"][0]["hash"] == "sha256:" + printed.input_fingerprint
    show = parse("approval", "show", action_id, "--redis-url", redis_server.url)
    assert await show.func(show) == 0
    assert msgspec.json.decode(capsys.readouterr().out, type=ApprovalRecord) == printed


async def test_approve_refuses_a_file_holding_another_action(
    tmp_path: Path,
    trust_files: TrustFiles,
    redis_server: ServiceHandle,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, path = _write_action(tmp_path)
    other_id = action_document()["id"]
    args = parse(
        "approve", other_id, "--action-file", str(path), "--as", APPROVER_A, "--reason", "r",
        *_store_flags(trust_files, redis_server),
    )  # fmt: skip
    assert await args.func(args) == 2
    assert "not " + other_id in capsys.readouterr().err


async def test_deny_by_a_non_member_is_refused_with_the_reason(
    tmp_path: Path,
    trust_files: TrustFiles,
    redis_server: ServiceHandle,
    redis: Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    action_id, path = _write_action(tmp_path)
    args = parse(
        "approve", action_id, "--action-file", str(path), "--as", USER_B, "--reason", "no",
        "--deny", *_store_flags(trust_files, redis_server),
    )  # fmt: skip
    assert await args.func(args) == Exit.REFUSED
    assert "no approval membership" in capsys.readouterr().err
    show = parse("approval", "show", action_id, "--redis-url", redis_server.url)
    assert await show.func(show) == 1


async def test_approve_without_an_authority_file_is_a_configuration_error(
    tmp_path: Path,
    redis_server: ServiceHandle,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIPD_APPROVAL_AUTHORITY_FILE", raising=False)
    action_id, path = _write_action(tmp_path)
    seed_file = tmp_path / "approver.seed"
    write_seed_file(seed_file, generate_keypair().seed)
    args = parse(
        "approve", action_id, "--action-file", str(path), "--as", APPROVER_A, "--reason", "r",
        "--redis-url", redis_server.url, "--key", str(seed_file),
    )  # fmt: skip
    assert await args.func(args) == 2
    assert "AIPD_APPROVAL_AUTHORITY_FILE" in capsys.readouterr().err


async def test_approve_signs_only_with_the_approvers_own_key(
    tmp_path: Path,
    trust_files: TrustFiles,
    redis_server: ServiceHandle,
    redis: Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    action_id, path = _write_action(tmp_path)
    # approver:demo's key, in the name of approver:carol: refused, nothing recorded.
    args = parse(
        "approve", action_id, "--action-file", str(path), "--as", APPROVER_A, "--reason", "r",
        *_store_flags(trust_files, redis_server, key_of=APPROVER_UNTENANTED),
    )  # fmt: skip
    assert await args.func(args) == Exit.REFUSED
    assert "is not the approval key of" in capsys.readouterr().err
    show = parse("approval", "show", action_id, "--redis-url", redis_server.url)
    assert await show.func(show) == 1
    # A seed file others may read is refused before anything else.
    loose = tmp_path / "loose.seed"
    loose.write_bytes(trust_files.approver_seed(APPROVER_A))
    loose.chmod(0o644)
    args = parse(
        "approve", action_id, "--action-file", str(path), "--as", APPROVER_A, "--reason", "r",
        "--redis-url", redis_server.url, "--key", str(loose),
    )  # fmt: skip
    assert await args.func(args) == 2
    assert "chmod 600" in capsys.readouterr().err
