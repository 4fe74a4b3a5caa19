"""The CLI names what to fix: bad settings exit 2 naming the field, unreachable services
exit 3 naming the URL and the setting, and no command accepts a key value as a flag."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.nats_process import nats_process
from worker.commands.cli import build_parser
from worker.commands.exit_codes import Exit
from worker.testing.services import free_port


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_a_bad_setting_stops_with_the_field_named() -> None:
    done = run_cli("run", "--lease-ttl-ms", "5", "--hermes-endpoints", "h1=http://127.0.0.1:1")
    assert done.returncode == 2
    assert "lease_ttl_ms" in done.stderr


def test_a_bad_environment_value_stops_with_the_field_named() -> None:
    done = run_cli("provision", env={"AIPD_REDIS_URL": "http://not-redis"})
    assert done.returncode == 2
    assert "redis_url" in done.stderr


def test_a_result_retention_shorter_than_the_replay_window_stops_startup() -> None:
    # 60 s of retention cannot outlive an envelope that passes for 5 min + 30 s.
    done = run_cli(
        "run",
        "--hermes-endpoints",
        "h1=http://127.0.0.1:1",
        env={"AIPD_RESULT_TTL_MS": "60000"},
    )
    assert done.returncode == 2
    assert "replay window" in done.stderr
    assert "result_ttl_ms" in done.stderr


def test_the_replay_window_settings_and_their_bound() -> None:
    from pydantic import ValidationError

    from worker.settings import Settings

    defaults = Settings()
    assert (defaults.max_envelope_age_ms, defaults.max_clock_skew_ms) == (300_000, 30_000)
    fitting = Settings(result_ttl_ms=60_000, max_envelope_age_ms=50_000, max_clock_skew_ms=10_000)
    assert fitting.result_ttl_ms == 60_000
    with pytest.raises(ValidationError, match="replay window"):
        Settings(result_ttl_ms=60_000, max_envelope_age_ms=50_000, max_clock_skew_ms=10_001)
    with pytest.raises(ValidationError, match="max_envelope_age_ms"):
        Settings(max_envelope_age_ms=86_400_001)


def test_an_unreadable_operator_instructions_file_stops_startup(tmp_path: Path) -> None:
    done = run_cli(
        "run",
        "--hermes-endpoints",
        "h1=http://127.0.0.1:1",
        env={"AIPD_HERMES_OPERATOR_INSTRUCTIONS_FILE": str(tmp_path / "missing.md")},
    )
    assert done.returncode == 2
    assert "configuration error: operator instructions file unreadable" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_non_http_endpoint_url_is_refused() -> None:
    done = run_cli("provision", "--hermes-endpoints", "h1=ftp://host/")
    assert done.returncode == 2
    assert "http" in done.stderr


def test_an_unreachable_nats_names_the_url_and_the_setting(refused_port: int) -> None:
    url = f"nats://127.0.0.1:{refused_port}"
    done = run_cli("provision", "--nats-url", url, "--hermes-endpoints", "h1=http://127.0.0.1:1")
    assert done.returncode == 3
    assert url in done.stderr
    assert "AIPD_NATS_URL" in done.stderr


def test_an_unsafe_key_file_is_refused_at_startup(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("k" * 32)
    key.chmod(0o644)
    done = run_cli(
        "run",
        "--hermes-endpoints",
        "h1=http://127.0.0.1:1",
        "--hermes-api-key-file",
        str(key),
        "--nats-url",
        f"nats://127.0.0.1:{free_port()}",
    )
    assert done.returncode == 2
    assert "chmod 600" in done.stderr
    assert "k" * 32 not in done.stderr


@pytest.mark.aip_family("identity_credentials", assertions=["credential_handle_opaque"])
def test_no_flag_accepts_an_api_key_value() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--hermes-api-key", "secret"])


def test_every_documented_subcommand_exists() -> None:
    help_text = run_cli("--help").stdout
    for command in (
        "run",
        "provision",
        "submit",
        "tail",
        "result",
        "cancel",
        "manifest",
        "schemas",
        "audit",
        "sign",
        "keys",
        "approve",
        "binding",
        "reconcile",
    ):
        assert command in help_text


def test_bus_commands_use_the_configured_nats_credentials(tmp_path: Path) -> None:
    with nats_process("-js", "-sd", str(tmp_path), "--auth", "s3cret-token-for-the-cli") as url:
        args = ("result", "act_" + "e" * 32, "--endpoint", "h1", "--nats-url", url)
        deadline = time.monotonic() + 10
        while (anonymous := run_cli(*args)).returncode != 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert anonymous.returncode == 3  # refused without the token
        token = tmp_path / "token"
        token.write_text("s3cret-token-for-the-cli")
        token.chmod(0o600)
        authorized = run_cli(*args, env={"AIPD_NATS_TOKEN_FILE": str(token)})
        # Connected: the results stream does not exist on this bare server, which is an
        # error of the command, not of the connection.
        assert authorized.returncode not in (2, 3), authorized.stderr
        assert "s3cret" not in authorized.stderr


def test_sign_refuses_a_payload_the_workers_would_dead_letter(tmp_path: Path) -> None:
    """`sign` prints an Action or Cancel Envelope signed (the AIP signature is inside it);
    a delegation payload gets its header lines. Envelopes here are built from the
    AIP rules (`tests/aip_actions.py`) and the signature is checked with PyNaCl."""
    import base64
    import copy
    import json

    import nacl.signing

    from tests.aip_actions import SENDER, action_envelope, canonical, did_of, key_of_nkey_seed
    from worker.testing.identities import write_trust_files

    files = write_trust_files(tmp_path)
    seed = files.seed_file
    unsigned = action_envelope(principal="user:alice")
    unsigned["from"] = dict(SENDER)
    action_id = unsigned["body"]["action"]["id"]
    good = tmp_path / "action.json"
    good.write_bytes(json.dumps(unsigned, indent=2).encode())
    signed = run_cli("sign", "--key", str(seed), str(good))
    assert signed.returncode == 0, signed.stderr
    envelope = json.loads(signed.stdout)
    did = did_of(key_of_nkey_seed(files.seed))
    assert envelope["security"]["did"] == envelope["from"]["did"] == did
    assert envelope["message_id"] == unsigned["message_id"]
    assert envelope["body"]["action"]["id"] == action_id
    covered = copy.deepcopy(envelope)
    signature = base64.b64decode(covered["security"].pop("signature"))
    nacl.signing.VerifyKey(bytes(key_of_nkey_seed(files.seed).verify_key)).verify(
        canonical(covered), signature
    )
    poisoned_envelope = copy.deepcopy(unsigned)
    poisoned_envelope["body"]["action"]["id"] = action_id + "\n"
    poisoned = tmp_path / "poisoned.json"
    poisoned.write_bytes(canonical(poisoned_envelope))
    refused = run_cli("sign", "--key", str(seed), str(poisoned))
    assert refused.returncode == Exit.REFUSED
    assert "schema.envelope.invalid" in refused.stderr
    assert refused.stdout == ""
    # A Cancel Envelope (§1.8) prepared unsigned, as the requester: printed signed.
    unsigned_cancel = {
        "aip_version": "1.0",
        "message_type": "aip.core.v1.cancel",
        "message_id": "msg_" + "c" * 32,
        "sent_at": unsigned["sent_at"],
        "from": {"id": "user:alice", "kind": "human"},
        "body": {"cancel": {"target": {"action": action_id}, "reason": "changed my mind"}},
    }
    cancel = tmp_path / "cancel.json"
    cancel.write_bytes(canonical(unsigned_cancel))
    signed_cancel = run_cli("sign", "--kind", "cancel", "--key", str(seed), str(cancel))
    assert signed_cancel.returncode == 0, signed_cancel.stderr
    cancel_envelope = json.loads(signed_cancel.stdout)
    assert cancel_envelope["from"] == {"id": "user:alice", "kind": "human", "did": did}
    assert cancel_envelope["message_id"] == unsigned_cancel["message_id"]
    assert cancel_envelope["body"] == unsigned_cancel["body"]
    covered = copy.deepcopy(cancel_envelope)
    signature = base64.b64decode(covered["security"].pop("signature"))
    nacl.signing.VerifyKey(bytes(key_of_nkey_seed(files.seed).verify_key)).verify(
        canonical(covered), signature
    )
    not_an_action = run_cli("sign", "--key", str(seed), str(cancel))
    assert not_an_action.returncode == Exit.REFUSED
