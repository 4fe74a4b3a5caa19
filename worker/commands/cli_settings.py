"""Turn Settings fields into CLI flags, so flags and `AIPD_*` variables never drift.

`--lease-ttl-ms 5000` overrides `AIPD_LEASE_TTL_MS`; booleans get `--x/--no-x`. The only field
without a flag is the API key value: a key is never accepted on the command line.

A worker (`run`, `qualify`) takes every field; any other command takes only the groups of
settings it reads (`add_settings_flags(parser, NATS, APPROVER_REDIS, ...)`), so its `--help`
lists what it uses and not the worker's ninety settings. Every field is still read from its
`AIPD_*` variable by `settings_from`, whatever the flags.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from worker.errors import SettingsError, TrustConfigError
from worker.settings import Settings
from worker.trust.signing import TrustedGatewayKeys

NO_FLAG = frozenset({"hermes_api_key"})

#: Connecting to NATS (worker/bus/connections.py) and naming the subjects.
NATS = frozenset(
    {
        "nats_url",
        "nats_user",
        "nats_password_file",
        "nats_token_file",
        "nats_nkey_seed_file",
        "nats_creds_file",
        "nats_tls_ca_file",
        "nats_tls_cert_file",
        "nats_tls_key_file",
        "nats_inbox_prefix",
        "subject_prefix",
    }
)
#: The worker's Redis user (`open_redis_for`).
REDIS = frozenset(
    {
        "redis_url",
        "redis_cluster",
        "redis_password_file",
        "redis_wait_replicas",
        "redis_wait_timeout_ms",
    }
)
#: The approver's Redis user (`open_approver_redis_for`, which falls back to REDIS).
APPROVER_REDIS = REDIS | {"approver_redis_url", "approver_redis_password_file"}
#: The Hermes endpoints and their keys (`worker.endpoints`).
ENDPOINTS = frozenset(
    {
        "hermes_endpoints",
        "hermes_endpoints_file",
        "hermes_shared_endpoints",
        "hermes_api_key_files",
        "hermes_api_key_file",
        "hermes_share_api_key",
        "hermes_http_transport",
    }
)
#: What `provision` creates: stream limits and the work consumers' ack wait.
STREAMS = frozenset(name for name in Settings.model_fields if name.startswith("stream_")) | {
    "duplicate_window_s",
    "ack_wait_s",
    "lease_ttl_ms",
}
#: Deciding and resolving approvals.
AUTHORITY = frozenset({"approval_authority_file"})
#: How a long-running command logs (the console).
LOGS = frozenset({"log_format", "log_level"})
#: Believing what workers signed (escalations).
WORKER_KEYS = frozenset({"trusted_worker_keys_file", "allow_unsigned_responses"})


def add_settings_flags(parser: argparse.ArgumentParser, *groups: frozenset[str]) -> None:
    """A flag per Settings field in `groups` (none given: every field, for a worker)."""
    chosen = frozenset().union(*groups) if groups else frozenset(Settings.model_fields)
    unknown = chosen - Settings.model_fields.keys()
    if unknown:  # a renamed field must not silently lose its flag
        raise AssertionError(f"not Settings fields: {sorted(unknown)}")
    group = parser.add_argument_group("settings (each also AIPD_<NAME>)")
    for name, field in Settings.model_fields.items():
        if name in NO_FLAG or name not in chosen:
            continue
        flag = "--" + name.replace("_", "-")
        description = " ".join((field.description or "").split()).replace("%", "%%")
        help_text = f"{description} (env AIPD_{name.upper()})"
        if field.annotation is bool:
            group.add_argument(
                flag,
                dest=f"setting_{name}",
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            group.add_argument(
                flag, dest=f"setting_{name}", default=None, metavar=name.upper(), help=help_text
            )


def settings_from(args: argparse.Namespace, **defaults: Any) -> Settings:
    """Environment first, then flags; raises SettingsError naming each bad field."""
    overrides = dict(defaults)
    for key, value in vars(args).items():
        if key.startswith("setting_") and value is not None:
            overrides[key.removeprefix("setting_")] = value
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SettingsError(problems) from None


def believed_worker_keys(settings: Settings, what: str) -> TrustedGatewayKeys | None:
    """The worker keys whose signed `what` (escalations, DLQ entries, results) a reading
    command believes. Without them anything anyone appended to those subjects would be
    believed, forged ones too, so the command refuses to run (TrustConfigError, exit 2)
    unless unsigned responses are allowed (development only, warned on stderr)."""
    if settings.trusted_worker_keys_file is not None:
        return TrustedGatewayKeys.load(
            settings.trusted_worker_keys_file, what="trusted worker keys file"
        )
    if settings.allow_unsigned_responses:
        print(
            f"warning: {what} are not verified (no AIPD_TRUSTED_WORKER_KEYS_FILE; "
            "AIPD_ALLOW_UNSIGNED_RESPONSES is on): a forged one cannot be told apart",
            file=sys.stderr,
        )
        return None
    raise TrustConfigError(
        f"{what} are believed only when a trusted worker signed them: set "
        "AIPD_TRUSTED_WORKER_KEYS_FILE (--trusted-worker-keys-file) to the workers' public keys"
    )
