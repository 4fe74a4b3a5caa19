"""`aip-hermes-worker qualify` pointed at a deployment it cannot qualify: every item that
cannot run says why, the exit code says whether a required item failed, the record holds
no secret.

The deployment here is real NATS and Redis, the project's fake Hermes and the real gateway
(in-process); no worker runs, because each bad input must be reported before any Action is
published (an unreachable endpoint, a refused key, a refused token, one endpoint only).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from worker.commands.cli import main
from worker.testing.fake_hermes import FakeHermes
from worker.testing.gateway import GatewayRuntime, gateway_runtime, hermes_principal_id
from worker.testing.identities import TrustFiles, write_api_key_file, write_trust_files
from worker.testing.services import ServiceHandle


@dataclass
class Target:
    root: Path
    fake: FakeHermes
    api_key: str
    key_file: Path
    trust: TrustFiles
    runtime: GatewayRuntime
    monkeypatch: pytest.MonkeyPatch

    def token_file(self, token: str) -> Path:
        path = self.root / "driver.token"
        path.write_text(token)
        path.chmod(0o600)
        return path

    async def qualify(self, *args: str, endpoints: str) -> tuple[int, Path]:
        """Run the CLI (in a thread: it runs its own event loop) against `endpoints`."""
        self.monkeypatch.setenv("AIPD_HERMES_ENDPOINTS", endpoints)
        record = self.root / "record"
        argv = ["qualify", *args, "--record", str(record)]
        return await asyncio.to_thread(main, argv), record


@pytest.fixture
async def target(
    tmp_path: Path,
    nats_server: ServiceHandle,
    redis_server: ServiceHandle,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Target]:
    trust_dir = tmp_path / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    api_key, key_file = write_api_key_file(tmp_path)
    principals = {"driver": ("agent:qualify-driver", None), "h1": (hermes_principal_id("h1"), None)}
    async with (
        FakeHermes(api_key=api_key) as fake,
        gateway_runtime(nats_server.url, tmp_path, trust.seed_file, principals) as runtime,
    ):
        for name, value in {
            "AIPD_NATS_URL": nats_server.url,
            "AIPD_REDIS_URL": redis_server.url,
            "AIPD_HERMES_API_KEY_FILE": str(key_file),
            "AIPD_HERMES_SHARE_API_KEY": "true",
            "AIPD_GATEWAY_SIGNING_KEY_FILE": str(trust.seed_file),
            "AIPD_TRUSTED_WORKER_KEYS_FILE": str(trust.worker_keys_file),
            **trust.environment(),
        }.items():
            monkeypatch.setenv(name, value)
        yield Target(tmp_path, fake, api_key, key_file, trust, runtime, monkeypatch)


def _items(record: Path) -> dict[int, dict[str, object]]:
    document = json.loads((record / "qualification-record.json").read_text())
    return {item["number"]: item for item in document["items"]}


def _no_secret_in(record: Path, *secrets: str) -> None:
    for path in record.iterdir():
        text = path.read_text()
        for secret in secrets:
            assert secret not in text, path


async def test_an_unreachable_endpoint_fails_its_items_with_the_reason(
    target: Target, capsys: pytest.CaptureFixture[str], refused_port: int
) -> None:
    closed = f"http://127.0.0.1:{refused_port}"
    code, record = await target.qualify(
        "--endpoint-id", "h1", "--item", "2", endpoints=f"h1={closed}"
    )
    assert code == 1
    item = _items(record)[2]
    assert item["status"] == "fail"
    assert f"endpoint h1: unreachable at {closed}" in str(item["detail"])
    out = capsys.readouterr().out
    assert f"!! endpoint h1: unreachable at {closed}" in out
    assert " 2 fail " in out
    _no_secret_in(record, target.api_key)


async def test_a_refused_key_is_named_and_no_action_is_published(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    target.key_file.write_text("key-" + "0" * 32)
    code, record = await target.qualify(
        "--endpoint-id", "h1", "--item", "4", endpoints=f"h1={target.fake.url}"
    )
    assert code == 1
    detail = str(_items(record)[4]["detail"])
    assert detail == "endpoint h1: refused the configured API key (HTTP 401)"
    assert target.fake.stats().count("POST /v1/runs") == 0
    document = json.loads((record / "qualification-record.json").read_text())
    assert document["verdict"] == "failed"
    assert document["hermes"]["h1"]["version"] == "0.19.0"  # /health needs no key


async def test_one_hermes_only_skips_the_two_instance_items_with_the_reason(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record = await target.qualify(
        "--endpoint-id", "h1", "--item", "8", endpoints=f"h1={target.fake.url}"
    )
    assert code == 0  # nothing failed; the record says it is incomplete
    item = _items(record)[8]
    assert item["status"] == "skip"
    assert item["detail"] == "needs 2 Hermes endpoints (--endpoint-id given 2 times), got 1"
    document = json.loads((record / "qualification-record.json").read_text())
    assert document["verdict"] == "incomplete"


async def test_a_gateway_refusing_the_token_fails_the_gateway_item(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = "mcp-not-issued-" + "f" * 24
    target.monkeypatch.setenv("AIPD_QUALIFY_GATEWAY_URL", target.runtime.url)
    target.monkeypatch.setenv("AIPD_MCP_ACCESS_TOKEN_FILE", str(target.token_file(wrong)))
    code, record = await target.qualify(
        "--endpoint-id", "h1", "--item", "9", endpoints=f"h1={target.fake.url}"
    )
    assert code == 1
    item = _items(record)[9]
    assert item["status"] == "fail"
    assert item["detail"] == "gateway: refused the driver's MCP token (HTTP 401)"
    assert "!! gateway: refused the driver's MCP token (HTTP 401)" in capsys.readouterr().out
    _no_secret_in(record, wrong, target.api_key)


async def test_processes_the_driver_does_not_own_are_not_touched(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record = await target.qualify(
        "--endpoint-id", "h1", "--item", "3", "--item", "7", endpoints=f"h1={target.fake.url}"
    )
    assert code == 0
    for number in (3, 7):
        item = _items(record)[number]
        assert item["status"] == "skip"
        assert str(item["detail"]).startswith("the driver does not own the deployment's processes")
