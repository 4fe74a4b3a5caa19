"""The one place an expected failure of a command becomes one line and an exit status.

`worker.commands.cli.main` hands every exception a command raises to `explain`: the
project's typed errors and the library errors a deployment mistake produces (a wrong NATS
URL, a NATS without JetStream, no worker answering, an endpoint nobody provisioned, a
file that cannot be read, a Redis that refuses) come back as a line naming what to fix and
an `Exit` code, and the user sees no traceback. Anything else is a bug: `explain` returns
None and the traceback is shown, because hiding it would hide the bug.

The lines never quote a secret: they name settings, files, URLs (as configured; a password
belongs in its `*_FILE` setting, never in the URL) and subjects.
"""

from __future__ import annotations

import argparse
import json
import os

import nats.errors
import nats.js.errors
from redis import exceptions as redis_errors

from schemas.errors import EnvelopeRejected
from worker.commands.exit_codes import Exit
from worker.errors import (
    ApprovalRefused,
    ConnectorError,
    PolicyError,
    ResolutionRefused,
    ServiceUnreachable,
    SettingsError,
    StoreUnavailable,
    UnverifiedResponse,
)

#: Commands whose NATS requests are answered by a worker (not by the JetStream API).
_WORKER_REQUESTS = frozenset({"manifest", "cancel"})


def explain(exc: BaseException, args: argparse.Namespace) -> tuple[Exit, str] | None:
    """The exit status and the one line for an expected failure; None for a bug."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return explain(exc.exceptions[0], args)
    match exc:
        case SettingsError():
            return Exit.CONFIGURATION, f"configuration error: {exc}"
        case PolicyError():  # the operator policy (instructions file, prefixes) at start
            return Exit.CONFIGURATION, f"configuration error: {exc.message}"
        case ServiceUnreachable():
            return Exit.UNREACHABLE, f"error: {exc}"
        case EnvelopeRejected():
            return Exit.REFUSED, (
                f"refused: the workers would dead-letter this envelope ({exc.code.value}: "
                f"{exc.reason}); nothing was sent or signed"
            )
        case UnverifiedResponse():
            return Exit.UNVERIFIED, f"refused: {exc} (connector_host.response_signing)"
        case ApprovalRefused() | ResolutionRefused():
            return Exit.REFUSED, f"refused: {exc}"
        case StoreUnavailable():
            return Exit.UNREACHABLE, f"error: Redis did not answer ({exc}); check AIPD_REDIS_URL"
        case ConnectorError():
            return Exit.FAILED, f"error: {exc.message}"
        case nats.errors.Error():
            return _nats(exc, args)
        case redis_errors.RedisError():
            return _redis(exc)
        case json.JSONDecodeError():
            return Exit.CONFIGURATION, f"configuration error: not valid JSON ({exc})"
        case ValueError():  # TrustConfigError, SecretFileError, endpoint and file errors
            return Exit.CONFIGURATION, f"configuration error: {exc}"
        case OSError() if exc.filename is not None:
            return Exit.CONFIGURATION, (
                f"configuration error: {exc.filename}: {exc.strerror or type(exc).__name__}"
            )
        case OSError():
            return Exit.UNREACHABLE, (
                f"error: a service is unreachable ({exc.strerror or type(exc).__name__}); "
                "check AIPD_NATS_URL / AIPD_REDIS_URL"
            )
    return None


def nats_url(args: argparse.Namespace) -> str:
    """The NATS URL the command used: its `--nats-url`, else `AIPD_NATS_URL`."""
    return str(
        getattr(args, "nats_url", None)
        or getattr(args, "setting_nats_url", None)
        or os.environ.get("AIPD_NATS_URL", "nats://127.0.0.1:4222")
    )


def _prefix(args: argparse.Namespace) -> str:
    return str(
        getattr(args, "prefix", None)
        or getattr(args, "setting_subject_prefix", None)
        or os.environ.get("AIPD_SUBJECT_PREFIX", "aip")
    )


def _nats(exc: nats.errors.Error, args: argparse.Namespace) -> tuple[Exit, str]:
    url = nats_url(args)
    endpoint = getattr(args, "endpoint", None)
    match exc:
        case nats.errors.NoRespondersError() if args.command in _WORKER_REQUESTS:
            return Exit.UNREACHABLE, (
                f"error: no worker answered for endpoint {endpoint!r} on NATS at {url} "
                f"(subject prefix {_prefix(args)!r}): start a worker serving it, or check "
                "--endpoint and --prefix / AIPD_SUBJECT_PREFIX"
            )
        case nats.errors.NoRespondersError() | nats.js.errors.ServiceUnavailableError():
            return Exit.UNREACHABLE, (
                f"error: NATS at {url} has no JetStream (nothing answered its JetStream API): "
                "start nats-server with -js (or a `jetstream {}` block in its config)"
            )
        case nats.js.errors.NoStreamResponseError():
            return Exit.CONFIGURATION, (
                f"configuration error: no stream on NATS at {url} stores the subjects of "
                f"endpoint {endpoint!r}: run `aip-hermes-worker provision` with it in "
                "AIPD_HERMES_ENDPOINTS (or check --endpoint and --prefix)"
            )
        case nats.js.errors.NotFoundError():
            return Exit.CONFIGURATION, (
                f"configuration error: NATS at {url}: {exc.description or 'not found'}: "
                "run `aip-hermes-worker provision` (or check --endpoint and --prefix)"
            )
        case nats.errors.TimeoutError():
            return Exit.UNREACHABLE, (
                f"error: NATS at {url} did not answer in time; check that it is up and "
                "that this user may publish the request (AIPD_NATS_* credentials)"
            )
        case nats.js.errors.APIError():
            return Exit.FAILED, f"error: NATS at {url} refused: {exc.description or exc}"
        case _:
            return Exit.UNREACHABLE, (
                f"error: NATS at {url}: {type(exc).__name__} ({str(exc).strip() or 'closed'}); "
                "check AIPD_NATS_URL and the AIPD_NATS_* credential settings"
            )


def _redis(exc: redis_errors.RedisError) -> tuple[Exit, str]:
    match exc:
        case redis_errors.AuthenticationError() | redis_errors.NoPermissionError():
            return Exit.CONFIGURATION, (
                f"configuration error: Redis refused this command's user ({type(exc).__name__}); "
                "check the user in AIPD_REDIS_URL / AIPD_APPROVER_REDIS_URL and its "
                "*_PASSWORD_FILE"
            )
        case _:
            return Exit.UNREACHABLE, (
                f"error: cannot reach Redis ({type(exc).__name__}); check AIPD_REDIS_URL "
                "(AIPD_APPROVER_REDIS_URL for approve, approval and escalations)"
            )
