"""A service the environment provides by URL, which the harness uses but does not own.

`AIPD_TEST_NATS_URL` / `AIPD_TEST_REDIS_URL` point the suite at servers run elsewhere (a CI
service container, a developer's cluster). Tests that only talk to the server run unchanged;
tests that would kill, pause or restart it get `ServiceControlUnavailable` instead of silently
doing nothing, and the pytest plugin turns that into a skip (a failure under CI).
"""

from __future__ import annotations

import socket
from typing import NoReturn
from urllib.parse import urlsplit

from worker.testing._errors import ServiceControlUnavailable, ServiceStartError

_DEFAULT_PORTS = {"nats": 4222, "tls": 4222, "redis": 6379, "rediss": 6379, "unix": 0}


class ExternalService:
    """A handle with the harness API whose control operations all refuse, by design."""

    def __init__(self, kind: str, url: str, source: str) -> None:
        #: What the server is, e.g. "nats"; used in messages.
        self.kind = kind
        self.url = url
        #: Where the URL came from (the environment variable), so errors say what to unset.
        self.source = source

    @property
    def controllable(self) -> bool:
        """Always false: someone else runs this server."""
        return False

    def start(self) -> None:
        """Check that the server accepts connections; it is already running elsewhere."""
        parts = urlsplit(self.url.split(",")[0].strip())
        host = parts.hostname or "127.0.0.1"
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
        try:
            with socket.create_connection((host, port), timeout=2.0):
                pass
        except OSError as exc:
            raise ServiceStartError(f"{self.kind} at {self.url} ({self.source}): {exc}") from exc

    def stop(self) -> NoReturn:
        """Refuse: the harness does not own this server."""
        self._refuse("stop")

    def kill(self) -> NoReturn:
        """Refuse: the harness does not own this server."""
        self._refuse("kill")

    def pause(self) -> NoReturn:
        """Refuse: the harness does not own this server."""
        self._refuse("pause")

    def resume(self) -> NoReturn:
        """Refuse: the harness does not own this server."""
        self._refuse("resume")

    def restart(self) -> NoReturn:
        """Refuse: the harness does not own this server."""
        self._refuse("restart")

    def close(self) -> None:
        """Nothing to release: the server stays up for its owner."""

    def _refuse(self, action: str) -> NoReturn:
        raise ServiceControlUnavailable(
            f"cannot {action} {self.kind} at {self.url}: it comes from {self.source}, "
            f"so the harness does not own it; unset {self.source} to let tests start their own"
        )
