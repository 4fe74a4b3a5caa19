"""Per-endpoint API keys (issue 19): each Hermes endpoint is sent its own key and no other,
and one key is never spread over several endpoints unless the deployment says they are one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.result import ResultStatus
from subjects.grammar import envelope_msg_id
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.integration.stack import ENDPOINT, Stack
from worker.endpoints import resolve_endpoints
from worker.settings import Settings
from worker.testing.fake_hermes import FakeHermes
from worker.testing.identities import (
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
    write_api_key_file,
)

OTHER = "h2"


async def test_each_endpoint_is_sent_only_its_own_key(stack: Stack, tmp_path: Path) -> None:
    """h1 (the stack's fake) takes its key from AIPD_HERMES_API_KEY_FILES; h2, a hostile
    Hermes of its own with another key, from the endpoints file."""
    assert stack.fake is not None
    key_1 = stack.fake.api_key
    key_2, key_file_2 = write_api_key_file(tmp_path, "h2.key")
    await provision(stack.nc.jetstream(), stack.subjects, [ENDPOINT, OTHER], StreamPolicy())
    async with FakeHermes(api_key=key_2, port=0) as hostile:
        endpoints_file = tmp_path / "endpoints.json"
        endpoints_file.write_text(
            json.dumps([{"id": OTHER, "url": hostile.url, "api_key_file": str(key_file_2)}])
        )
        key_file_1 = stack.env.pop("AIPD_HERMES_API_KEY_FILE")  # no shared key at all
        await stack.spawn(
            "w1",
            AIPD_HERMES_ENDPOINTS=f"{ENDPOINT}={stack.fake.url}",
            AIPD_HERMES_ENDPOINTS_FILE=str(endpoints_file),
            AIPD_HERMES_API_KEY_FILES=f"{ENDPOINT}={key_file_1}",
        )
        results = []
        for endpoint_id in (ENDPOINT, OTHER):
            action = stack.client.build_action(
                endpoint_id=endpoint_id,
                operation="models",
                input={},
                principal_id=USER_UNTENANTED,
                principal_kind=PRINCIPAL_KIND,
                authentication_issuer=ISSUER,
                credential_revision=REVISION,
            )
            payload = stack.trust.seal_action(action)
            await stack.nc.jetstream().publish(
                stack.subjects.actions(endpoint_id),
                payload,
                headers={"Nats-Msg-Id": envelope_msg_id(action.id, payload)},
            )
            handle = stack.client.handle(endpoint_id, action.id)
            results.append(await handle.result(timeout_s=20))

        assert [r.status for r in results] == [ResultStatus.COMPLETED] * 2
        seen_by_1 = _headers_seen(stack.fake)
        seen_by_2 = _headers_seen(hostile)
        assert f"Bearer {key_1}" in seen_by_1
        assert f"Bearer {key_2}" in seen_by_2
        assert key_2 not in seen_by_1
        assert key_1 not in seen_by_2  # the hostile endpoint never saw h1's key
        assert stack.fake.stats().count("GET /v1/models") >= 1
        assert hostile.stats().count("GET /v1/models") >= 1


def _headers_seen(fake: FakeHermes) -> str:
    """Every header value of every request the fake received, as one searchable text."""
    return "\n".join(
        f"{name}: {value}" for request in fake.requests() for name, value in request.headers.items()
    )


def _settings(tmp_path: Path, **overrides: object) -> Settings:
    _, key_file = write_api_key_file(tmp_path, "shared.key")
    values: dict[str, object] = {
        "hermes_endpoints": "h1=http://127.0.0.1:1,h2=http://127.0.0.1:2",
        "hermes_api_key_file": key_file,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def test_one_key_for_several_endpoints_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"2 endpoints \(h1, h2\).*AIPD_HERMES_SHARE_API_KEY"):
        resolve_endpoints(_settings(tmp_path))


def test_the_refusal_names_the_setting_the_shared_key_came_from(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"one API key \(AIPD_HERMES_API_KEY\) would be sent"):
        resolve_endpoints(_settings(tmp_path, hermes_api_key_file=None, hermes_api_key="k" * 32))


def test_one_key_for_one_endpoint_is_allowed(tmp_path: Path) -> None:
    [endpoint] = resolve_endpoints(_settings(tmp_path, hermes_endpoints="h1=http://127.0.0.1:1"))
    assert endpoint.api_key is not None


def test_sharing_one_key_must_be_said_explicitly(tmp_path: Path) -> None:
    endpoints = resolve_endpoints(_settings(tmp_path, hermes_share_api_key=True))
    assert len({e.api_key.reveal() for e in endpoints if e.api_key}) == 1
    assert len(endpoints) == 2


def test_the_shared_key_may_serve_the_one_endpoint_without_its_own(tmp_path: Path) -> None:
    own_key, own_file = write_api_key_file(tmp_path, "h2.key")
    endpoints = resolve_endpoints(_settings(tmp_path, hermes_api_key_files=f"h2={own_file}"))
    keys = {e.id: e.api_key.reveal() for e in endpoints if e.api_key}
    assert keys["h2"] == own_key
    assert keys["h1"] != own_key


@pytest.mark.parametrize(
    ("key_files", "message"),
    [
        ("h3=/dev/null", "'h3', which is not configured"),
        ("h1", "is not id=path"),
        ("h1=/a,h1=/b", "two API key files"),
    ],
)
def test_a_key_file_list_that_could_misroute_a_key_is_refused(
    tmp_path: Path, key_files: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_endpoints(_settings(tmp_path, hermes_api_key_files=key_files))


def test_the_worker_refuses_to_start_with_one_key_for_two_endpoints(tmp_path: Path) -> None:
    key, key_file = write_api_key_file(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "worker", "run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **os.environ,
            "AIPD_HERMES_ENDPOINTS": "h1=http://127.0.0.1:1,h2=http://127.0.0.1:2",
            "AIPD_HERMES_API_KEY_FILE": str(key_file),
            "AIPD_NATS_URL": "nats://127.0.0.1:1",
        },
    )
    assert done.returncode == 2
    assert "AIPD_HERMES_SHARE_API_KEY" in done.stderr
    assert key not in done.stderr + done.stdout
