"""Test-only fault injection: the ways a Hermes server or the network between can misbehave.

Each fault is a typed value (a msgspec tagged union, so the `/_fake/faults` control route and
in-process callers share one schema). A fault is *targeted*: it fires for the next `times`
matching requests (`None` = until cleared), optionally only when the input contains a word or
only for one run id, so a test can break exactly one action among many.

Three families, checked at different points:

* start faults act inside `POST /v1/runs`, after validation and the run cap;
* events faults act inside `GET /v1/runs/{id}/events`, after the run is found;
* route faults (redirect, 5xx, delay) act on any route before authentication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

#: One byte over the 1 MiB frame limit clients are expected to enforce.
OVERSIZE_DEFAULT = 1024 * 1024 + 1


class _Fault(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", forbid_unknown_fields=True
):
    """Targeting shared by every fault."""

    #: How many matching requests the fault fires for; `None` = every one until cleared.
    times: int | None = 1
    #: Fire only when the request's input (or, for run routes, the run's input) contains this.
    input_contains: str | None = None
    #: Fire only for requests about this run id.
    run_id: str | None = None
    #: Fire for a worker's key probes too (`X-AIP-Probe`, worker/serving.py). Off by
    #: default: a fault meant for the work an Action does must not be spent on a probe.
    probes: bool = False


# --- POST /v1/runs -------------------------------------------------------------------------


class StartServerError(_Fault, frozen=True, tag="start_server_error"):
    """The run is created and starts, but the reply is a 500: the client cannot know."""


class StartDrop(_Fault, frozen=True, tag="start_drop"):
    """The run is created and starts, then the connection closes without any reply."""


class StartNoRunId(_Fault, frozen=True, tag="start_no_run_id"):
    """The run is created and starts, but the 2xx body lacks `run_id`."""

    status: int = 202


class StartReject(_Fault, frozen=True, tag="start_reject"):
    """A definitive 4xx rejection; no run is created."""

    status: int = 400
    code: str | None = "invalid_request"
    message: str = "Rejected by fault injection"


class StartHang(_Fault, frozen=True, tag="start_hang"):
    """The request is never answered; `create_run` says whether a run starts meanwhile."""

    create_run: bool = False


# --- GET /v1/runs/{id}/events --------------------------------------------------------------


class EventsNotFound(_Fault, frozen=True, tag="events_not_found"):
    """404 `run_not_found` although the run exists; its buffer stays unconsumed."""


class EventsHang(_Fault, frozen=True, tag="events_hang"):
    """No status line is ever sent; the buffer stays unconsumed."""


class EventsSlow(_Fault, frozen=True, tag="events_slow"):
    """Every frame is held back `delay_s` seconds."""

    delay_s: float = 0.5


class EventsMalformed(_Fault, frozen=True, tag="events_malformed"):
    """One `data:` frame that is not JSON, written after `after` real events."""

    after: int = 0


class EventsOversize(_Fault, frozen=True, tag="events_oversize"):
    """One valid `message.delta` frame of at least `size` bytes, after `after` real events."""

    after: int = 0
    size: int = OVERSIZE_DEFAULT


class EventsFlood(_Fault, frozen=True, tag="events_flood"):
    """`count` extra one-character `message.delta` events before the real ones."""

    count: int = 10_000


class EventsDisconnect(_Fault, frozen=True, tag="events_disconnect"):
    """The connection is cut after `after` events; the stream counts as consumed."""

    after: int = 1


class EventsNoise(_Fault, frozen=True, tag="events_noise"):
    """A hostile stream: no event ever, only `noise` lines (bare blank lines, or comment
    lines each followed by a blank line, like a keepalive) as fast as the socket takes
    them, or one write of about `batch` bytes every `pace_s` seconds. Ends when the client
    goes away or after `max_bytes` (a bound on the test, not on the client)."""

    noise: Literal["blank_lines", "comments"] = "blank_lines"
    batch: int = 65_536
    pace_s: float = 0.0
    max_bytes: int = 256 * 1024 * 1024


class EventsHugeAnswer(_Fault, frozen=True, tag="events_huge_answer"):
    """Before the real events, `size` bytes of answer text as `message.delta` frames of
    `piece` bytes each: every frame fits the client's frame bound, the answer does not fit
    one bus message."""

    size: int = 16 * 1024 * 1024
    piece: int = 256 * 1024


# --- any route -----------------------------------------------------------------------------


class RouteRedirect(_Fault, frozen=True, tag="redirect"):
    """A 3xx to another origin (clients must not follow it)."""

    #: Route template such as `"POST /v1/runs"`; `None` = any route.
    route: str | None = None
    status: int = 307
    location: str = "http://127.0.0.2:9/redirected"


class RouteError(_Fault, frozen=True, tag="route_error"):
    """A 5xx in the standard envelope, before the handler runs (nothing is created)."""

    route: str | None = None
    status: int = 500


class RouteDraining(_Fault, frozen=True, tag="draining"):
    """Hermes' draining gateway: 503 `gateway_draining` with `Retry-After: 1`, before the
    handler runs (nothing is created), as its code answers agent routes while shutting down."""

    route: str | None = None


class RouteDelay(_Fault, frozen=True, tag="delay"):
    """Sleep `delay_s` seconds, then handle the request normally."""

    route: str | None = None
    delay_s: float = 1.0


StartFault = StartServerError | StartDrop | StartNoRunId | StartReject | StartHang
EventsFault = (
    EventsNotFound
    | EventsHang
    | EventsSlow
    | EventsMalformed
    | EventsOversize
    | EventsFlood
    | EventsDisconnect
    | EventsNoise
    | EventsHugeAnswer
)
RouteFault = RouteRedirect | RouteError | RouteDraining | RouteDelay
Fault = StartFault | EventsFault | RouteFault

_START = (StartServerError, StartDrop, StartNoRunId, StartReject, StartHang)
_EVENTS = (
    EventsNotFound,
    EventsHang,
    EventsSlow,
    EventsMalformed,
    EventsOversize,
    EventsFlood,
    EventsDisconnect,
    EventsNoise,
    EventsHugeAnswer,
)
_ROUTE = (RouteRedirect, RouteError, RouteDraining, RouteDelay)


@dataclass(slots=True)
class _Armed:
    fault: Fault
    remaining: int | None


class Faults:
    """The armed faults of one server; mutate it from a test, in-process or via `/_fake/faults`."""

    def __init__(self) -> None:
        self._armed: list[_Armed] = []

    def add(self, *faults: Fault) -> None:
        """Arm faults; they are matched in the order they were added."""
        for fault in faults:
            if fault.times is not None and fault.times < 1:
                raise ValueError("times must be at least 1, or None for unlimited")
            self._armed.append(_Armed(fault, fault.times))

    def clear(self) -> None:
        """Disarm everything."""
        self._armed.clear()

    def armed(self) -> list[Fault]:
        """What is still armed, each with `times` set to its remaining count."""
        return [msgspec.structs.replace(a.fault, times=a.remaining) for a in self._armed]

    def take_start(self, input_text: str) -> StartFault | None:
        """The start fault for a `POST /v1/runs` with this input, consuming one firing."""
        fault = self._take(_START, None, input_text, None)
        assert fault is None or isinstance(fault, _START)
        return fault

    def take_events(self, run_id: str, input_text: str) -> EventsFault | None:
        """The events fault for one subscription to a run, consuming one firing."""
        fault = self._take(_EVENTS, run_id, input_text, None)
        assert fault is None or isinstance(fault, _EVENTS)
        return fault

    def take_route(
        self, route: str, run_id: str | None, text: str, *, probe: bool = False
    ) -> RouteFault | None:
        """The route fault for any request, consuming one firing (a probe only takes a
        fault armed with `probes=True`)."""
        fault = self._take(_ROUTE, run_id, text, route, probe=probe)
        assert fault is None or isinstance(fault, _ROUTE)
        return fault

    def _take(
        self,
        kinds: tuple[type[Any], ...],
        run_id: str | None,
        text: str,
        route: str | None,
        *,
        probe: bool = False,
    ) -> Fault | None:
        for armed in self._armed:
            fault = armed.fault
            if type(fault) not in kinds:
                continue
            if probe and not fault.probes:
                continue
            if fault.run_id is not None and fault.run_id != run_id:
                continue
            if fault.input_contains is not None and fault.input_contains not in text:
                continue
            if isinstance(fault, _ROUTE) and fault.route not in (None, route):
                continue
            if armed.remaining is not None:
                armed.remaining -= 1
                if armed.remaining == 0:
                    self._armed.remove(armed)
            return fault
        return None


def decode_faults(raw: bytes) -> list[Fault]:
    """Parse one fault object or a list of them (the `/_fake/faults` body)."""
    decoded = msgspec.json.decode(raw, type=list[Fault] | Fault)
    return decoded if isinstance(decoded, list) else [decoded]


def encode_faults(faults: list[Fault]) -> bytes:
    """Serialize faults for the control route."""
    return msgspec.json.encode(faults)
