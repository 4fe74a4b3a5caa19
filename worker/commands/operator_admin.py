"""Operator commands: `binding show ACTION_ID` and `reconcile ACTION_ID`.

An `outcome_unknown` binding is never replayed automatically (troubleshooting: "reconcile
the retained binding"). `reconcile` is the operational exception path: it reads the bound
provider run when one is known, and records a person's decision with that evidence beside
the binding. It never starts, approves or stops anything, and it never rewrites the
terminal binding or the settled result: the decision is a separate write-once record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec
from redis.exceptions import RedisError

from schemas.ids import is_action_id
from worker.bus.connections import open_redis_for
from worker.commands.cli_settings import ENDPOINTS, REDIS, add_settings_flags, settings_from
from worker.commands.exit_codes import Exit
from worker.endpoints import resolve_endpoints
from worker.errors import ConnectorError, StoreUnavailable
from worker.hermes.http_client import HermesClient
from worker.operator import provider
from worker.operator.binding import BindingState, OperatorBinding, decode_binding
from worker.operator.redaction import bounded_text, digest, redact_output
from worker.store.keys import binding_key
from worker.store.operator_store import OperatorStore, ReconcileStatus

EXIT_FAILED = Exit.FAILED
EXIT_CONFIG = Exit.CONFIGURATION
EXIT_UNREACHABLE = Exit.UNREACHABLE

#: Bound on the one provider read a reconciliation makes.
READ_TIMEOUT_S = 10.0


class Decision(StrEnum):
    """What the person reconciling concluded about the uncertain provider effects."""

    #: External evidence shows the run (and its effects) happened.
    EFFECTS_CONFIRMED = "effects_confirmed"
    #: External evidence shows no run and no effect happened.
    NO_EFFECTS_CONFIRMED = "no_effects_confirmed"
    #: Not decidable from here; handed to the owning team.
    ESCALATED = "escalated"


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    status: ReconcileStatus
    #: The stored decision (the earlier one when it already existed).
    decision: dict[str, Any] | None


def binding_view(
    binding: OperatorBinding, *, cancel_flag: bool, reconciliation: Any
) -> dict[str, Any]:
    """The binding for people: output text as a digest, everything else as stored."""
    view: dict[str, Any] = msgspec.to_builtins(binding)
    view["output"] = redact_output(binding.output)
    view["cancel_requested"] = binding.cancel_requested or cancel_flag
    view["reconciliation"] = reconciliation
    return view


async def show_binding(redis: Any, action_id: str) -> dict[str, Any] | None:
    """The redacted binding of a source Action, or None when it has none."""
    store = OperatorStore(redis)
    stored = await store.read(binding_key(action_id))
    if stored.doc is None:
        return None
    reconciliation = None if stored.reconciliation is None else json.loads(stored.reconciliation)
    return binding_view(
        decode_binding(stored.doc),
        cancel_flag=stored.cancel_requested,
        reconciliation=reconciliation,
    )


async def observe_provider(hermes: HermesClient | None, run_id: str | None) -> dict[str, Any]:
    """Evidence about the bound run: one status read, redacted; nothing is sent."""
    if run_id is None:
        return {"read": "no_run_id", "note": "no run id was ever bound; Hermes cannot be asked"}
    if hermes is None:
        return {"read": "no_endpoint", "note": "the binding's endpoint is not configured here"}
    read = await provider.read_status(hermes, run_id, {}, READ_TIMEOUT_S)
    match read:
        case provider.RunGone():
            return {
                "read": "run_not_found",
                "note": "Hermes no longer knows the run; that is not proof of no effect",
            }
        case provider.ReadFailed(error=error):
            return {"read": "failed", "note": error.message}
        case provider.StatusRead(body=body):
            output = body.get("output")
            return {
                "read": "ok",
                "status": bounded_text(body.get("status"), 64),
                "last_event": bounded_text(body.get("last_event"), 128),
                "output": digest(output) if isinstance(output, str) else None,
                "error": bounded_text(body.get("error")),
            }


async def reconcile(
    redis: Any,
    hermes: HermesClient | None,
    action_id: str,
    *,
    decision: Decision,
    decided_by: str,
    note: str,
) -> ReconcileReport:
    """Record `decision` on an `outcome_unknown` binding, with the provider's evidence."""
    store = OperatorStore(redis)
    key = binding_key(action_id)
    stored = await store.read(key)
    if stored.doc is None:
        return ReconcileReport(ReconcileStatus.MISSING, None)
    binding = decode_binding(stored.doc)
    if binding.status is not BindingState.OUTCOME_UNKNOWN:
        return ReconcileReport(ReconcileStatus.NOT_UNKNOWN, None)
    record = {
        "decision": decision.value,
        "decided_by": decided_by,
        "note": bounded_text(note, 2048),
        "decided_at_unix_ms": time.time_ns() // 1_000_000,
        "binding_revision": binding.revision,
        "run_id": binding.run_id,
        "error_code": None if binding.error is None else binding.error.code.value,
        "provider": await observe_provider(hermes, binding.run_id),
    }
    status, raw = await store.record_reconciliation(key, msgspec.json.encode(record))
    return ReconcileReport(status, json.loads(raw) if raw else None)


# --- command line ------------------------------------------------------------------------


def _fail(code: int, message: str) -> int:
    print(message, file=sys.stderr)
    return code


def _action_id(value: str) -> str:
    if not is_action_id(value):
        raise argparse.ArgumentTypeError("not an Action id (act_ + 32 hex)")
    return value


async def cmd_binding_show(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    redis = open_redis_for(settings)
    try:
        view = await show_binding(redis, args.action_id)
    except (StoreUnavailable, RedisError, OSError) as exc:
        return _fail(EXIT_UNREACHABLE, f"cannot reach Redis ({type(exc).__name__})")
    except ConnectorError as exc:
        return _fail(EXIT_FAILED, exc.message)
    finally:
        await redis.aclose()
    if view is None:
        return _fail(EXIT_FAILED, f"no operator binding exists for {args.action_id}")
    print(json.dumps(view, indent=2, sort_keys=True))
    return 0


async def cmd_reconcile(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        endpoints = {e.id: e for e in resolve_endpoints(settings)}
    except ValueError as exc:
        return _fail(EXIT_CONFIG, str(exc))
    redis = open_redis_for(settings)
    hermes: HermesClient | None = None
    try:
        view = await show_binding(redis, args.action_id)
        if view is None:
            return _fail(EXIT_FAILED, f"no operator binding exists for {args.action_id}")
        endpoint = endpoints.get(view["endpoint_id"])
        if endpoint is not None:
            hermes = HermesClient(endpoint, transport=settings.hermes_http_transport)
        report = await reconcile(
            redis,
            hermes,
            args.action_id,
            decision=Decision(args.decision),
            decided_by=args.decided_by,
            note=args.note,
        )
    except (StoreUnavailable, RedisError, OSError) as exc:
        return _fail(EXIT_UNREACHABLE, f"cannot reach Redis ({type(exc).__name__})")
    except ConnectorError as exc:
        return _fail(EXIT_FAILED, exc.message)
    finally:
        if hermes is not None:
            await hermes.aclose()
        await redis.aclose()
    if report.status is ReconcileStatus.NOT_UNKNOWN:
        return _fail(EXIT_FAILED, f"{args.action_id} is not outcome_unknown; nothing to reconcile")
    print(json.dumps({"status": report.status.value, "decision": report.decision}, indent=2))
    return 0 if report.status is ReconcileStatus.RECORDED else EXIT_FAILED


def add_commands(subparsers: Any) -> None:
    """Add `binding show` and `reconcile` (each sets an async `func`)."""
    binding = subparsers.add_parser("binding", help="inspect governed operator bindings")
    binding_sub = binding.add_subparsers(dest="binding_command", required=True)
    show = binding_sub.add_parser("show", help="print a source Action's binding (redacted)")
    show.add_argument("action_id", type=_action_id, help="the source Action (act_ + 32 hex)")
    add_settings_flags(show, REDIS)
    show.set_defaults(func=cmd_binding_show)

    rec = subparsers.add_parser(
        "reconcile",
        help="record a decision about an outcome_unknown operator binding (never starts a run)",
    )
    rec.add_argument("action_id", type=_action_id, help="the source Action (act_ + 32 hex)")
    rec.add_argument(
        "--decision",
        required=True,
        choices=[d.value for d in Decision],
        help="what the evidence shows about the uncertain provider effects",
    )
    rec.add_argument("--decided-by", required=True, help="who decided (recorded)")
    rec.add_argument("--note", required=True, help="the evidence or reason (recorded)")
    add_settings_flags(rec, REDIS, ENDPOINTS)
    rec.set_defaults(func=cmd_reconcile)
