"""Read an endpoint's post-0.19 features (`worker/hermes/features.py`) from its Hermes.

Read at start-up and at every serving probe (`worker/serving.py`) into
`HermesClient.features`, and read again right before a takeover re-sends a start
(`worker/operator/start.py`): the re-send is the one step that would duplicate a run if the
endpoint had meanwhile been replaced by a Hermes without the feature, so it never trusts the
cached answer.
"""

from __future__ import annotations

import asyncio

from worker.errors import ConnectorError
from worker.hermes.features import HermesFeatures, features_of
from worker.hermes.http_client import PROBE_HEADER, HermesClient

CAPABILITIES_ROUTE = "/v1/capabilities"
#: The probe header's value on a features read (the fake counts probes apart).
PROBE_VALUE = "features"
#: A capabilities read that takes longer than this counts as no answer.
READ_TIMEOUT_S = 5.0


async def read_features(
    client: HermesClient, timeout_s: float = READ_TIMEOUT_S
) -> HermesFeatures | None:
    """The endpoint's features now, or None when its capabilities could not be read."""
    budget = max(0.1, min(timeout_s, READ_TIMEOUT_S))
    try:
        async with asyncio.timeout(budget):
            response = await client.request_json(
                "GET",
                CAPABILITIES_ROUTE,
                protected=True,
                total_timeout_s=budget,
                headers={PROBE_HEADER: PROBE_VALUE},
            )
    except (ConnectorError, TimeoutError):
        return None
    return features_of(response.body)


async def refresh_features(client: HermesClient) -> HermesFeatures:
    """Read the endpoint's features into `client.features`; an unreadable document keeps
    what was known (a probe reports, it never raises)."""
    found = await read_features(client)
    if found is not None:
        client.features = found
    return client.features
