"""The compose deployment is correct by reference and by running its own config files.

No Docker engine is needed for most of this: every file the compose file names must exist,
every `AIPD_*` name must be a real Settings field, every key path must be mounted, the keys
and password hashes in the configs must match the secrets, and the NATS and Redis config
files are run for real (on free local ports) to prove that the worker's permissions cover
every subject of the grammar and every key it writes, and nothing more. `docker compose
config` runs too when the client has the compose plugin and an engine answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nkeys
import pytest
import redis
import redis.asyncio
import yaml
from nats.aio.client import Client as NATS

from subjects.grammar import Subjects
from tests.compose.deployment import compose_command
from worker.bus.server_requirements import MINIMUM_NATS_SERVER
from worker.settings import Settings
from worker.store.keys import ActionKeys
from worker.store.lease_store import AcquireStatus, LeaseStore
from worker.testing._procs import free_ports, port_accepts, wait_until
from worker.testing.pytest_plugin import require_engine, service_unavailable
from worker.testing.services import (
    find_nats_server_at_least,
    find_redis_cli,
    find_redis_server,
)
from worker.trust.authority import ApprovalAuthority

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
ENDPOINT = "hermes-1"
ACTION_ID = "act_" + "a" * 32


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    return loaded


def _secret(name: str) -> str:
    return (COMPOSE / "secrets" / name).read_text(encoding="utf-8").strip()


def _public_key(seed_file: str) -> str:
    public: bytes = nkeys.from_seed(_secret(seed_file).encode()).public_key
    return public.decode()


# --- docker compose config --------------------------------------------------------------


@pytest.mark.parametrize("profile", [[], ["--profile", "dev"]], ids=["default", "dev"])
def test_docker_compose_config_accepts_the_deployment(profile: list[str]) -> None:
    compose = compose_command()
    if compose is None:
        require_engine()
        service_unavailable("neither `docker compose` nor `docker-compose` is installed")
    done = subprocess.run(
        [*compose, "-p", "aip-hermes", "-f", str(COMPOSE_FILE), *profile, "config", "--quiet"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


# --- references --------------------------------------------------------------------------


def _bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host path, container path) of each read-only file mount (`./file:/path:ro`).

    Files are bind mounts rather than compose `configs`, which docker-compose 1.29 ignores
    outside swarm mode."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts.append((source, target))
    return mounts


def test_every_file_the_deployment_names_exists() -> None:
    doc = _compose()
    for name, entry in doc["secrets"].items():
        assert (COMPOSE / entry["file"]).is_file(), f"secrets.{name}: {entry['file']}"
    for name, service in doc["services"].items():
        for source, _ in _bind_mounts(service):
            assert (COMPOSE / source).is_file(), f"{name}: mounts missing {source}"
    assert (COMPOSE / doc["x-worker-image"]["build"]["context"]).resolve() == ROOT
    builds = {(s["build"]["context"], s["build"].get("dockerfile", "Dockerfile"))
              for s in doc["services"].values() if "build" in s}  # fmt: skip
    assert len(builds) == 2  # the worker image and the Hermes image
    for context_dir, dockerfile_name in builds:
        context = (COMPOSE / context_dir).resolve()
        dockerfile = context / dockerfile_name
        for line in dockerfile.read_text(encoding="utf-8").splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    assert (context / source).exists(), f"{dockerfile} copies missing {source}"


def test_services_use_only_declared_secrets_and_volumes_and_mount_files_read_only() -> None:
    doc = _compose()
    assert "configs" not in doc
    for name, service in doc["services"].items():
        assert "configs" not in service, f"{name}: docker-compose 1.29 would ignore configs"
        for secret in service.get("secrets", []):
            assert secret in doc["secrets"], f"{name}: secret {secret}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert volume.endswith(":ro"), f"{name}: {volume} must be read-only"
            else:
                assert source in doc["volumes"], f"{name}: volume {volume}"
        for needed in service.get("depends_on", {}):
            assert needed in doc["services"], f"{name} depends on unknown {needed}"


def _interpolated(value: str) -> str:
    """`value` as compose renders it when no variable is set: `${NAME:-default}` -> default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def test_every_environment_name_is_a_settings_field() -> None:
    env = _compose()["x-worker-env"]
    fields = set(Settings.model_fields)
    unknown = [key for key in env if key.removeprefix("AIPD_").lower() not in fields]
    assert not unknown
    assert all(key.startswith("AIPD_") for key in env)
    # The values are valid together, as a worker would read them at startup.
    values = {key.removeprefix("AIPD_").lower(): _interpolated(v) for key, v in env.items()}
    assert "${" not in "".join(values.values())
    Settings(**values)


def test_the_gateway_environment_is_valid_gateway_settings() -> None:
    from worker.gateway.settings import GatewaySettings

    env = _compose()["x-gateway-env"]
    fields = set(GatewaySettings.model_fields) | set(Settings.model_fields)
    assert [key for key in env if key.removeprefix("AIPD_").lower() not in fields] == []
    gateway = _compose()["services"]["gateway"]
    assert gateway["command"] == ["aip-hermes-worker", "gateway"]
    assert "/ready" in " ".join(gateway["healthcheck"]["test"])
    # The gateway runs as the NATS user allowed to write the runtime's records.
    assert env["AIPD_NATS_NKEY_SEED_FILE"] == "/run/aip/nats_gateway.nk"
    # It records a child's result only when a worker key signed it (the workers' file).
    assert env["AIPD_TRUSTED_WORKER_KEYS_FILE"] == "/etc/aip/worker-keys.txt"
    # The dev token's hash is what the principals file holds (never the token itself).
    from worker.gateway.principals import token_sha256

    principals = (COMPOSE / "secrets" / "mcp_principals.json").read_text(encoding="utf-8")
    token = _secret("mcp_token_hermes-1")
    assert token not in principals
    assert token_sha256(token) in principals


def test_every_file_path_in_the_environment_is_mounted_where_it_is_used() -> None:
    doc = _compose()
    for name, service in doc["services"].items():
        env = service.get("environment") or {}
        secrets = set(service.get("secrets", []))
        configs = {target for _, target in _bind_mounts(service)}
        for key, value in env.items():
            if not key.endswith("_FILE"):
                continue
            if value.startswith(("/run/aip/", "/run/secrets/")):
                # The worker image's entrypoint copies /run/secrets/<name> to /run/aip/<name>;
                # the Hermes image's reads /run/secrets/<name> itself.
                secret = value.removeprefix("/run/aip/").removeprefix("/run/secrets/")
                assert secret in secrets or name == "provision", (
                    f"{name}: {key} points at a secret the service does not mount"
                )
            else:
                assert value in configs or name == "provision", f"{name}: {key} not mounted"
    # provision reads settings only: it needs the NATS admin credential, nothing else, and
    # it is the only service that has it.
    assert doc["services"]["provision"]["secrets"] == ["nats_admin.nk"]
    provision_env = doc["services"]["provision"]["environment"]
    assert provision_env["AIPD_NATS_NKEY_SEED_FILE"] == "/run/aip/nats_admin.nk"
    for name, service in doc["services"].items():
        if name != "provision":
            assert "nats_admin.nk" not in service.get("secrets", []), name


def test_worker_replicas_health_checks_and_drain_time() -> None:
    worker = _compose()["services"]["worker"]
    assert worker["deploy"]["replicas"] == 3
    assert "/ready" in " ".join(worker["healthcheck"]["test"])
    grace = float(_compose()["x-worker-env"]["AIPD_SHUTDOWN_GRACE_S"])
    assert float(worker["stop_grace_period"].removesuffix("s")) > grace


def test_config_keys_and_password_hashes_match_the_secrets(tmp_path: Path) -> None:
    nats_conf = (COMPOSE / "nats" / "nats.conf").read_text(encoding="utf-8")
    for seed in ("nats_worker.nk", "nats_gateway.nk", "nats_admin.nk"):
        public = _public_key(seed)
        assert f"nkey: {public}" in nats_conf, seed
    signer = _public_key("gateway_signing.nk")
    assert signer in (COMPOSE / "config" / "gateway-keys.txt").read_text(encoding="utf-8")
    authority_file = COMPOSE / "config" / "authority.json"
    for membership in json.loads(authority_file.read_text(encoding="utf-8")):
        name = membership["principal_id"].split(":", 1)[1]
        assert membership["public_key"] == _public_key(f"approver_{name}.nk"), name
    # Loaded as a worker would (a copy: a checkout's umask may leave it group-writable).
    copy = tmp_path / "authority.json"
    shutil.copyfile(authority_file, copy)
    copy.chmod(0o644)
    assert len(ApprovalAuthority.load(copy, now_ms=0)) == 3
    worker_signer = _public_key("worker_signing.nk")
    assert worker_signer in (COMPOSE / "config" / "worker-keys.txt").read_text(encoding="utf-8")
    acl = (COMPOSE / "redis" / "users.acl").read_text(encoding="utf-8")
    for user, secret in (
        ("aipworker", "redis_worker_password"),
        ("aipapprover", "redis_approver_password"),
        ("admin", "redis_admin_password"),
    ):
        digest = hashlib.sha256(_secret(secret).encode()).hexdigest()
        assert f"user {user} on #{digest} " in acl, user


# --- NATS: the compose config, run -------------------------------------------------------

#: Who may do what on each per-endpoint subject (docs/security.md, "Roles"). Every subject
#: method of `Subjects` must be listed, so a new subject cannot ship without a permission
#: decision. Workers pull Actions and delegations through their durable consumers (replies
#: to their own inbox), so they never subscribe to the work subjects themselves.
#: Workers also queue channel deliveries for other workers (`egress`, pulled through a
#: durable consumer like the work subjects) and raise escalations; the gateway's
#: credentials publish escalation resolutions (`escalations resolve`).
WORKER_PUBLISHES = {
    "chunks", "results", "dlq", "audit", "cancel_notice", "escalations", "egress",
}
WORKER_SUBSCRIBES = {"cancel", "manifest", "cancel_notice"}
WORK_SUBJECTS = {"actions", "delegations"}
#: The gateway also files its own receipts (one per MCP tool call) on the audit subjects.
GATEWAY_PUBLISHES = {
    "actions", "delegations", "cancel", "manifest", "audit", "escalation_resolutions",
}


#: Grammar methods that give what an endpoint's subjects start with, not a subject.
_SUBJECT_BASES = {"endpoint", "endpoint_base"}


def _endpoint_subjects() -> dict[str, str]:
    subjects = Subjects()
    found: dict[str, str] = {}
    for name, method in inspect.getmembers(subjects, inspect.ismethod):
        params = list(inspect.signature(method).parameters)
        if params == ["endpoint_id"]:
            subject = method(ENDPOINT)
        elif params == ["endpoint_id", "action_id"]:
            subject = method(ENDPOINT, ACTION_ID)
        else:
            continue
        if name not in _SUBJECT_BASES:
            found[name] = subject
    return found


def test_the_permission_matrix_names_every_subject_of_the_grammar() -> None:
    names = set(_endpoint_subjects())
    assert names == WORKER_PUBLISHES | WORKER_SUBSCRIBES | GATEWAY_PUBLISHES | WORK_SUBJECTS


@pytest.fixture
def compose_nats(tmp_path: Path) -> Iterator[str]:
    yield from run_compose_nats(tmp_path)


def run_compose_nats(tmp_path: Path, edit: Callable[[str], str] | None = None) -> Iterator[str]:
    """compose/nats/nats.conf on free local ports (`edit` may add to it first, e.g. a
    second worker pool made from the config's own template)."""
    # The shipped config sets `sync_interval` (nats-server 2.10 on) and the project refuses
    # releases before MINIMUM_NATS_SERVER: PATH's server may be older (Debian: 2.9.10).
    binary = find_nats_server_at_least(MINIMUM_NATS_SERVER)
    if binary is None:
        minimum = ".".join(map(str, MINIMUM_NATS_SERVER))
        service_unavailable(f"no nats-server at or above {minimum} to run compose/nats/nats.conf")
    port, http_port = free_ports(2)
    conf = (COMPOSE / "nats" / "nats.conf").read_text(encoding="utf-8")
    if edit is not None:
        conf = edit(conf)
    conf = conf.replace("http_port: 8222", f"http_port: {http_port}")
    conf = conf.replace("port: 4222", f"port: {port}")
    conf = conf.replace('"/data/jetstream"', f'"{tmp_path / "js"}"')
    conf = conf.replace("server_name: aip-nats-1", "server_name: aip-nats-1\nhost: 127.0.0.1")
    path = tmp_path / "nats.conf"
    path.write_text(conf, encoding="utf-8")
    check = subprocess.run([binary, "-t", "-c", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + check.stdout
    with (tmp_path / "nats.log").open("wb") as log:
        proc = subprocess.Popen([binary, "-c", str(path)], stdout=log, stderr=log)
    try:
        wait_until(lambda: port_accepts(port), timeout=10, what="compose nats-server")
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


#: Each compose NATS user's reply-inbox prefix: the one it may subscribe to (nats.conf), as
#: docker-compose.yml sets AIPD_NATS_INBOX_PREFIX for its services.
INBOX_PREFIXES = {
    "nats_admin.nk": "_INBOX_admin",
    "nats_gateway.nk": "_INBOX_gateway",
    "nats_worker.nk": "_INBOX_worker_hermes-1",
}


def test_every_role_has_an_inbox_prefix_of_its_own() -> None:
    """Each service connects with the prefix its NATS user alone may subscribe to, and no
    user may subscribe to `_INBOX.>` (issue 24: pull deliveries travel on inboxes)."""
    doc = _compose()
    services = doc["services"]
    prefixes = {
        "nats_worker.nk": doc["x-worker-env"]["AIPD_NATS_INBOX_PREFIX"],
        "nats_gateway.nk": doc["x-gateway-env"]["AIPD_NATS_INBOX_PREFIX"],
        "nats_admin.nk": services["provision"]["environment"]["AIPD_NATS_INBOX_PREFIX"],
    }
    assert prefixes == INBOX_PREFIXES
    assert services["approver"]["environment"]["AIPD_NATS_INBOX_PREFIX"] == "_INBOX_gateway"
    conf = (COMPOSE / "nats" / "nats.conf").read_text(encoding="utf-8")
    assert '"_INBOX.>"' not in conf
    for prefix in INBOX_PREFIXES.values():
        assert conf.count(f'"{prefix}.>"') == 1, prefix


class _Client:
    """A NATS connection as one compose user, recording permission violations."""

    def __init__(self) -> None:
        self.nc: NATS | None = None
        self.errors: list[str] = []

    async def connect(self, url: str, seed: str) -> None:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc).lower())

        self.nc = await nats.connect(
            url, nkeys_seed=str(COMPOSE / "secrets" / seed), error_cb=on_error,
            allow_reconnect=False, inbox_prefix=INBOX_PREFIXES[seed],
        )

    async def refused(self, subject: str, action: str) -> bool:
        """Whether the server refused `action` ("publish"/"subscribe") on `subject`."""
        assert self.nc is not None
        before = len(self.errors)
        if action == "publish":
            await self.nc.publish(subject, b"{}")
        else:
            sub = await self.nc.subscribe(subject)
        await self.nc.flush(timeout=2)
        await asyncio.sleep(0.05)
        if action == "subscribe":
            await sub.unsubscribe()
        verb = "publish" if action == "publish" else "subscription"
        return any(subject in err and verb in err for err in self.errors[before:])


@pytest.fixture
async def users(compose_nats: str) -> AsyncIterator[dict[str, _Client]]:
    clients = {"worker": _Client(), "gateway": _Client()}
    await clients["worker"].connect(compose_nats, "nats_worker.nk")
    await clients["gateway"].connect(compose_nats, "nats_gateway.nk")
    try:
        yield clients
    finally:
        for client in clients.values():
            if client.nc is not None:
                await client.nc.close()


async def test_workers_may_publish_only_their_outputs_and_never_an_action(
    users: dict[str, _Client],
) -> None:
    for name, subject in _endpoint_subjects().items():
        refused = await users["worker"].refused(subject, "publish")
        assert refused is (name not in WORKER_PUBLISHES), f"worker publish {subject}"


async def test_workers_may_subscribe_to_their_inputs(users: dict[str, _Client]) -> None:
    for name, subject in _endpoint_subjects().items():
        refused = await users["worker"].refused(subject, "subscribe")
        assert refused is (name not in WORKER_SUBSCRIBES), f"worker subscribe {subject}"


async def test_only_the_gateway_publishes_actions_and_it_cannot_forge_results(
    users: dict[str, _Client],
) -> None:
    for name, subject in _endpoint_subjects().items():
        refused = await users["gateway"].refused(subject, "publish")
        assert refused is (name not in GATEWAY_PUBLISHES), f"gateway publish {subject}"


async def test_only_the_gateway_writes_the_runtime_records_the_resolver_trusts(
    users: dict[str, _Client],
) -> None:
    subjects = Subjects()
    for subject in (subjects.runtime_queue(ACTION_ID), subjects.runtime_lifecycle(ACTION_ID)):
        assert await users["worker"].refused(subject, "publish"), f"worker publish {subject}"
        assert not await users["gateway"].refused(subject, "publish"), f"gateway {subject}"


async def test_the_admin_provisions_and_the_worker_uses_jetstream(compose_nats: str) -> None:
    from subjects.provision import Change, provision
    from subjects.streams import StreamPolicy

    secrets = COMPOSE / "secrets"
    admin = await nats.connect(
        compose_nats, nkeys_seed=str(secrets / "nats_admin.nk"), inbox_prefix="_INBOX_admin"
    )
    nc = await nats.connect(
        compose_nats,
        nkeys_seed=str(secrets / "nats_worker.nk"),
        inbox_prefix="_INBOX_worker_hermes-1",
    )
    try:
        report = await provision(admin.jetstream(), Subjects(), [ENDPOINT], StreamPolicy())
        assert {item.change for item in report} == {Change.CREATED}
        ack = await nc.jetstream().publish(Subjects().results(ENDPOINT, ACTION_ID), b"{}")
        assert ack.stream == "AIP_HERMES_RESULTS"
    finally:
        await nc.close()
        await admin.close()


def test_nats_runs_with_the_durability_settings(tmp_path: Path) -> None:
    """The shipped nats.conf, run, as its server reports it on `/varz`: JetStream fsyncs
    every write before acknowledging it (`sync_interval: always`, issue 27 item 3), and the
    server is a release at or above the project's minimum. Without the setting the server
    reports no `sync_always` (its default fsyncs every two minutes)."""
    (http_port,) = free_ports(1)
    started = run_compose_nats(
        tmp_path, lambda conf: conf.replace("http_port: 8222", f"http_port: {http_port}")
    )
    next(started)
    try:
        varz = httpx.get(f"http://127.0.0.1:{http_port}/varz", timeout=10).json()
    finally:
        started.close()
    assert varz["jetstream"]["config"].get("sync_always") is True, varz["jetstream"]["config"]
    major, minor, patch = (int(part) for part in varz["version"].split("-")[0].split("."))
    assert (major, minor, patch) >= MINIMUM_NATS_SERVER, varz["version"]


# --- Redis: the compose config, run ------------------------------------------------------


@pytest.fixture
def compose_redis(tmp_path: Path) -> Iterator[int]:
    yield from _compose_redis(tmp_path)


def _compose_redis(tmp_path: Path) -> Iterator[int]:
    binary = find_redis_server()
    if binary is None:
        service_unavailable("no redis-server to run compose/redis/redis.conf with")
    (port,) = free_ports(1)
    (tmp_path / "data").mkdir(exist_ok=True)
    conf = (COMPOSE / "redis" / "redis.conf").read_text(encoding="utf-8")
    for directive, value in (
        ("port", str(port)),
        ("dir", str(tmp_path / "data")),
        ("aclfile", str(COMPOSE / "redis" / "users.acl")),
    ):
        conf, count = re.subn(rf"(?m)^{directive} .*$", f"{directive} {value}", conf)
        assert count == 1, directive
    path = tmp_path / "redis.conf"
    path.write_text(conf + "bind 127.0.0.1\n", encoding="utf-8")
    with (tmp_path / "redis.log").open("wb") as log:
        proc = subprocess.Popen([binary, str(path)], stdout=log, stderr=log)
    try:
        wait_until(lambda: _pings(port), timeout=10, what="compose redis-server")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _pings(port: int) -> bool:
    client = redis.Redis(port=port, username="healthcheck", password="any", socket_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def test_redis_runs_with_the_durability_settings(compose_redis: int) -> None:
    admin = redis.Redis(
        port=compose_redis, username="admin", password=_secret("redis_admin_password"),
        decode_responses=True,
    )
    try:
        config = {**admin.config_get("appendonly"), **admin.config_get("appendfsync"),
                  **admin.config_get("maxmemory-policy"), **admin.config_get("save")}
    finally:
        admin.close()
    assert config == {
        "appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction", "save": "",
    }


def test_the_compose_health_check_command_works(compose_redis: int) -> None:
    server = find_redis_server()
    cli = find_redis_cli(server) if server is not None else None
    if cli is None:
        service_unavailable("no redis-cli to run the compose health check with")
    test = _compose()["services"]["redis"]["healthcheck"]["test"]
    argv = [cli, "-p", str(compose_redis), *test[2:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    assert done.stdout.strip() == "PONG", done.stdout + done.stderr
    default_user = redis.Redis(port=compose_redis)
    with pytest.raises(redis.AuthenticationError):
        default_user.ping()
    default_user.close()


async def test_the_worker_acl_runs_the_lease_scripts_and_nothing_else(compose_redis: int) -> None:
    client = redis.asyncio.Redis(
        port=compose_redis, username="aipworker", password=_secret("redis_worker_password")
    )
    try:
        store = LeaseStore(client)
        keys = ActionKeys.of(ACTION_ID)
        grant = await store.acquire(keys, "w1#1", 5_000, "f" * 64)
        assert grant.status is AcquireStatus.ACQUIRED
        assert await store.settle(keys, "w1#1", grant.fence, b'{"ok":true}', b'{}')
        # Approvals are the approver user's to write (tests/compose/test_redis_roles.py).
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.set("aip:approvals:{" + ACTION_ID + "}", "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.set("some:other:key", "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.flushall()
    finally:
        await client.aclose()


async def test_what_the_worker_wrote_survives_a_restart_of_the_compose_redis(
    tmp_path: Path,
) -> None:
    """Redis replays the AOF as the `default` user: with a permission-less default user every
    script's MULTI/EXEC fails on load and a restart loses every lease and result. This ran
    for the first time when the compose deployment did (tests/compose/test_compose_up.py)."""
    keys = ActionKeys.of(ACTION_ID)
    password = _secret("redis_worker_password")
    started = _compose_redis(tmp_path)
    port = next(started)
    client = redis.asyncio.Redis(port=port, username="aipworker", password=password)
    try:
        store = LeaseStore(client)
        grant = await store.acquire(keys, "w1#1", 60_000, "f" * 64)
        assert await store.settle(keys, "w1#1", grant.fence, b'{"ok":true}', b'{}')
    finally:
        await client.aclose()
        started.close()  # SIGTERM: Redis fsyncs the AOF and exits
    restarted = _compose_redis(tmp_path)
    port = next(restarted)
    client = redis.asyncio.Redis(port=port, username="aipworker", password=password)
    try:
        assert await client.get(keys.result) == b'{"ok":true}'
        assert await client.hget(keys.lease, "fence") == str(grant.fence).encode()
    finally:
        await client.aclose()
        restarted.close()
    assert "NOPERM" not in (tmp_path / "redis.log").read_text(errors="replace")
