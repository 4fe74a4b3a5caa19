"""Assemble the parts a worker process runs with, from its settings.

The one place that knows which trust layer, which operations and which extra CLI commands
exist, so `app` and `cli` stay free of those choices and tests can assemble their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The runtime's modules are imported by the functions that build from them: the CLI imports
# this module for `add_extra_commands`, and a command such as `submit` or `approve` must not
# pay for loading the whole worker.
if TYPE_CHECKING:
    from worker.control import BindingCancelHook
    from worker.delegation import DelegatedOperation
    from worker.operations.base import Registry
    from worker.pipeline.runtime import Gate
    from worker.settings import Settings


def build_registry(settings: Settings) -> Registry:
    """Every Hermes route, plus the governed operator under the deployment's policy: exactly
    the catalog's 35 capabilities (worker/operations/catalog.py)."""
    from worker.operations.catalog import BY_NAME as CATALOG
    from worker.operations.registry import default_registry
    from worker.operator import HermesOperatorPolicy, operator_operation

    registry = default_registry(settings)
    registry.add(
        operator_operation(
            HermesOperatorPolicy.from_settings(settings),
            idempotency_ttl_ms=settings.effective_idempotency_ttl_ms,
        )
    )
    published = set(registry.operations)
    if published != set(CATALOG):
        # A build that serves another set than the catalog's would publish a manifest the
        # reference connector's callers cannot rely on: refuse to start.
        raise ValueError(f"registry and catalog disagree: {sorted(published ^ set(CATALOG))}")
    return registry


def build_delegation(settings: Settings) -> DelegatedOperation:
    """The first-class delegation entry under the same operator policy (fail closed: with
    delegation disabled every request is refused with `operator_policy`, and answered)."""
    from worker.delegation import DelegatedOperation
    from worker.operator import HermesOperatorPolicy

    return DelegatedOperation(HermesOperatorPolicy.from_settings(settings), stores=None)


def build_gate(settings: Settings) -> Gate:
    """The trust checks the runtime makes (`worker.pipeline.runtime.Gate`): the trust gate
    itself, with no layer between them."""
    from worker.trust.gate import TrustGate

    return TrustGate.from_settings(settings)


def binding_cancel_hook() -> BindingCancelHook | None:
    from worker.operator import request_cancel

    return request_cancel


def add_extra_commands(sub: Any) -> None:
    """Subcommands owned by other packages (trust, operator, escalation, demo, qualify)."""
    from worker.commands import (
        demo_command,
        escalation_admin,
        operator_admin,
        trust_admin,
    )
    from worker.qualify import command as qualify_command

    trust_admin.add_commands(sub)
    operator_admin.add_commands(sub)
    escalation_admin.add_commands(sub)
    demo_command.add_commands(sub)
    qualify_command.add_commands(sub)
