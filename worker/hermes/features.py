"""What an endpoint's Hermes advertises beyond 0.19, read from `GET /v1/capabilities`.

Hermes 0.19 answers `POST /v1/runs` without any idempotency: a start whose reply was lost
can only be settled `operator_outcome_unknown` (worker/operator/start.py). Later upstream
Hermes versions keep a durable `Idempotency-Key` -> run map for `POST /v1/runs` (a replay
with the same key and body answers the original run; the same key with another body is a
409 `idempotency_key_conflict`) and say so in the capabilities document's `features` table
as `runs_idempotency: true`. Only that advertisement turns the worker's keyed start on; a
Hermes that does not say it (0.19 included) keeps today's path byte for byte.

The flag is read by `worker/hermes/feature_probe.py` (at start-up, at every serving probe,
and again right before a takeover re-sends a start) into `HermesClient.features`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The `features` key of a Hermes whose `POST /v1/runs` honours a durable Idempotency-Key.
RUNS_IDEMPOTENCY = "runs_idempotency"


@dataclass(frozen=True, slots=True)
class HermesFeatures:
    """The post-0.19 behaviours one endpoint advertised; all off for Hermes 0.19."""

    #: `POST /v1/runs` honours a durable `Idempotency-Key`.
    runs_idempotency: bool = False


#: What a Hermes that advertised nothing (0.19, or not read yet) gets.
NO_FEATURES = HermesFeatures()


def features_of(document: Any) -> HermesFeatures:
    """The features a capabilities document advertises; anything but a literal `true` is
    off, so a malformed document can only keep the 0.19 path."""
    table = document.get("features") if isinstance(document, dict) else None
    if not isinstance(table, dict):
        return NO_FEATURES
    return HermesFeatures(runs_idempotency=table.get(RUNS_IDEMPOTENCY) is True)
