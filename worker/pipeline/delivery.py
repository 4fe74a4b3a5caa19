"""The one object a delivery's steps pass along, and the two ways a step ends it early.

A `Delivery` is frozen: each step returns a new one with what it decided (the operation,
its params, the trusted headers, the deadline), so what a later step sees is exactly what
the earlier ones established, and nothing else. An `Intake` says how one kind of envelope
becomes a Delivery (an Action, a delegation, a channel delivery): `open` decodes and
authenticates it, then its `steps` run in order (docs/architecture.md §4, steps 1-3).

A step ends a delivery early in one of two ways (both in `worker/errors.py`), and the
pipeline answers each (`worker.pipeline.answers`):

- `Rejected`: the envelope cannot be trusted or read; it is dead-lettered and touches no
  Action state;
- `Refusal`: a trusted envelope that may not run; it is settled once as a failed result,
  unless an earlier delivery already began the work (then what exists is recovered).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import nats.errors
import nats.js.errors
import redis.exceptions
from nats.aio.msg import Msg

from schemas.action import Action
from worker.errors import ConnectorError, PublishFailed, Refusal, StoreUnavailable
from worker.operations.base import Operation
from worker.pipeline.runtime import EndpointRuntime
from worker.store.keys import ActionKeys

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Delivery:
    """One authenticated envelope on its way through the steps, and what they decided."""

    msg: Msg
    endpoint_id: str
    action: Action
    #: Where the Action's state lives (a resume keeps its source Action's hash tag).
    keys: ActionKeys
    #: The verified signer (None: unsigned input allowed in development).
    signer: str | None = None
    #: The served endpoint (None until a step found it served).
    ep: EndpointRuntime | None = None
    #: The operation the capability names (None: not published by this worker).
    operation: Operation | None = None
    #: The operation's own input, validated (None until converted).
    params: Any = None
    #: The provider headers admission projected from verified facts.
    trusted: Mapping[str, str] = field(default_factory=lambda: _NO_HEADERS)
    #: When the execution must end (Unix ms; 0 until decided).
    deadline_ms: int = 0

    @property
    def stored_at_ms(self) -> int | None:
        """When JetStream stored this message (its metadata timestamp, the same on every
        redelivery): what the replay window judges `created_at_unix_ms` against. None for
        a message that did not come from a JetStream consumer."""
        try:
            return int(self.msg.metadata.timestamp.timestamp() * 1000)
        except Exception:
            return None

    def having(self, **decided: Any) -> Delivery:
        """This delivery with what a step decided: `dataclasses.replace`, without its walk
        over the fields' metadata on every call (each step of every Action calls this)."""
        for name in _FIELD_NAMES:
            if name not in decided:
                decided[name] = getattr(self, name)
        return Delivery(**decided)

    @property
    def may_recover(self) -> bool:
        """True when a refusal of this delivery may still recover work an earlier delivery
        began: its endpoint, operation and params are known."""
        return self.ep is not None and self.operation is not None and self.params is not None


#: Every field of a Delivery, in order (`Delivery.having`).
_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Delivery))

#: One step of an intake: the delivery with what it decided, or a `Refusal`.
Step = Callable[[Delivery], Awaitable[Delivery]]


class Intake(Protocol):
    """How one kind of envelope becomes a runnable Delivery."""

    @property
    def steps(self) -> tuple[Step, ...]:
        """What runs after `open`, in order; each may raise `Refusal`."""
        ...

    async def open(self, msg: Msg, endpoint_id: str) -> Delivery:
        """Decode and authenticate `msg`; raises `Rejected`."""
        ...

    def refused(self, delivery: Delivery, refusal: Refusal) -> None:
        """Told of a refusal before it is answered (to log it, for instance)."""
        ...


#: Failures of what a delivery depends on (NATS, Redis, the network): the same envelope can
#: succeed once the dependency is back, so such a delivery is nak'd and comes back.
_DEPENDENCY_FAILURES: tuple[type[BaseException], ...] = (
    StoreUnavailable,
    OSError,
    TimeoutError,
    PublishFailed,
    redis.exceptions.RedisError,
    nats.errors.Error,
    nats.js.errors.Error,
)


def is_dependency_failure(exc: BaseException) -> bool:
    """True when `exc` is a dependency's failure, not this envelope's (see above)."""
    if isinstance(exc, ConnectorError):
        return exc.to_protocol(endpoint_id=None, read_only=False).retryable
    return isinstance(exc, _DEPENDENCY_FAILURES)
