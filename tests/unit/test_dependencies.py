"""The one place dependency trouble is worded (`worker/dependencies.py`)."""

from __future__ import annotations

import logging

import pytest

from worker.dependencies import Dependency, port_in_use, safe_url
from worker.errors import SettingsError
from worker.logs import RepeatedErrors


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@10.0.0.1:6380/2", "redis://10.0.0.1:6380/2"),
        ("rediss://:pw@cache:6379/0?ssl_cert_reqs=none", "rediss://cache:6379/0"),
        ("nats://tok@127.0.0.1:4222,nats://u:p@h2:4223", "nats://127.0.0.1:4222,nats://h2:4223"),
        ("nats://[::1]:4222", "nats://[::1]:4222"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert safe_url(url) == shown


def test_a_cause_is_logged_once_per_interval_with_url_and_hint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    counted: list[tuple[str, str]] = []
    errors = RepeatedErrors(
        10.0, on_count=lambda w, c: counted.append((w, c)), clock=lambda: now[0]
    )
    nats = Dependency("nats", "nats://u:secret@127.0.0.1:4222", logging.getLogger("t"), errors)
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(20):  # ten seconds of reconnect attempts, twice a second
            nats.lost("ConnectionRefusedError")
            now[0] += 0.5
        nats.lost("ConnectionRefusedError")
        nats.back()
        nats.back()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "nats at nats://127.0.0.1:4222 is unreachable (ConnectionRefusedError); check "
        "AIPD_NATS_URL and that nats-server runs there (with -js)",
        "nats at nats://127.0.0.1:4222 is unreachable (ConnectionRefusedError); check "
        "AIPD_NATS_URL and that nats-server runs there (with -js) (19 more like it since "
        "the last such line, not logged)",
        "nats at nats://127.0.0.1:4222 answers again",
    ]
    assert len(counted) == 21  # the metric sees every attempt


def test_a_busy_port_names_its_setting() -> None:
    import errno

    refused = port_in_use(
        OSError(errno.EADDRINUSE, "in use"), host="10.0.0.1", port=9464,
        settings="AIPD_METRICS_PORT",
    )
    assert isinstance(refused, SettingsError)
    assert "port 9464 on 10.0.0.1 is already in use" in str(refused)
    assert "AIPD_METRICS_PORT" in str(refused)
    other = OSError(errno.EACCES, "denied")
    assert port_in_use(other, host="h", port=80, settings="S") is other
