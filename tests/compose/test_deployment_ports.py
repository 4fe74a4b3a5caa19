"""`Deployment.up` starts again on fresh ports when a published host port was taken.

No engine is needed: the compose command is a small script standing in for the Docker client
(a tool outside the project). It logs every call with the host ports it was given and
answers `up` with the engine's own refusal text for a port in use as often as it is told to.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.compose.deployment import PORT_ATTEMPTS, Deployment, DeploymentError
from worker.testing._procs import free_ports

#: The Docker client's words when a published port is taken (iptables-only publishing);
#: the userland proxy says "bind: address already in use" instead.
ALLOCATED = (
    "Error response from daemon: driver failed programming external connectivity on "
    "endpoint x-hermes-1: Bind for 127.0.0.1:{port} failed: port is already allocated"
)
IN_USE = "listen tcp4 127.0.0.1:{port}: bind: address already in use"

FAKE_COMPOSE = """
import json, os, sys
from pathlib import Path

state = Path(os.environ["FAKE_COMPOSE_DIR"])
args = sys.argv[1:]
verb = next(a for a in args if a in ("build", "up", "down"))
ports = {k: v for k, v in os.environ.items() if k.startswith("AIP_") and k.endswith("_PORT")}
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps({"verb": verb, "ports": ports}) + "\\n")
refusals = state / "refusals.json"
if verb == "up":
    left = json.loads(refusals.read_text())
    if left:
        text = left.pop(0)
        refusals.write_text(json.dumps(left))
        sys.stderr.write(text.format(port=ports["AIP_HERMES_PORT"]) + "\\n")
        sys.exit(1)
"""


def _deployment(tmp_path: Path, refusals: list[str], monkeypatch: pytest.MonkeyPatch) -> Deployment:
    script = tmp_path / "fake_compose.py"
    script.write_text(FAKE_COMPOSE)
    (tmp_path / "refusals.json").write_text(json.dumps(refusals))
    monkeypatch.setenv("FAKE_COMPOSE_DIR", str(tmp_path))
    nats_port, gateway_port, hermes_port, fake_port = free_ports(4)
    return Deployment(
        compose=[sys.executable, str(script)],
        nats_port=nats_port,
        gateway_port=gateway_port,
        hermes_port=hermes_port,
        fake_hermes_port=fake_port,
    )


def _calls(tmp_path: Path) -> list[dict[str, object]]:
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("refusal", [ALLOCATED, IN_USE], ids=["allocated", "in-use"])
def test_a_port_taken_at_start_is_retried_on_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    deployment = _deployment(tmp_path, [refusal], monkeypatch)
    first_ports = (deployment.nats_port, deployment.gateway_port, deployment.hermes_port)

    deployment.up()

    verbs = [call["verb"] for call in _calls(tmp_path)]
    assert verbs == ["build", "up", "down", "up"]
    refused_up, retried_up = (call for call in _calls(tmp_path) if call["verb"] == "up")
    assert refused_up["ports"] != retried_up["ports"]
    assert retried_up["ports"] == {
        "AIP_NATS_PORT": str(deployment.nats_port),
        "AIP_GATEWAY_PORT": str(deployment.gateway_port),
        "AIP_HERMES_PORT": str(deployment.hermes_port),
        "AIP_FAKE_HERMES_PORT": str(deployment.fake_hermes_port),
    }
    assert (deployment.nats_port, deployment.gateway_port, deployment.hermes_port) != first_ports


def test_another_failure_is_raised_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = _deployment(tmp_path, ["no such image: aip-hermes-worker:dev"], monkeypatch)

    with pytest.raises(DeploymentError, match="no such image"):
        deployment.up()

    assert [call["verb"] for call in _calls(tmp_path)] == ["build", "up"]


def test_ports_taken_every_time_fail_after_the_last_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = _deployment(tmp_path, [ALLOCATED] * PORT_ATTEMPTS, monkeypatch)

    with pytest.raises(DeploymentError, match="port is already allocated"):
        deployment.up()

    verbs = [call["verb"] for call in _calls(tmp_path)]
    assert verbs.count("up") == PORT_ATTEMPTS
    assert verbs == ["build"] + ["up", "down"] * (PORT_ATTEMPTS - 1) + ["up"]
