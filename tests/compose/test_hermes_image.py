"""The compose `hermes` image runs the configuration the real Hermes 0.19 accepts.

The image (compose/hermes/) installs the same pins as `worker.testing.real_hermes`, its
mounted config is the document `real_hermes.hermes_config` gives every real Hermes the tests
run (with the compose network's addresses), and what its entrypoint renders from that config
and the compose secrets is loaded here by the real Hermes 0.19's own code: its config loader,
its MCP server loader (which also drops configs it finds suspicious) and its gateway config
with the API server's startup guard. No Docker engine is needed; the compose-up test
(test_compose_up.py) runs the image itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.compose.deployment import COMPOSE, COMPOSE_FILE
from worker.gateway.mcp_app import MCP_PATH, TOOL_SCOPES
from worker.testing.real_hermes import (
    AIOHTTP_VERSION,
    HERMES_VERSION,
    REQUIREMENTS,
    ensure_hermes_venv,
    hermes_config,
    hermes_dotenv,
)

HERMES_DIR = COMPOSE / "hermes"
TOKEN_PLACEHOLDER = "${AIP_MCP_TOKEN}"
#: Where the image keeps Hermes' data (its Dockerfile and entrypoint).
TERMINAL_CWD = "/var/lib/hermes/work"
#: The compose Hermes' bounds on an MCP call: an `aip_call` in mode sync waits for its child
#: (AIPD_GATEWAY_CALL_TIMEOUT_MS, 300 s by default), so Hermes must wait as long.
MCP_TIMEOUT_S = 300
MCP_CONNECT_TIMEOUT_S = 15
#: The API server's address inside the container (what the entrypoint renders by default).
API_HOST = "0.0.0.0"  # noqa: S104 (compared with, never bound here)
API_PORT = 8642

#: Run by the real Hermes' interpreter: what Hermes itself makes of a HERMES_HOME.
_LOAD_WITH_HERMES = """
import hashlib, json
from hermes_cli.env_loader import load_hermes_dotenv
load_hermes_dotenv()
from hermes_cli.auth import has_usable_secret
from hermes_cli.config import load_config
from gateway.config import Platform, load_gateway_config
from hermes_cli.managed_scope import _DEFAULT_MANAGED_DIR
from tools.mcp_tool import _load_mcp_config
config = load_config()
api = load_gateway_config().platforms[Platform.API_SERVER]
key = api.extra.get("key", "")
print(json.dumps({
    "config": config,
    "mcp_servers": _load_mcp_config(),
    "managed_dir": str(_DEFAULT_MANAGED_DIR),
    "api_server": {
        "enabled": api.enabled,
        "host": api.extra.get("host"),
        "port": api.extra.get("port"),
        "key_passes_startup_guard": has_usable_secret(key, min_length=16),
        "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
    },
}))
"""


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    return loaded


def _secret(name: str) -> str:
    return (COMPOSE / "secrets" / name).read_text(encoding="utf-8").strip()


def _secret_file(service: dict[str, Any], variable: str) -> str:
    """The compose secret a `/run/secrets/<name>` variable of `service` names."""
    path = str(service["environment"][variable])
    name = path.removeprefix("/run/secrets/")
    assert path == f"/run/secrets/{name}", (variable, path)
    assert name in service["secrets"], (variable, path)
    return str(_compose()["secrets"][name]["file"])


def _expected_config() -> dict[str, Any]:
    """`real_hermes.hermes_config` with the compose deployment's addresses."""
    doc = _compose()
    llm_command = doc["services"]["fake-llm"]["command"]
    llm_port = llm_command[llm_command.index("--port") + 1]
    gateway_port = doc["x-gateway-env"]["AIPD_GATEWAY_PORT"]
    return hermes_config(
        llm_base_url=f"http://fake-llm:{llm_port}/v1",
        terminal_cwd=TERMINAL_CWD,
        mcp_servers={"aip": (f"http://gateway:{gateway_port}{MCP_PATH}", TOKEN_PLACEHOLDER)},
        mcp_tools=list(TOOL_SCOPES),
        mcp_timeout_s=MCP_TIMEOUT_S,
        mcp_connect_timeout_s=MCP_CONNECT_TIMEOUT_S,
    )


def test_the_image_installs_the_pins_the_real_hermes_tests_run() -> None:
    dockerfile = (HERMES_DIR / "Dockerfile").read_text(encoding="utf-8")
    args = dict(re.findall(r"(?m)^ARG (\w+)=(\S+)$", dockerfile))
    assert args["HERMES_VERSION"] == HERMES_VERSION
    assert args["AIOHTTP_VERSION"] == AIOHTTP_VERSION
    installed = tuple(
        requirement.replace("${HERMES_VERSION}", HERMES_VERSION).replace(
            "${AIOHTTP_VERSION}", AIOHTTP_VERSION
        )
        for requirement in re.findall(r'"([a-z-]+(?:\[\w+\])?==\$\{\w+\})"', dockerfile)
    )
    assert installed == REQUIREMENTS


def test_the_mounted_config_is_the_config_of_the_real_hermes_tests() -> None:
    mounted = yaml.safe_load((HERMES_DIR / "config.yaml").read_text(encoding="utf-8"))
    assert mounted == _expected_config()


def test_the_gateway_answers_the_name_the_hermes_config_calls_it_by() -> None:
    url = _expected_config()["mcp_servers"]["aip"]["url"]
    netloc = url.removeprefix("http://").removesuffix(MCP_PATH)
    allowed = _compose()["x-gateway-env"]["AIPD_MCP_ALLOWED_HOSTS"].split(",")
    assert netloc in [host.strip() for host in allowed]


def test_the_compose_service_mounts_the_config_and_its_secrets() -> None:
    doc = _compose()
    hermes = doc["services"]["hermes"]
    assert "profiles" not in hermes  # the real Hermes is the default
    assert hermes["build"]["context"] == "./hermes"
    assert "./hermes/config.yaml:/etc/aip/hermes/config.yaml:ro" in hermes["volumes"]
    assert _secret_file(hermes, "AIP_HERMES_API_KEY_FILE") == "./secrets/hermes_api_key"
    assert _secret_file(hermes, "AIP_MCP_TOKEN_FILE") == "./secrets/mcp_token_hermes-1"
    # Hermes lists MCP tools once, at start: the gateway must already answer.
    assert hermes["depends_on"] == {"gateway": {"condition": "service_healthy"}}
    # The workers' endpoint is this service unless AIP_HERMES_1_URL says otherwise.
    endpoints = doc["x-worker-env"]["AIPD_HERMES_ENDPOINTS"]
    assert endpoints == f"hermes-1=${{AIP_HERMES_1_URL:-http://hermes:{API_PORT}}}"
    # The fakes are development tools only.
    for fake in ("fake-llm", "fake-hermes"):
        assert doc["services"][fake]["profiles"] == ["dev"], fake


def _render(home: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    """compose/hermes/render_home.py, as the image's entrypoint runs it, into `home`."""
    env = {
        "PATH": os.environ["PATH"],
        "HERMES_HOME": str(home),
        "AIP_HERMES_CONFIG": str(HERMES_DIR / "config.yaml"),
        "AIP_HERMES_API_KEY_FILE": str(COMPOSE / "secrets" / "hermes_api_key"),
        "AIP_MCP_TOKEN_FILE": str(COMPOSE / "secrets" / "mcp_token_hermes-1"),
        **overrides,
    }
    return subprocess.run(
        [sys.executable, str(HERMES_DIR / "render_home.py")],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def test_the_rendered_home_holds_the_secrets_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _render(home)
    assert done.returncode == 0, done.stderr
    assert (home / ".env").read_text() == hermes_dotenv(
        _secret("hermes_api_key"), API_HOST, API_PORT
    )
    rendered = yaml.safe_load((home / "config.yaml").read_text())
    token = _secret("mcp_token_hermes-1")
    assert rendered["mcp_servers"]["aip"]["headers"] == {"Authorization": f"Bearer {token}"}
    template = _expected_config()
    template["mcp_servers"]["aip"]["headers"] = rendered["mcp_servers"]["aip"]["headers"]
    assert rendered == template
    for name in (".env", "config.yaml"):
        assert (home / name).stat().st_mode & 0o077 == 0, name


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("", "is empty"),
        ("short-key", "shorter than 16"),
        ('quote"in-the-key-0123456789', "holds a character"),
        ("line\nbreak-in-the-key-0123456789", "holds a character"),
    ],
    ids=["empty", "short", "quote", "newline"],
)
def test_a_bad_key_file_is_refused_before_hermes_starts(
    tmp_path: Path, content: str, complaint: str
) -> None:
    key = tmp_path / "key"
    key.write_text(content)
    done = _render(tmp_path / "home", AIP_HERMES_API_KEY_FILE=str(key))
    assert done.returncode == 2
    assert complaint in done.stderr
    assert content.split("\n")[0] not in done.stderr or content == ""
    assert not (tmp_path / "home" / ".env").exists()


def test_a_missing_token_file_is_refused(tmp_path: Path) -> None:
    done = _render(tmp_path / "home", AIP_MCP_TOKEN_FILE=str(tmp_path / "absent"))
    assert done.returncode == 2
    assert "cannot read the MCP token" in done.stderr
    assert not (tmp_path / "home" / "config.yaml").exists()


@pytest.mark.real_hermes
async def test_the_real_hermes_loads_the_rendered_home_as_intended(tmp_path: Path) -> None:
    venv = await asyncio.to_thread(ensure_hermes_venv)
    home = tmp_path / "home"
    managed = tmp_path / "no-managed-scope"
    managed.mkdir()
    done = _render(home)
    assert done.returncode == 0, done.stderr
    loaded = await asyncio.to_thread(
        subprocess.run,
        [str(venv / "bin" / "python"), "-c", _LOAD_WITH_HERMES],
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "HERMES_HOME": str(home),
            # As in the image: no managed scope (whatever this host has in /etc/hermes).
            "HERMES_MANAGED_DIR": str(managed),
        },
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    seen = json.loads(loaded.stdout.strip().splitlines()[-1])
    expected = _expected_config()
    # Every value the image's config sets is the value Hermes runs with (Hermes adds its
    # defaults around them).
    for section in ("model", "approvals", "terminal", "security"):
        for key, value in expected[section].items():
            assert seen["config"][section][key] == value, (section, key)
    # The MCP server survived Hermes' suspicious-config filter, with the token in its header.
    aip = expected["mcp_servers"]["aip"]
    aip["headers"] = {"Authorization": f"Bearer {_secret('mcp_token_hermes-1')}"}
    assert seen["mcp_servers"] == {"aip": aip}
    # Nothing is mounted into Hermes' managed scope (`/etc/hermes`): a config.yaml there wins
    # over HERMES_HOME's key by key, so the unrendered template would override the token.
    mounts = [v.split(":")[1] for v in _compose()["services"]["hermes"]["volumes"]]
    assert not [m for m in mounts if Path(m).is_relative_to(seen["managed_dir"])], mounts
    # The API server is enabled on the container's address, with the compose key, which
    # passes the guard that otherwise makes 0.19 log "Refusing to start" and never listen.
    key_sha256 = hashlib.sha256(_secret("hermes_api_key").encode()).hexdigest()
    assert seen["api_server"] == {
        "enabled": True,
        "host": API_HOST,
        "port": API_PORT,
        "key_passes_startup_guard": True,
        "key_sha256": key_sha256,
    }
