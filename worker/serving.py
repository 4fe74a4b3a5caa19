"""Whether this worker can serve an endpoint now: one reason per missing piece, by setting.

A worker that takes an Action it cannot serve does not fail quietly so much as burn it: the
Action is refused (a refused id is used up) or waits out a Hermes that refuses its key, and
in a pool of N one such worker takes 1/N of the traffic for good. So the work consumers are
not even bound while anything here is missing (`worker/bus/consumer.py` asks `ServingGate`
before it binds and before each fetch), `/ready` answers 503 with these reasons
(`worker/health.py`), and the worker goes on serving by itself once the cause is gone.

What is checked:

- at start-up, from the settings (a restart is needed to change them): the worker can sign
  its results (`AIPD_WORKER_SIGNING_KEY_FILE`, or the development flag for unsigned ones),
  verify envelopes (`AIPD_TRUSTED_GATEWAY_KEYS_FILE`, or the flag for unsigned ones) and
  check identities (`AIPD_TRUSTED_IDENTITY_FILE`); without an approval authority file, a
  worker serving governed capabilities only warns (they are refused one by one, as the
  operator docs say);
- for each endpoint, at start and every `AIPD_SERVING_PROBE_INTERVAL_S`: its key file is
  read again (`worker.endpoints.api_key_files`; a key rewritten on disk is used from then on,
  and a file that can no longer be read blocks the endpoint, naming the file), then its
  Hermes accepts
  the configured key on the protected `GET /v1/models` (no key and a 401/403 block the
  endpoint; no answer, or a malformed one, is an outage: reported in `/ready`, but the
  endpoint stays served, so each Action gets the spec's typed transport error instead of
  waiting in the queue for as long as Hermes is down). The same probe reads what the
  endpoint's Hermes advertises beyond 0.19 (`worker/hermes/feature_probe.py`).

`AIPD_SERVE_WHEN_UNREADY` (development only) keeps the reasons in `/ready` and the log but
binds the consumers anyway, as the demo did before this gate existed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.endpoints import KeyFile
from worker.errors import ConnectorError, SecretFileError
from worker.hermes.feature_probe import refresh_features
from worker.hermes.http_client import PROBE_HEADER, HermesClient
from worker.logs import RepeatedErrors
from worker.settings import Settings

log = logging.getLogger(__name__)

#: A key probe that takes longer than this counts as no answer.
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Blocker:
    """One reason this worker cannot serve: which endpoint (None: all) and what to fix."""

    endpoint_id: str | None
    reason: str


def settings_blockers(settings: Settings) -> list[Blocker]:
    """What the settings leave missing; none of these is re-read, so fixing one is a restart."""
    found: list[Blocker] = []
    if settings.worker_signing_key_file is None and not settings.allow_unsigned_responses:
        found.append(Blocker(None, (
            "cannot sign results: AIPD_WORKER_SIGNING_KEY_FILE is not set "
            "(every Action would be refused with connector_host.response_signing)"
        )))
    if settings.trusted_gateway_keys_file is None and not settings.allow_unsigned_envelopes:
        found.append(Blocker(None, (
            "cannot verify envelopes: AIPD_TRUSTED_GATEWAY_KEYS_FILE is not set "
            "(every Action would be dead-lettered, connector_host.authentication)"
        )))
    if settings.trusted_identity_file is None:
        found.append(Blocker(None, (
            "cannot check identities: AIPD_TRUSTED_IDENTITY_FILE is not set "
            "(every Action would be refused, connector_host.authentication)"
        )))
    return found


@dataclass(frozen=True, slots=True)
class KeyProbe:
    """What one key probe found: nothing (`reason` None), an outage, or a refused key."""

    reason: str | None = None
    #: True when serving would burn Actions (no key, a key Hermes refuses): the endpoint's
    #: consumers stay unbound. An outage (no answer, a malformed one) does not block: every
    #: worker sees it alike, and the spec's outage path answers each Action with a typed,
    #: retryable transport error rather than leaving it queued.
    blocks: bool = False


async def probe_key(client: HermesClient) -> KeyProbe:
    """Whether the endpoint's Hermes accepts its key, and if not, what to fix."""
    endpoint = client.endpoint
    if endpoint.api_key is None:
        return KeyProbe((
            f"endpoint {endpoint.id} has no API key (AIPD_HERMES_API_KEY_FILE, "
            "AIPD_HERMES_API_KEY_FILES or api_key_file in AIPD_HERMES_ENDPOINTS_FILE)"
        ), blocks=True)
    unreachable = (
        f"endpoint {endpoint.id}: Hermes at {endpoint.url} did not answer the key probe "
        "(check the endpoint's url in AIPD_HERMES_URL / AIPD_HERMES_ENDPOINTS_FILE)"
    )
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            await client.request_json(
                "GET", "/v1/models", protected=True, total_timeout_s=PROBE_TIMEOUT_S,
                headers={PROBE_HEADER: "key"},
            )
    except ConnectorError as exc:
        if exc.remote_status in (401, 403):
            return KeyProbe((
                f"endpoint {endpoint.id}: Hermes at {endpoint.url} refused the API key "
                f"({exc.remote_status}); check the key file for this endpoint "
                "(AIPD_HERMES_API_KEY_FILE / AIPD_HERMES_API_KEY_FILES) against Hermes' "
                "API_SERVER_KEY"
            ), blocks=True)
        return KeyProbe(f"{unreachable} ({exc.code.value})")
    except TimeoutError:
        return KeyProbe(f"{unreachable} in {PROBE_TIMEOUT_S:.0f} s")
    except Exception as exc:  # a probe reports, it never raises
        return KeyProbe(f"{unreachable} ({type(exc).__name__})")
    return KeyProbe()


class ServingGate:
    """The reasons this worker cannot serve each endpoint, kept fresh by `run()`.

    The pull loops wait on `wait_servable(endpoint)`; `/ready` reads `reasons()`.
    """

    def __init__(
        self,
        static: Sequence[Blocker],
        clients: Mapping[str, HermesClient],
        *,
        interval_s: float,
        serve_anyway: bool = False,
        errors: RepeatedErrors | None = None,
        key_files: Mapping[str, KeyFile] | None = None,
    ) -> None:
        self.static = list(static)
        self.clients = dict(clients)
        #: Endpoint id -> the file its key is read from, re-read before each probe.
        self.key_files = dict(key_files or {})
        self.interval_s = interval_s
        self.serve_anyway = serve_anyway
        self.errors = errors if errors is not None else RepeatedErrors()
        #: Endpoint id -> what its last probe found (absent: not probed yet).
        self._probed: dict[str, KeyProbe] = {}
        self._changed = asyncio.Condition()

    def reasons(self) -> list[str]:
        """Every reason, the worker-wide ones first; empty when everything can be served."""
        found = [b.reason for b in self.static]
        for endpoint_id in self.clients:
            probe = self._probed.get(endpoint_id)
            if probe is None:
                found.append(f"endpoint {endpoint_id}: Hermes not probed yet")
            elif probe.reason is not None:
                found.append(probe.reason)
        return found

    def servable(self, endpoint_id: str) -> bool:
        """True when `endpoint_id` may be served now (or the development flag says so)."""
        if self.serve_anyway:
            return True
        if self.static:
            return False
        probe = self._probed.get(endpoint_id)
        return probe is not None and not probe.blocks

    async def wait_servable(self, endpoint_id: str) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.servable(endpoint_id))

    async def probe_all(self) -> None:
        """Re-read every key file, probe every endpoint once, and wake the loops whose
        verdict changed."""
        results = await asyncio.gather(
            *(self._probe(eid, client) for eid, client in self.clients.items())
        )
        # What each reachable Hermes advertises beyond 0.19 (the keyed start of
        # worker/operator/start.py): read with the key probe, kept when unreadable.
        reachable = [
            client
            for client, probe in zip(self.clients.values(), results, strict=True)
            if not probe.blocks
        ]
        await asyncio.gather(*(refresh_features(client) for client in reachable))
        async with self._changed:
            for endpoint_id, probe in zip(self.clients, results, strict=True):
                before = self._probed.get(endpoint_id)
                self._probed[endpoint_id] = probe
                if probe.reason is not None:
                    self.errors.report(
                        f"serving {endpoint_id}", probe.reason, log,
                        "not serving %s: %s" if probe.blocks else "serving %s in an outage: %s",
                        endpoint_id, probe.reason,
                    )
                elif before is None or before.reason is not None:
                    log.info("endpoint %s: Hermes accepts the API key", endpoint_id)
            self._changed.notify_all()

    async def _probe(self, endpoint_id: str, client: HermesClient) -> KeyProbe:
        unreadable = self._reread_key(endpoint_id, client)
        return unreadable if unreadable is not None else await probe_key(client)

    def _reread_key(self, endpoint_id: str, client: HermesClient) -> KeyProbe | None:
        """Take the key now in the endpoint's key file (the client's next request sends
        it); a file that cannot be read blocks the endpoint, naming the file and the fix,
        and the key read before is not used meanwhile (it is the one being replaced)."""
        source = self.key_files.get(endpoint_id)
        if source is None:
            return None
        try:
            key = source.read()
        except SecretFileError as exc:
            return KeyProbe(f"endpoint {endpoint_id}: {exc}", blocks=True)
        if key != client.endpoint.api_key:
            if client.endpoint.api_key is not None:
                log.info("endpoint %s: a new API key was read from %s", endpoint_id, source.path)
            client.endpoint = client.endpoint.model_copy(update={"api_key": key})
        return None

    def log_static(self) -> None:
        """Say once, at start, what keeps the whole worker from serving."""
        for blocker in self.static:
            log.error("not serving: %s", blocker.reason)
        if self.static and self.serve_anyway:
            log.warning(
                "AIPD_SERVE_WHEN_UNREADY is on: consuming anyway (development only); "
                "these Actions will be refused"
            )

    async def run(self) -> None:
        """Probe now, then every `interval_s`, until cancelled."""
        while True:
            await self.probe_all()
            await asyncio.sleep(self.interval_s)
