"""Before any item: what the deployment is, and which of its parts can be used at all.

Each endpoint under qualification is asked for `/health` (no key), then for `/v1/models`
with its key, and its workers for their manifest over NATS; the gateway is asked to list
its tools with the driver's token. A part that fails gets one clear reason (unreachable,
key refused, no worker, token refused), which every item needing that part reports instead
of an error from deep inside. The same reads are the record's facts: versions, health,
topology, and digests of the configuration the workers run with.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from worker.errors import ConnectorError, McpHttpRefused
from worker.gateway.mcp_client import list_tools
from worker.qualify.deployment import Deployment
from worker.qualify.items import Context

#: The spec revision this project implements (front matter of operator-and-delegation.md).
SPEC_REVISION = "97be86e9efedf07ecf1783b03800f683f107fb04"
MANIFEST_TIMEOUT_S = 5.0


@dataclass
class Facts:
    """What the record states about the deployment (no secret ever goes in here)."""

    project: dict[str, Any] = field(default_factory=dict)
    hermes: dict[str, dict[str, Any]] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    nats: dict[str, Any] = field(default_factory=dict)
    redis: dict[str, Any] = field(default_factory=dict)
    gateway: dict[str, Any] = field(default_factory=dict)


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def sha256_file(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def project_facts() -> dict[str, Any]:
    """This package's version and, when it runs from a git checkout, the commit."""
    from worker.hermes import PINNED_VERSION

    try:
        version = metadata.version("aip-hermes-worker")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = Path(__file__).resolve().parents[2]
    commit = "unknown"
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            commit = done.stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=5, check=False,
            )  # fmt: skip
            if dirty.stdout.strip():
                commit += "+uncommitted-changes"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {
        "name": "aip-hermes-worker",
        "version": version,
        "commit": commit,
        "pinned_hermes": f"hermes-agent=={PINNED_VERSION}",
        "spec_revision": SPEC_REVISION,
    }


async def probe_endpoint(d: Deployment, endpoint_id: str) -> tuple[dict[str, Any], str | None]:
    """Facts about one endpoint, and the reason it cannot be used (None: it can)."""
    endpoint = d.endpoints.get(endpoint_id)
    if endpoint is None:
        return {}, "not configured (AIPD_HERMES_ENDPOINTS / AIPD_HERMES_ENDPOINTS_FILE)"
    facts: dict[str, Any] = {"url": _without_credentials(endpoint.url)}
    hermes = d.hermes[endpoint_id]
    try:
        health = await hermes.request_json("GET", "/health", protected=False, total_timeout_s=10)
    except ConnectorError as exc:
        return facts, f"unreachable at {facts['url']} ({exc.message})"
    facts["health"] = health.body
    facts["version"] = health.body.get("version") if isinstance(health.body, dict) else None
    try:
        await hermes.request_json("GET", "/v1/models", total_timeout_s=10)
    except ConnectorError as exc:
        if exc.remote_status in (401, 403):
            return facts, f"refused the configured API key (HTTP {exc.remote_status})"
        return facts, f"GET /v1/models failed ({exc.code.value}: {exc.message})"
    try:
        d.manifests[endpoint_id] = await d.client.manifest(endpoint_id)
    except TimeoutError:
        return facts, f"no worker answered the manifest request on {endpoint_id}"
    except Exception as exc:
        return facts, f"no worker answered the manifest request ({type(exc).__name__})"
    manifest = msgspec.json.encode(d.manifests[endpoint_id], order="sorted")
    facts["manifest_sha256"] = "sha256:" + hashlib.sha256(manifest).hexdigest()
    facts["capabilities"] = len(d.manifests[endpoint_id].get("capabilities", []))
    return facts, None


def _version(version: Any) -> str:
    """`2.10.4` from nats-py's ServerVersion (its repr is `<nats server v2.10.4>`)."""
    return f"{version.major}.{version.minor}.{version.patch}"


async def nats_facts(d: Deployment) -> dict[str, Any]:
    nc = d.nc
    facts: dict[str, Any] = {
        "server_version": _version(nc.connected_server_version),
        "connected": _without_credentials(str(nc.connected_url.geturl()))
        if nc.connected_url
        else None,
        "known_servers": len(nc.servers),
    }
    try:
        info = await nc.jetstream().stream_info(d.client.subjects.stream_name("actions"))
        facts["actions_stream"] = {
            "replicas": info.config.num_replicas,
            "cluster": None
            if info.cluster is None
            else {
                "name": info.cluster.name,
                "leader": info.cluster.leader,
                "replicas": len(info.cluster.replicas or []),
            },
        }
    except Exception as exc:
        facts["actions_stream"] = f"unreadable ({type(exc).__name__})"
    return facts


async def redis_facts(d: Deployment) -> dict[str, Any]:
    try:
        info = await d.redis.info()
    except Exception as exc:
        return {"error": f"INFO refused ({type(exc).__name__})"}
    wanted = (
        "redis_version", "valkey_version", "server_name", "redis_mode", "role",
        "connected_slaves", "aof_enabled", "cluster_enabled", "maxmemory_policy",
    )  # fmt: skip
    return {key: info[key] for key in wanted if key in info}


def config_digests(d: Deployment) -> dict[str, str]:
    """sha256 of the trust, policy and endpoint files named by the settings. Key, seed,
    password and token files are never read here: a digest of a secret still narrows it."""
    s = d.settings
    named = {
        "trusted_gateway_keys_file": s.trusted_gateway_keys_file,
        "trusted_identity_file": s.trusted_identity_file,
        "approval_authority_file": s.approval_authority_file,
        "hermes_endpoints_file": s.hermes_endpoints_file,
        "hermes_operator_instructions_file": s.hermes_operator_instructions_file,
        "channel_egress_file": s.channel_egress_file,
        "channel_ingress_file": s.channel_ingress_file,
        "trusted_worker_keys_file": d.qualify.trusted_worker_keys_file,
    }
    digests: dict[str, str] = {}
    for name, path in named.items():
        if path is None:
            continue
        try:
            digests[name] = sha256_file(path)
        except OSError as exc:
            digests[name] = f"unreadable ({exc.strerror})"
    policy = {
        "delegation_enabled": s.hermes_operator_delegation_enabled,
        "capability_prefixes": s.operator_capability_prefixes,
        "scope_prefixes": s.operator_scope_prefixes,
        "approval_exempt_prefixes": s.operator_approval_exempt_prefixes,
    }
    digests["operator_policy (as the driver's settings state it)"] = (
        "sha256:" + hashlib.sha256(msgspec.json.encode(policy)).hexdigest()
    )
    return digests


async def probe(ctx: Context, gateway_url: str | None, token: str | None) -> Facts:
    """Fill `ctx.problems` / the gateway fields, and return the record's facts."""
    d = ctx.deployment
    facts = Facts(project=project_facts())
    for endpoint_id in ctx.endpoint_ids:
        found, problem = await probe_endpoint(d, endpoint_id)
        if problem is not None:
            ctx.problems[endpoint_id] = problem
            found["problem"] = problem
        facts.hermes[endpoint_id] = found
    if ctx.broken is not None and ctx.broken.endpoint_id not in ctx.endpoint_ids:
        try:
            d.manifests[ctx.broken.endpoint_id] = await d.client.manifest(ctx.broken.endpoint_id)
        except Exception as exc:
            ctx.problems[ctx.broken.endpoint_id] = f"no worker serves it ({type(exc).__name__})"
    facts.nats = await nats_facts(d)
    facts.redis = await redis_facts(d)
    facts.digests = config_digests(d)
    if gateway_url is not None and token is not None:
        facts.gateway["url"] = _without_credentials(gateway_url)
        try:
            facts.gateway["tools"] = await list_tools(gateway_url, token)
            ctx.gateway_url, ctx.mcp_token = gateway_url, token
        except McpHttpRefused as exc:
            ctx.gateway_problem = f"refused the driver's MCP token (HTTP {exc.status})"
        except Exception as exc:
            ctx.gateway_problem = f"unreachable at {facts.gateway['url']} ({type(exc).__name__})"
        if ctx.gateway_problem is not None:
            facts.gateway["problem"] = ctx.gateway_problem
    return facts
