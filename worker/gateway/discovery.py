"""What the bus serves: every worker's manifest, found through NATS micro `$SRV` discovery.

Workers register the micro service `aip-hermes-worker` with one `manifest-{endpoint}`
endpoint per Hermes endpoint they serve. `$SRV.INFO.aip-hermes-worker` is answered by every
worker, so the union of the subjects they list is what the bus serves right now; each
distinct manifest subject is then asked once (any worker serving that endpoint answers).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from nats.aio.client import Client as NATS

from worker.control import SERVICE_NAME

log = logging.getLogger(__name__)

#: How long INFO replies are collected (workers answer within milliseconds on a LAN).
COLLECT_S = 0.5
MANIFEST_TIMEOUT_S = 3.0


class Discovery:
    def __init__(self, nc: NATS) -> None:
        self.nc = nc

    async def manifest_subjects(self) -> list[str]:
        inbox = self.nc.new_inbox()
        replies: list[bytes] = []
        sub = await self.nc.subscribe(inbox)
        try:
            await self.nc.publish(f"$SRV.INFO.{SERVICE_NAME}", b"", reply=inbox)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + COLLECT_S
            while (remaining := deadline - loop.time()) > 0:
                try:
                    msg = await sub.next_msg(timeout=remaining)
                except TimeoutError:
                    break
                except Exception:  # nats' own timeout type
                    break
                replies.append(msg.data)
        finally:
            await sub.unsubscribe()
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
        """The manifest one endpoint's workers answer on `subject`; None when none answers
        (no worker up, or a route to an executor that serves no manifest)."""
        try:
            reply = await self.nc.request(subject, b"", timeout=MANIFEST_TIMEOUT_S)
            manifest = json.loads(reply.data)
        except Exception as exc:  # no responders, a timeout, or not JSON
            log.info("manifest %s not read: %s", subject, type(exc).__name__)
            return None
        return manifest if isinstance(manifest, dict) else None

    async def manifests(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for subject in await self.manifest_subjects():
            try:
                reply = await self.nc.request(subject, b"", timeout=MANIFEST_TIMEOUT_S)
                manifest = json.loads(reply.data)
            except Exception as exc:  # a worker gone between INFO and the request
                log.info("manifest %s not read: %s", subject, type(exc).__name__)
                continue
            if isinstance(manifest, dict):
                found.append(manifest)
        return found
