"""Errors of the test harness, all under `HarnessError`: its services, and the fake Hermes.

Three kinds matter to a test: the service could not be started at all, or the real Hermes
could not be installed (the pytest plugin turns that into a skip, or a failure under CI); the
service runs but the harness may not control it because it belongs to someone else (an
external URL), so a chaos test cannot run; and a test not marked `chaos` tried to control the
server it shares with the other tests (a test bug).
"""

from __future__ import annotations


class HarnessError(Exception):
    """The root of the test harness's exceptions (`worker/testing/`)."""


class ServiceError(HarnessError):
    """A service the harness runs (NATS, Redis, Hermes) failed or may not be controlled."""


class ServiceStartError(ServiceError):
    """A server did not become ready; the message carries the tail of its log."""

    def __init__(self, message: str, *, log_tail: str = "", port_clash: bool = False) -> None:
        super().__init__(f"{message}\n--- log tail ---\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail
        #: True when the log shows the port was taken between choosing it and binding it.
        self.port_clash = port_clash


class HermesUnavailable(ServiceStartError):
    """The real Hermes cannot be installed here (no registry, wrong Python, pip failed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ServiceControlUnavailable(ServiceError):
    """The test asked to kill, pause or restart a service the harness does not own."""


class SharedServiceControl(ServiceError):
    """A test without the `chaos` marker tried to kill, pause or restart a shared server."""
