"""Open NATS and Redis from the settings, with every credential kind they support.

The worker and every CLI command connect through these functions, so a credential setting
(`AIPD_NATS_*_FILE`, `AIPD_REDIS_PASSWORD_FILE`, TLS) means the same everywhere and no
command needs a secret in a URL. The worker's NATS connection reconnects forever; a
command's fails fast (`connect_nats_for_command`), naming the setting to fix.
"""

from __future__ import annotations

import logging
import ssl
import time
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.errors import (
    AuthorizationError,
    InvalidUserCredentialsError,
    NoServersError,
    SlowConsumerError,
)
from nats.errors import Error as NatsError
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from subjects.streams import StreamPolicy
from worker.dependencies import Dependency
from worker.errors import ServiceUnreachable
from worker.logs import RepeatedErrors
from worker.secret_files import read_secret_file
from worker.settings import Settings
from worker.store.connection import WriteConfirmation, open_redis

log = logging.getLogger(__name__)


def stream_policy(settings: Settings) -> StreamPolicy:
    return StreamPolicy(
        replicas=settings.stream_replicas,
        duplicate_window_s=settings.duplicate_window_s,
        ack_wait_s=settings.effective_ack_wait_s,
        actions_max_bytes=settings.stream_actions_max_bytes,
        actions_max_msgs=settings.stream_actions_max_msgs,
        delegations_max_bytes=settings.stream_delegations_max_bytes,
        delegations_max_msgs=settings.stream_delegations_max_msgs,
        chunks_max_bytes=settings.stream_chunks_max_bytes,
        results_max_bytes=settings.stream_results_max_bytes,
        dlq_max_bytes=settings.stream_dlq_max_bytes,
        dlq_max_msgs=settings.stream_dlq_max_msgs,
        dlq_duplicate_window_s=settings.stream_dlq_duplicate_window_s,
        audit_max_bytes=settings.stream_audit_max_bytes,
        runtime_max_bytes=settings.stream_runtime_max_bytes,
    )


def _tls(settings: Settings) -> ssl.SSLContext | None:
    if not (settings.nats_tls_ca_file or settings.nats_tls_cert_file):
        return None
    context = ssl.create_default_context(
        cafile=str(settings.nats_tls_ca_file) if settings.nats_tls_ca_file else None
    )
    if settings.nats_tls_cert_file and settings.nats_tls_key_file:
        context.load_cert_chain(str(settings.nats_tls_cert_file), str(settings.nats_tls_key_file))
    return context


async def connect_nats(
    settings: Settings,
    *,
    name: str = "aip-hermes-worker",
    errors: RepeatedErrors | None = None,
) -> NATS:
    """Unlimited reconnects (the default gives up after ~60 tries, pitfalls.md). Every
    failed attempt and every loss is told through one `Dependency` (worker/dependencies.py):
    once per cause per interval, with the URL and what to check."""

    nats_at = Dependency("nats", settings.nats_url, log, errors)
    slow_logged_at = [0.0]

    async def on_error(exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            # One per dropped message during a flood: logged at most every 10 s.
            now = time.monotonic()
            if now - slow_logged_at[0] < 10.0:
                return
            slow_logged_at[0] = now
            log.warning("nats slow consumer on %s: messages dropped", exc.subject)
            return
        text = str(exc).strip()
        if isinstance(exc, AuthorizationError) or "authorization" in text.lower():
            nats_at.lost(type(exc).__name__, refused=True)
        elif "permissions violation" in text.lower():
            nats_at.lost("permissions violation", refused=True, what=text[:200])
        else:
            nats_at.lost(type(exc).__name__)

    #: The connection, once made: a disconnect while it is closing or draining is our own
    #: shutdown, not a lost NATS (nats-py marks it before it calls the callbacks).
    made: list[NATS] = []

    async def on_disconnect() -> None:
        if made and (made[0].is_closed or made[0].is_draining):
            return
        nats_at.lost("disconnected", what="reconnecting")

    async def on_reconnect() -> None:
        nats_at.back()

    async def on_closed() -> None:
        log.info("nats connection closed")

    options: dict[str, Any] = {
        "servers": settings.nats_servers,
        "name": name,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 3,
        "allow_reconnect": True,
        "error_cb": on_error,
        "disconnected_cb": on_disconnect,
        "reconnected_cb": on_reconnect,
        "closed_cb": on_closed,
        "pending_size": 64 * 1024 * 1024,
    }
    options.update(credential_options(settings))
    nc = await nats.connect(**options)
    made.append(nc)
    return nc


async def connect_nats_for_command(settings: Settings) -> NATS:
    """A short-lived connection for one command, with the same credentials (AIPD_NATS_*
    files, TLS) a worker uses; it fails fast instead of retrying forever."""
    credentials = credential_options(settings)
    servers = settings.nats_url

    async def quiet(exc: Exception) -> None:
        """nats-py's default logs each failed attempt with a traceback; the failure that
        matters is raised below as one line, so the attempts are not logged at all."""

    try:
        return await nats.connect(
            settings.nats_servers,
            connect_timeout=3,
            max_reconnect_attempts=1,
            allow_reconnect=False,
            error_cb=quiet,
            **credentials,
        )
    except (NoServersError, OSError) as exc:
        raise ServiceUnreachable(
            f"cannot reach NATS at {servers} ({type(exc).__name__}); "
            "set --nats-url or AIPD_NATS_URL"
        ) from None
    except NatsError as exc:
        raise ServiceUnreachable(f"NATS at {servers} {_why_connect_failed(exc)}") from None


def _why_connect_failed(exc: NatsError) -> str:
    """What a command's failed NATS connect means, and the setting to check.

    nats-py raises its plain `Error` for different causes, told apart only by the text: the
    server refused the credentials (`'Authorization Violation'`), or what answers at the URL
    is not a NATS client port (it accepted and hung up, or sent no `INFO`), or another `-ERR`
    from the server. Only the first is about the credential settings; naming them for the
    others sent an operator to the wrong place. (nats-py defines `SecureConn*` errors for
    TLS but never raises them.)
    """
    text = str(exc).strip()
    lowered = text.lower()
    if (
        isinstance(exc, (AuthorizationError, InvalidUserCredentialsError))
        or "authorization" in lowered
        or "authentication" in lowered
    ):
        return f"refused the connection ({text}); check the AIPD_NATS_* credential settings"
    if "info message" in lowered:  # nats-py: "… when expecting INFO message", "info message, …"
        return (
            f"did not answer as a NATS server ({text}); check that AIPD_NATS_URL names "
            "nats-server's client port"
        )
    return f"refused the connection ({text}); check AIPD_NATS_URL and the server's log"


def credential_options(settings: Settings) -> dict[str, Any]:
    """nats-py keyword arguments for the configured credentials, TLS (files checked) and
    the role's reply-inbox prefix: every connection of this project takes them from here,
    so a role's replies arrive where its NATS user alone may subscribe."""
    options: dict[str, Any] = {"inbox_prefix": settings.nats_inbox_prefix}
    if settings.nats_user:
        options["user"] = settings.nats_user
    if settings.nats_password_file:
        options["password"] = read_secret_file(
            settings.nats_password_file, what="AIPD_NATS_PASSWORD_FILE"
        ).reveal()
    if settings.nats_token_file:
        options["token"] = read_secret_file(
            settings.nats_token_file, what="AIPD_NATS_TOKEN_FILE"
        ).reveal()
    if settings.nats_nkey_seed_file:
        read_secret_file(settings.nats_nkey_seed_file, what="AIPD_NATS_NKEY_SEED_FILE")
        options["nkeys_seed"] = str(settings.nats_nkey_seed_file)
    if settings.nats_creds_file:
        read_secret_file(settings.nats_creds_file, what="AIPD_NATS_CREDS_FILE")
        options["user_credentials"] = str(settings.nats_creds_file)
    tls = _tls(settings)
    if tls is not None:
        options["tls"] = tls
    return options


def approver_unreachable(exc: BaseException) -> str:
    """The one line a command prints when Redis does not answer the approver's user."""
    return (
        f"cannot reach Redis as the approver ({type(exc).__name__}); set "
        "AIPD_APPROVER_REDIS_URL (or AIPD_REDIS_URL) and its password file"
    )


def open_approver_redis_for(settings: Settings) -> Redis | RedisCluster:
    """The Redis client approval decisions and escalation resolutions are written with
    (`approve`, `escalations resolve`): the approver ACL user of `AIPD_APPROVER_REDIS_URL`
    and `AIPD_APPROVER_REDIS_PASSWORD_FILE` when set, since the workers' user may only read
    approvals (compose/redis/users.acl); else the `AIPD_REDIS_*` one."""
    if settings.approver_redis_url is None:
        return open_redis_for(settings)
    return open_redis_for(
        settings.model_copy(
            update={
                "redis_url": settings.approver_redis_url,
                "redis_password_file": settings.approver_redis_password_file,
            }
        ),
        file_setting="AIPD_APPROVER_REDIS_PASSWORD_FILE",
    )


def open_redis_for(
    settings: Settings, *, file_setting: str = "AIPD_REDIS_PASSWORD_FILE"
) -> Redis | RedisCluster:
    """The Redis client of these settings: URL, cluster mode, the password file (never in
    the URL) and the deployment's write confirmation."""
    password = (
        read_secret_file(settings.redis_password_file, what=file_setting)
        if settings.redis_password_file
        else None
    )
    confirm = (
        WriteConfirmation(settings.redis_wait_replicas, settings.redis_wait_timeout_ms)
        if settings.redis_wait_replicas
        else None
    )
    return open_redis(
        settings.redis_url, cluster=settings.redis_cluster, password=password, confirm=confirm
    )
