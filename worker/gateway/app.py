"""The gateway process: connect, build every part, serve MCP and health, sweep, stop cleanly.

`aip-hermes-worker gateway` runs `Gateway(settings).run_until_signalled()`. Tests start the
same class in-process when they need to wrap its store writer (fault injection), and as
`python -m worker gateway` subprocesses when they need to kill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from typing import Any

import nacl.signing
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from subjects.grammar import Subjects
from worker.dependencies import GATEWAY_PORT_SETTINGS
from worker.errors import TrustConfigError
from worker.gateway.children import Children
from worker.gateway.connector_host import ConnectorHost, HostAnswers
from worker.gateway.delegation_route import DelegationRouteResponder, FirstSight
from worker.gateway.discovery import Discovery
from worker.gateway.host_approvals import HostApprovalImports
from worker.gateway.mcp_app import MCP_PATH, GatewayHttp
from worker.gateway.native_nats import NativeNatsResponder
from worker.gateway.native_trust import MessageClaims, TrustedSigners
from worker.gateway.observe import GatewayMetrics, ToolReceipts
from worker.gateway.principals import Principals
from worker.gateway.records import RuntimeStoreReader, RuntimeStoreWriter
from worker.gateway.recovery import Recovery
from worker.gateway.routes import RouteTable
from worker.gateway.service import GatewayService
from worker.gateway.settings import GatewaySettings
from worker.http_serving import Served
from worker.tasks import stop_tasks
from worker.trust.signing import TrustedGatewayKeys, decode_user_public_key, read_seed_file

log = logging.getLogger(__name__)

#: What a test waits for in the gateway's log before it calls it.
READY_MARK = "gateway serving"
_SHUTDOWN_TIMEOUT_S = 10.0

WriterFactory = Callable[[JetStreamContext, Subjects, bytes], RuntimeStoreWriter]


def _own_key(seed: bytes) -> TrustedGatewayKeys:
    """The records this gateway reads are the ones gateways sharing its key wrote."""
    import nkeys

    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    return TrustedGatewayKeys({public: nacl.signing.VerifyKey(decode_user_public_key(public))})


def _trusted_worker_keys(settings: GatewaySettings) -> TrustedGatewayKeys | None:
    """The keys a child's result must be signed with; a bad file refuses the start, and so
    does no file at all unless `AIPD_ALLOW_UNSIGNED_RESPONSES` says this is development:
    without them anyone who may publish on a results subject answers for a child, and the
    gateway would sign that answer into the record the delegation resolver believes."""
    path = settings.trusted_worker_keys_file
    if path is None:
        if not settings.allow_unsigned_responses:
            raise TrustConfigError(
                "AIPD_TRUSTED_WORKER_KEYS_FILE is not set: the gateway cannot tell a "
                "worker's result from a forged one (set it to the workers' public keys, or "
                "AIPD_ALLOW_UNSIGNED_RESPONSES=true in development)"
            )
        log.warning(
            "AIPD_TRUSTED_WORKER_KEYS_FILE is not set and AIPD_ALLOW_UNSIGNED_RESPONSES is: "
            "child results are recorded without verifying the worker's signature, so anyone "
            "who may publish on a results subject can answer for a child (development only)"
        )
        return None
    return TrustedGatewayKeys.load(path, what="trusted worker keys file")


async def connect_nats(settings: GatewaySettings) -> NATS:
    """The gateway's connection: the worker's (`worker.bus.connections.connect_nats`: the
    same `AIPD_NATS_*` credential files, reconnecting forever, a lost NATS told once per
    cause with its URL), under the gateway's own name and inbox prefix."""
    from worker.bus.connections import connect_nats as connect
    from worker.settings import Settings

    as_worker = Settings(nats_url=settings.nats_url, nats_inbox_prefix=settings.nats_inbox_prefix)
    return await connect(as_worker, name="aip-hermes-gateway")


class Gateway:
    def __init__(
        self, settings: GatewaySettings, *, make_writer: WriterFactory = RuntimeStoreWriter
    ) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self.metrics = GatewayMetrics()
        self._make_writer = make_writer
        self.nc: NATS | None = None
        self.service: GatewayService | None = None
        self.writer: RuntimeStoreWriter | None = None
        self._served: Served | None = None
        self._recovery: asyncio.Task[None] | None = None
        self.native: NativeNatsResponder | None = None
        self.delegation_route: DelegationRouteResponder | None = None
        self.host: ConnectorHost | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint, as Hermes' `mcp_servers.<name>.url` wants it."""
        return f"http://{self.settings.gateway_host}:{self.port}{MCP_PATH}"

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.gateway_host}:{self.port}"

    async def start(self) -> None:
        settings = self.settings
        # Configuration first: a bad file stops the gateway before it touches the bus.
        principals = Principals.load(settings.mcp_principals_file)
        seed = read_seed_file(settings.gateway_signing_key_file)
        routes = RouteTable.from_setting(settings.subject_prefix, settings.capability_routes)
        worker_keys = _trusted_worker_keys(settings)
        signers = (
            TrustedSigners.load(settings.aip_trusted_signers_file)
            if settings.aip_trusted_signers_file is not None
            else None
        )
        if settings.aip_delegation_subject is not None and signers is None:
            raise TrustConfigError(
                "AIPD_AIP_DELEGATION_SUBJECT is set without AIPD_AIP_TRUSTED_SIGNERS_FILE: the "
                "delegation route answers only the signers that file trusts"
            )
        self.nc = nc = await connect_nats(settings)
        js = nc.jetstream()
        self.writer = writer = self._make_writer(js, self.subjects, seed)
        await writer.provision()
        reader = RuntimeStoreReader(js, self.subjects, _own_key(seed))
        children = Children(nc, writer, seed, trusted_worker_keys=worker_keys, metrics=self.metrics)
        self.service = service = GatewayService(
            settings, nc, routes, reader, children, Discovery(nc, worker_keys)
        )
        claims = await MessageClaims.open(js) if signers is not None else None
        if signers is not None and claims is not None and settings.aip_host_instance_id:
            # One claims bucket for both bindings: a message id is heard once, whichever
            # binding carried it.
            self.host = ConnectorHost(
                HostAnswers(
                    settings,
                    service,
                    signers,
                    claims,
                    children.signer,
                    approvals=await HostApprovalImports.open(js),
                    healthy=lambda: nc.is_connected,
                )
            )
        http = GatewayHttp(
            settings,
            principals,
            routes,
            service,
            self.metrics,
            ToolReceipts(nc, self.subjects, settings.gateway_id, seed=seed),
            self.ready,
            self.host,
        )
        recovery = Recovery(settings, children, reader, routes, self.metrics)
        self._recovery = asyncio.get_running_loop().create_task(recovery.run())
        if signers is not None and claims is not None:
            self.native = NativeNatsResponder(
                settings, nc, service, signers, claims, children.signer
            )
            await self.native.start()
        if signers is not None and settings.aip_delegation_subject is not None:
            self.delegation_route = DelegationRouteResponder(
                settings,
                nc,
                service,
                signers,
                claims if claims is not None else await MessageClaims.open(js),
                children.signer,
                worker_keys=worker_keys,
                first=await FirstSight.open(js),
            )
            await self.delegation_route.start()
        await self._serve(http)
        if self.host is not None:
            self.host.start()
        log.info(
            "%s on %s (%d principals, routes %s)",
            READY_MARK,
            self.url,
            len(principals),
            routes.describe(),
        )

    async def _serve(self, http: GatewayHttp) -> None:
        self._served = served = await Served.start(
            http.app(),
            host=self.settings.gateway_host,
            port=self.settings.gateway_port,
            backlog=self.settings.gateway_backlog,
            port_settings=GATEWAY_PORT_SETTINGS,
            lifespan="on",
            # Past this many connections at once a request gets 503 at once (docs/scaling.md,
            # "Gateway"), and the kernel queues up to the backlog before accept.
            limit_concurrency=self.settings.gateway_max_connections,
        )
        self.port = served.port

    async def ready(self) -> dict[str, Any]:
        """`/ready`: NATS connected, both runtime stores present, and a connector host (when
        served) not draining and leased."""
        nc = self.nc
        connected = nc is not None and nc.is_connected
        stores = False
        if connected and nc is not None:
            try:
                js = nc.jetstream()
                for kind in ("queue", "lifecycle"):
                    await asyncio.wait_for(
                        js.stream_info(self.subjects.runtime_stream_name(kind)), 1.0
                    )
                stores = True
            except (NotFoundError, TimeoutError, Exception):
                stores = False
        checks = {"nats_connected": connected, "runtime_stores": stores}
        if self.host is not None:
            checks["connector_host"] = self.host.ready()
        return {"ready": all(checks.values()), "checks": checks}

    async def stop(self) -> None:
        if self.host is not None:
            # Draining first, while the port still answers: new Actions are refused
            # `connector_host.not_ready` and the running ones end (docs/aip.md).
            await self.host.drain()
        if self._recovery is not None:
            await stop_tasks([self._recovery], _SHUTDOWN_TIMEOUT_S)
            self._recovery = None
        for responder in (self.native, self.delegation_route):
            if responder is not None:
                await responder.stop()
        self.native = self.delegation_route = None
        served, self._served = self._served, None
        if served is not None:
            await served.stop(_SHUTDOWN_TIMEOUT_S)
        if self.host is not None:
            await self.host.stop()
            self.host = None
        if self.service is not None:
            await self.service.stop()
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.drain()
            self.nc = None

    async def __aenter__(self) -> Gateway:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run_until_signalled(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with self:
            await stop.wait()
            log.info("gateway stopping")
