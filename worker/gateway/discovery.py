"""What the bus serves: every worker's manifest, found through NATS micro `$SRV` discovery.

Workers register the micro service `aip-hermes-worker` with one `manifest-{endpoint}`
endpoint per Hermes endpoint they serve. `$SRV.INFO.aip-hermes-worker` is answered by every
worker, so the union of the subjects they list is what the bus serves right now; each
distinct manifest subject is then asked once (any worker serving that endpoint answers)
with an AIP `manifest_request` Envelope; the answer is a `manifest_response` Envelope whose
signature must be a trusted worker key's when the gateway has worker keys (an answer that is
not is skipped, as a worker that did not answer).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from nats.aio.client import Client as NATS

from schemas.errors import EnvelopeRejected
from worker.control import gather_replies
from worker.errors import UnverifiedResponse
from worker.trust.responses import check_worker_signed
from worker.trust.signing import TrustedGatewayKeys
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.manifests import decode_manifest_response, encode_manifest_request

log = logging.getLogger(__name__)

#: How long INFO replies are collected (workers answer within milliseconds on a LAN).
COLLECT_S = 0.5
MANIFEST_TIMEOUT_S = 3.0


class Discovery:
    def __init__(self, nc: NATS, trusted_worker_keys: TrustedGatewayKeys | None = None) -> None:
        self.nc = nc
        #: None (development only): any well-formed manifest answer is believed.
        self.trusted_worker_keys = trusted_worker_keys

    async def manifest_subjects(self) -> list[str]:
        replies = await gather_replies(self.nc, "INFO", wait_s=COLLECT_S)
        subjects: set[str] = set()
        for data in replies:
            try:
                info = json.loads(data)
            except ValueError:
                continue
            for endpoint in info.get("endpoints") or []:
                name, subject = endpoint.get("name", ""), endpoint.get("subject")
                if isinstance(name, str) and name.startswith("manifest-") and subject:
                    subjects.add(str(subject))
        return sorted(subjects)

    async def manifest(self, subject: str) -> dict[str, Any] | None:
        """The AIP manifest one endpoint's workers answer on `subject`; None when none
        answers (no worker up, or a route to an executor that serves no manifest) or the
        answer is not a manifest a trusted worker signed."""
        try:
            reply = await self.nc.request(
                subject,
                encode_manifest_request(sender=GATEWAY_SENDER, signer=None),
                timeout=MANIFEST_TIMEOUT_S,
            )
            _, opened = decode_manifest_response(reply.data)
            if self.trusted_worker_keys is not None:
                check_worker_signed(opened, self.trusted_worker_keys, what="manifest")
        except (EnvelopeRejected, UnverifiedResponse) as exc:
            log.warning("manifest %s refused: %s", subject, exc)
            return None
        except Exception as exc:  # no responders, a timeout, a worker gone since INFO
            log.info("manifest %s not read: %s", subject, type(exc).__name__)
            return None
        return dict(opened.payload)

    async def manifests(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for subject in await self.manifest_subjects():
            manifest = await self.manifest(subject)
            if manifest is not None:
                found.append(manifest)
        return found
