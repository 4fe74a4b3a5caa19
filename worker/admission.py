"""What the runtime asks of the trust layer before anything reaches a provider.

Two steps, because they fail differently: an envelope whose *signature* fails cannot be
trusted even for its Action id, so it goes to the DLQ and touches no Action state (otherwise
a forger could settle, or poison the fingerprint of, someone else's Action id). A signed
envelope refused for its identity, tenant or approval is answered with a settled, failed
ActionResult, so its publisher learns why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from schemas.action import Action
from worker.operations.base import OperationSpec
from worker.settings import Endpoint


class Admission(Protocol):
    def verify_signature(self, payload: bytes, headers: Mapping[str, str]) -> str | None:
        """The verified signer (None when unsigned input is allowed); raises ConnectorError."""
        ...

    async def admit(
        self,
        *,
        action: Action,
        payload: bytes,
        headers: Mapping[str, str],
        endpoint: Endpoint,
        spec: OperationSpec,
        redis: Any,
    ) -> Mapping[str, str]:
        """Check identity, tenant and approval; return the trusted provider headers.

        Raises ConnectorError with the refusal code; nothing has been sent to Hermes then.
        """
        ...

    async def admit_delegation(
        self,
        *,
        action: Action,
        child: Action,
        payload: bytes,
        headers: Mapping[str, str],
        endpoint: Endpoint,
        spec: OperationSpec,
        redis: Any,
        child_approval: bool,
    ) -> tuple[Mapping[str, str], str | None]:
        """Admit a delegation's internal Action (its delegator's identity and tenant), and,
        when `child_approval`, the durable approval of the exact `child` Action.

        Returns the trusted provider headers and the delegator's verified tenant; raises
        ConnectorError with the refusal code, before anything was sent to Hermes.
        """
        ...
