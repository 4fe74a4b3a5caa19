"""Read-only discovery: health, detailed health, capabilities, models, skills, toolsets.

`health` is the only unprotected route (Hermes answers it without a key), so it is the one
operation that works on an endpoint whose key is missing; everything else is protected.
"""

from __future__ import annotations

from schemas._base import WireStruct
from worker.operations.calls import JsonOperation, no_call
from worker.operations.retry import ReadRetryPolicy
from worker.operations.specs import spec


class NoInput(WireStruct, kw_only=True, frozen=True):
    """An operation that takes no input: `{}` is the only valid input."""


_ROUTES = (
    ("health", "Basic liveness of the endpoint (no key needed)"),
    ("health_detailed", "Readiness checks: state db, model, disk, runs"),
    ("capabilities", "The API server's feature and endpoint table"),
    ("models", "Models the endpoint serves (a protected read)"),
    ("skills", "Skills installed in the endpoint's Hermes home"),
    ("toolsets", "Toolsets, whether enabled and configured, and their tools"),
)


def discovery_operations(retry: ReadRetryPolicy) -> list[JsonOperation]:
    return [
        JsonOperation(
            spec(name, NoInput, description),
            no_call,
            protected=name != "health",
            retry=retry,
        )
        for name, description in _ROUTES
    ]
