"""Read-only discovery: health, detailed health, capabilities, models, skills, toolsets.

`health` is the only unprotected route (Hermes answers it without a key), so it is the one
operation that works on an endpoint whose key is missing; everything else is protected.
"""

from __future__ import annotations

from schemas._base import WireStruct
from worker.operations.calls import JsonOperation, no_call
from worker.operations.retry import ReadRetryPolicy
from worker.operations.specs import read


class NoInput(WireStruct, kw_only=True, frozen=True):
    """An operation that takes no input: `{}` is the only valid input."""


_ROUTES = (
    ("health", "/health", "Basic liveness of the endpoint (no key needed)"),
    ("health_detailed", "/health/detailed", "Readiness checks: state db, model, disk, runs"),
    ("capabilities", "/v1/capabilities", "The API server's feature and endpoint table"),
    ("models", "/v1/models", "Models the endpoint serves (a protected read)"),
    ("skills", "/v1/skills", "Skills installed in the endpoint's Hermes home"),
    ("toolsets", "/v1/toolsets", "Toolsets, whether enabled and configured, and their tools"),
)


def discovery_operations(retry: ReadRetryPolicy) -> list[JsonOperation]:
    return [
        JsonOperation(
            read(name, "GET", route, NoInput, description),
            no_call,
            protected=name != "health",
            retry=retry,
        )
        for name, route, description in _ROUTES
    ]
