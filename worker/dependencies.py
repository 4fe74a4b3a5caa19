"""What the runtime says when something it depends on is missing: one place, one wording.

A dependency that is lost or refuses this process (NATS, Redis, a Hermes) fails every
attempt the same way, several times a second: nats-py alone calls back on every reconnect
attempt (twice a second), and such a line used to say only `ConnectionRefusedError`. Every
such line is written here instead, through `RepeatedErrors` (`worker/logs.py`): once per
dependency and cause per interval (10 s; the next line says how many were left out),
naming the dependency's URL without its credentials and what to check. The recovery is said
once too. A dependency that answers but cannot do what the worker needs (a NATS without
JetStream) and a port another process holds stop the start-up instead, with one sentence
naming the setting to change (`no_jetstream`, `port_in_use`).
"""

from __future__ import annotations

import errno
import logging
from urllib.parse import urlsplit, urlunsplit

from worker.errors import ServiceUnreachable, SettingsError
from worker.logs import RepeatedErrors

#: What to check, per dependency, when it cannot be reached.
UNREACHABLE_HINT = {
    "nats": "check AIPD_NATS_URL and that nats-server runs there (with -js)",
    "redis": "check AIPD_REDIS_URL and that Redis runs there",
}
#: What to check, per dependency, when it answers but refuses this process's credentials.
REFUSED_HINT = {
    "nats": "check the AIPD_NATS_* credential settings against the server's users",
    "redis": "check AIPD_REDIS_PASSWORD_FILE and the ACL user of AIPD_REDIS_URL",
}
#: The settings a busy or unusable listening port is named by.
METRICS_PORT_SETTINGS = "AIPD_METRICS_PORT (and AIPD_METRICS_HOST)"
GATEWAY_PORT_SETTINGS = "AIPD_GATEWAY_PORT (and AIPD_GATEWAY_HOST)"


def safe_url(url: str) -> str:
    """`url` without user, password or query (which may carry a token); every URL of a
    comma-separated list (NATS servers) so."""
    if "," in url:
        return ",".join(safe_url(part.strip()) for part in url.split(","))
    parts = urlsplit(url)
    if not parts.scheme or not parts.hostname:
        return url.rsplit("@", 1)[-1]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Dependency:
    """One dependency's lines: lost, refused, back; each once per cause per interval."""

    def __init__(
        self,
        name: str,
        url: str,
        logger: logging.Logger,
        errors: RepeatedErrors | None = None,
    ) -> None:
        self.name = name
        self.url = safe_url(url)
        self.log = logger
        self.errors = errors if errors is not None else RepeatedErrors()
        #: Recoveries are rate-limited apart: a flapping dependency must not log two lines
        #: per flap either, and a recovery must not reset the count of its failures.
        self._recoveries = RepeatedErrors(self.errors.interval_s)
        self.lost_since_back = False

    def lost(self, cause: str, *, refused: bool = False, what: str = "") -> bool:
        """Count one failed attempt for `cause` (an exception class name or a short
        phrase); log it unless this cause was logged within the interval."""
        self.lost_since_back = True
        hint = (REFUSED_HINT if refused else UNREACHABLE_HINT).get(self.name, "")
        verb = "refused this worker" if refused else "is unreachable"
        return self.errors.report(
            self.name, cause, self.log,
            "%s at %s %s (%s)%s; %s",
            self.name, self.url, verb, cause, f": {what}" if what else "", hint,
        )

    def back(self, what: str = "") -> None:
        """Say the dependency answers again, once per interval, only after a loss."""
        if not self.lost_since_back:
            return
        self.lost_since_back = False
        self._recoveries.report(
            self.name, "back", self.log,
            "%s at %s answers again%s", self.name, self.url, f"; {what}" if what else "",
            level=logging.INFO,
        )


def no_jetstream(url: str) -> ServiceUnreachable:
    """The one sentence a worker stops its start-up with when NATS has no JetStream."""
    return ServiceUnreachable(
        f"NATS at {safe_url(url)} answers but has no JetStream (nothing answered on "
        "$JS.API): start nats-server with -js (or a jetstream {} block in its config), "
        "or point AIPD_NATS_URL at one that has it"
    )


def port_in_use(exc: OSError, *, host: str, port: int, settings: str) -> OSError | SettingsError:
    """A bind that failed, named by its setting (`settings`: e.g. `AIPD_METRICS_PORT /
    AIPD_METRICS_HOST`); any other OSError is returned as it is."""
    if exc.errno == errno.EADDRINUSE:
        return SettingsError(
            f"port {port} on {host} is already in use by another process: set {settings} "
            "to a free port (or stop what holds it)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return SettingsError(
            f"cannot listen on {host}:{port}, an address this host does not have: "
            f"check {settings}"
        )
    return exc


def check_port_free(host: str, port: int | None, *, settings: str) -> None:
    """Before anything is connected or consumed: a port another process holds stops the
    start-up here, naming `settings`, not after the consumers took their first Actions.
    (The real bind repeats the translation; this only makes the common case early.)"""
    import socket

    if not port:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise port_in_use(exc, host=host, port=port, settings=settings) from None
