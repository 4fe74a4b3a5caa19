"""The connector host's lifecycle with a GetAIP central: register, heartbeat, drain,
offline (aip-1.0-wire.md §3.6, "Host lifecycle").

Every call is one `POST {AIPD_AIP_CENTRAL_URL}/aip/v1/connector-control` of a signed JSON
request (not an Envelope): `{"request": {request_id, issued_at, expires_at, signer_did,
command: {operation, payload}}, "signature": …}`, the signature over the canonical JSON of
`request` by the gateway key (`did:key`). The answer `{"response": {request_id, issued_at,
expires_at, signer_did, outcome}, "signature": …}` counts only when it names the same
request id, is signed by `AIPD_AIP_CENTRAL_DID`, and is inside its window (TTL at most
30 s, 5 s skew); its outcome is a `lease` (`{sequence, expires_at}`), `offline`, or
`rejected{code, message, retryable}`.

Why a lease gates Actions: the central routes to a replica only while its lease is live,
so a host whose lease lapsed (central unreachable, or told offline) must not take work the
central may already have given to another replica. Without a central URL there is no
lease and readiness is the host's own (not draining).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any, Final

import httpx

from worker.aip.canonical import loads
from worker.aip.envelope import format_timestamp
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner, sign_value, verify_value
from worker.errors import ControlFailed
from worker.gateway.settings import GatewaySettings
from worker.wire.envelopes import new_message_id, timestamp_ms

log = logging.getLogger(__name__)

CONTROL_PATH: Final = "/aip/v1/connector-control"
CALLBACKS_PATH: Final = "/aip/v1/connector-callbacks"
HTTP_PROFILE: Final = "aip.native.http.v1"
#: The reference's control request lifetime and clock skew.
CONTROL_TTL_MS: Final = 30_000
CONTROL_SKEW_MS: Final = 5_000
#: The reference's bound on one control request or response.
MAX_CONTROL_BYTES: Final = 64 * 1024
REQUEST_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class Lease:
    """What the central granted: its health sequence and when the lease ends."""

    sequence: int
    expires_at_ms: int

    def valid(self, now_ms: int | None = None) -> bool:
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return now < self.expires_at_ms


def artifact_digest() -> str:
    """What this host reports as its artifact: a digest of the package and its version
    (the central compares it with what it admitted; an image digest is the deployer's to
    set as the version id)."""
    name = f"aip-hermes-worker {version('aip-hermes-worker')}"
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


class ConnectorControl:
    """The host's control-plane client and its current lease."""

    def __init__(
        self,
        settings: GatewaySettings,
        signer: AipSigner,
        principal: dict[str, str],
        *,
        in_flight: Callable[[], int],
        manifest_facts: Callable[[], Awaitable[tuple[str, int]]],
        healthy: Callable[[], bool],
    ) -> None:
        assert settings.aip_central_url is not None
        assert settings.aip_central_did is not None
        self.settings = settings
        self.signer = signer
        self.principal = principal
        self.url = settings.aip_central_url.rstrip("/") + CONTROL_PATH
        self.central_did = settings.aip_central_did
        self.replica_id = settings.aip_host_replica_id or settings.gateway_id
        self._in_flight = in_flight
        self._manifest_facts = manifest_facts
        self._healthy = healthy
        self.lease: Lease | None = None
        self._client = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, follow_redirects=False)
        self._task: asyncio.Task[None] | None = None

    def lease_valid(self) -> bool:
        return self.lease is not None and self.lease.valid()

    def start(self) -> None:
        """Register, then heartbeat every interval (registering again while unleased)."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        interval = self.settings.aip_host_heartbeat_interval_ms / 1000
        while True:
            try:
                if self.lease is None:
                    await self.register()
                else:
                    await self.heartbeat()
            except ControlFailed as exc:
                log.warning("connector-control: %s", exc)
            except Exception:  # the loop outlives any one failure: the next beat retries
                log.exception("connector-control failed unexpectedly")
            await asyncio.sleep(interval)

    async def stop_heartbeats(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        await self.stop_heartbeats()
        await self._client.aclose()

    # --- the four operations --------------------------------------------------------------

    async def register(self) -> None:
        try:
            digest, count = await self._manifest_facts()
        except Exception as exc:  # no worker answered yet: register on a later beat
            raise ControlFailed(f"register: the pool's manifest is not readable ({exc})") from None
        settings = self.settings
        now = datetime.now(UTC)
        replica = {
            "id": self.replica_id,
            "instance_id": settings.aip_host_instance_id,
            "version_id": settings.aip_host_version_id,
            "endpoint": settings.aip_host_public_url,
            "peer_principal_id": self.principal["id"],
            "peer_principal_kind": self.principal["kind"],
            "peer_did": self.signer.did,
            "trust_domain": settings.aip_trust_domain,
            "transport_profile": HTTP_PROFILE,
            "status": "offline",
            "lease_expires_at": format_timestamp(now),
            "capacity": settings.aip_host_max_in_flight,
            "active_assignments": 0,
            "health_revision": 0,
        }
        payload = {
            "replica": replica,
            "manifest_digest": digest,
            "artifact_digest": artifact_digest(),
            "tenant_id": settings.aip_host_tenant_id,
            "config_revision": 1,
            "secret_provider_ref": "none",
            "capability_count": count,
        }
        await self._lease_from("register", payload)

    async def heartbeat(self) -> None:
        payload = {
            "replica_id": self.replica_id,
            "previous_sequence": self.lease.sequence if self.lease else 0,
            "in_flight": self._in_flight(),
            "connector_ready": self._healthy(),
        }
        await self._lease_from("heartbeat", payload)

    async def drain(self) -> None:
        await self._lease_from("drain", self._transition())

    async def offline(self) -> None:
        outcome = await self._invoke("offline", self._transition())
        if outcome.get("status") not in ("offline", "lease"):
            raise ControlFailed(f"offline answered {str(outcome.get('status'))[:40]}")
        self.lease = None

    def _transition(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "previous_sequence": self.lease.sequence if self.lease else 0,
        }

    async def _lease_from(self, operation: str, payload: dict[str, Any]) -> None:
        outcome = await self._invoke(operation, payload)
        status = outcome.get("status")
        if status == "lease":
            lease = outcome.get("lease")
            try:
                assert isinstance(lease, dict)
                self.lease = Lease(
                    sequence=int(lease["sequence"]),
                    expires_at_ms=timestamp_ms(str(lease["expires_at"])),
                )
            except (AssertionError, KeyError, TypeError, ValueError, AipWireError):
                raise ControlFailed(f"{operation}: the lease is malformed") from None
            return
        self.lease = None
        if status == "offline":
            raise ControlFailed(f"{operation}: the central says this replica is offline")
        raise ControlFailed(
            f"{operation} rejected: {str(outcome.get('code'))[:80]} "
            f"({str(outcome.get('message'))[:200]})"
        )

    # --- the signed exchange --------------------------------------------------------------

    async def _invoke(self, operation: str, payload: dict[str, Any]) -> dict[str, Any]:
        now = datetime.now(UTC)
        request_id = new_message_id()
        request = {
            "request_id": request_id,
            "issued_at": format_timestamp(now),
            "expires_at": format_timestamp(now + timedelta(milliseconds=CONTROL_TTL_MS)),
            "signer_did": self.signer.did,
            "command": {"operation": operation, "payload": payload},
        }
        body = {"request": request, "signature": sign_value(request, self.signer)}
        try:
            answer = await self._client.post(self.url, json=body)
        except httpx.HTTPError as exc:
            raise ControlFailed(f"{operation}: {type(exc).__name__} from the central") from None
        if len(answer.content) > MAX_CONTROL_BYTES:
            raise ControlFailed(f"{operation}: the answer is over {MAX_CONTROL_BYTES} bytes")
        return self._outcome(operation, request_id, answer.content)

    def _outcome(self, operation: str, request_id: str, data: bytes) -> dict[str, Any]:
        """The outcome of a signed answer to `request_id`; ControlFailed for anything the
        central did not sign, or signed for another request or time."""
        try:
            document = loads(data)
            response = document["response"]
            verify_value(response, document["signature"], self.central_did)
            issued = timestamp_ms(response["issued_at"])
            expires = timestamp_ms(response["expires_at"])
        except (AipWireError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlFailed(f"{operation}: not a signed answer ({exc})") from None
        now = time.time_ns() // 1_000_000
        if response.get("request_id") != request_id:
            raise ControlFailed(f"{operation}: the answer is for another request")
        if response.get("signer_did") != self.central_did:
            raise ControlFailed(f"{operation}: the answer's signer is not the central")
        if not (
            issued - CONTROL_SKEW_MS <= now <= expires + CONTROL_SKEW_MS
            and 0 <= expires - issued <= CONTROL_TTL_MS
        ):
            raise ControlFailed(f"{operation}: the answer is outside its window")
        outcome = response.get("outcome")
        if not isinstance(outcome, dict):
            raise ControlFailed(f"{operation}: the answer has no outcome")
        return outcome
