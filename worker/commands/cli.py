"""`aip-hermes-worker`: the entry point, and the commands that run or prepare a deployment
(run, gateway, provision, schemas).

The publisher's commands on the bus (submit, tail, result, cancel, manifest, audit, sign)
are in `worker/commands/bus_commands.py`; trust, operator, escalation, demo and qualify commands are
registered by their own packages (`worker/wiring.py`).

Errors name what to fix, in one line and without a traceback: a bad setting names its field
and variable, an unreachable service names its URL and the setting that points at it
(`worker/commands/failures.py` turns each expected failure into that line). Exit codes are
`worker/commands/exit_codes.py`'s `Exit` (README.md "Exit codes").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from worker import tracing
from worker.commands.cli_settings import (
    ENDPOINTS,
    LOGS,
    NATS,
    REDIS,
    STREAMS,
    WORKER_KEYS,
    add_settings_flags,
    settings_from,
)
from worker.commands.exit_codes import Exit
from worker.commands.failures import explain
from worker.errors import ServiceUnreachable, SettingsError
from worker.logs import setup_logging

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic_settings import BaseSettings

# --- commands ---------------------------------------------------------------------------


async def cmd_run(args: argparse.Namespace) -> int:
    from worker.app import Worker
    from worker.wiring import (
        binding_cancel_hook,
        build_delegation,
        build_gate,
        build_registry,
    )

    settings = settings_from(args)
    setup_logging(settings.log_format, settings.log_level)
    tracing.configure("aip-hermes-worker")
    registry = build_registry(settings)
    worker = Worker(
        settings,
        gate=build_gate(settings),
        registry=registry,
        binding_cancel=binding_cancel_hook(),
        delegation=build_delegation(settings),
        settle_gc=True,
    )
    try:
        await worker.run_until_signalled()
    except OSError as exc:
        raise ServiceUnreachable(
            f"a service is unreachable ({exc}); check AIPD_NATS_URL / AIPD_REDIS_URL"
        ) from None
    return 0


S = TypeVar("S", bound="BaseSettings")


def _from_environment(model: type[S]) -> S:
    """A settings model of `AIPD_*` variables only (no flags); a bad value is a
    SettingsError naming its first field and variable."""
    from pydantic import ValidationError as SettingsInvalid

    try:
        return model()
    except SettingsInvalid as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise SettingsError(f"{field} (AIPD_{field.upper()}): {first['msg']}") from None


async def cmd_gateway(args: argparse.Namespace) -> int:
    """The AIP gateway: MCP server for Hermes, writer of the runtime's stores (docs/gateway.md)."""
    from worker.errors import RouteConfigError
    from worker.gateway import Gateway, GatewaySettings

    settings = _from_environment(GatewaySettings)
    setup_logging(settings.log_format, settings.log_level)
    tracing.configure("aip-hermes-gateway")
    # The MCP SDK logs every request at info; the gateway's own lines say what matters.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    try:
        await Gateway(settings).run_until_signalled()
    except RouteConfigError as exc:
        raise SettingsError(str(exc)) from None
    except OSError as exc:
        raise ServiceUnreachable(f"a service is unreachable ({exc}); check AIPD_NATS_URL") from None
    return 0


async def cmd_console(args: argparse.Namespace) -> int:
    """The read-only web console (docs/console.md): runs, escalations, the DLQ."""
    from worker.console.app import Console
    from worker.console.settings import ConsoleSettings

    settings = settings_from(args)
    console = _from_environment(ConsoleSettings)
    setup_logging(settings.log_format, settings.log_level)
    try:
        await Console(settings, console).run_until_signalled()
    except OSError as exc:
        raise ServiceUnreachable(
            f"a service is unreachable ({exc}); check AIPD_NATS_URL / AIPD_REDIS_URL"
        ) from None
    return 0


async def cmd_provision(args: argparse.Namespace) -> int:
    from subjects.grammar import Subjects
    from subjects.provision import Change, check_store, provision, wanted_streams
    from worker.bus.connections import connect_nats_for_command, stream_policy
    from worker.bus.server_requirements import version_problem
    from worker.endpoints import endpoint_descriptors

    settings = settings_from(args)
    endpoint_ids = [d.id for d in endpoint_descriptors(settings)]
    subjects, policy = Subjects(settings.subject_prefix), stream_policy(settings)
    nc = await connect_nats_for_command(settings)
    bucket: str | None = None
    try:
        # Refused before anything is created (docs/operations.md, "Full disk"). The store
        # is asked first: a NATS without JetStream is then named as such (exit 3), not as a
        # server below the minimum version.
        wanted = wanted_streams(subjects, endpoint_ids, policy, runtime_stores=args.runtime_stores)
        store = await check_store(nc.jetstream(), wanted)
        problem = version_problem(nc.connected_server_version)
        if problem is not None:
            if not args.allow_nats_below_minimum:
                print(f"refused: {problem} (or pass --allow-nats-below-minimum)", file=sys.stderr)
                return Exit.CONFIGURATION
            print(f"warning: {problem}", file=sys.stderr)
        print(store.describe(), file=sys.stderr)  # stdout stays one line per stream/consumer
        if store.shortfall and not args.allow_store_shortfall:
            print("refused: the JetStream store cannot hold the stream limits "
                  "(or pass --allow-store-shortfall)", file=sys.stderr)  # fmt: skip
            return Exit.CONFIGURATION
        report = await provision(
            nc.jetstream(), subjects, endpoint_ids, policy, runtime_stores=args.runtime_stores
        )
        if args.runtime_stores:
            # The native binding's replay guard: a bucket the gateway writes but, under
            # least-privilege roles, may not create (compose/nats/nats.conf).
            # And the connector host's journal of the central's approval records.
            from worker.gateway import host_approvals
            from worker.gateway.native_trust import CLAIMS_BUCKET, MessageClaims

            await MessageClaims.open(nc.jetstream(), replicas=policy.replicas)
            await host_approvals.HostApprovalImports.open(
                nc.jetstream(), replicas=policy.replicas
            )
            bucket = (
                f"{CLAIMS_BUCKET}: key-value bucket present\n"
                f"{host_approvals.BUCKET}: key-value bucket present"
            )
    finally:
        await nc.close()
    for item in report:
        print(item.describe())
    if bucket is not None:
        print(bucket)
    return Exit.FAILED if any(item.change is Change.CONFLICT for item in report) else Exit.OK


async def cmd_schemas(args: argparse.Namespace) -> int:
    from schemas.export import JSON_DIR, drift, export
    from subjects import asyncapi
    from worker.commands import config_doc

    if args.check:
        stale = drift() + (["asyncapi.json"] if asyncapi.drifted() else [])
        stale += ["docs/configuration.md"] if config_doc.drifted() else []
        if stale:
            print("out of date: " + ", ".join(stale) + " (run: aip-hermes-worker schemas export)")
            return Exit.FAILED
        print("schemas, asyncapi.json and docs/configuration.md are up to date")
        return 0
    for path in export():
        print(path)
    print(asyncapi.export())
    print(config_doc.export())
    print(f"wrote {JSON_DIR}")
    return 0


# --- parser -----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """No abbreviated flags: `--hermes-api-key` must not silently mean `--hermes-api-key-file`.

    Subparsers are built with the parent's class, so every subcommand inherits this.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aip-hermes-worker")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _settings_lines(model: type[BaseModel]) -> list[str]:
    """One help line per field of a settings model, `AIPD_<NAME>` and its default, read from
    the model itself so the list cannot drift from what the command reads."""
    from pydantic_core import PydanticUndefined

    lines = []
    for name, field in model.model_fields.items():
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = "default: computed at start"
        elif field.default is None or field.default is PydanticUndefined:
            default = "default: unset"
        else:
            default = f"default: {field.default!r}"
        lines.append(f"  AIPD_{name.upper():<36} {default}")
    return lines


def _gateway_description() -> str:
    """The gateway takes no flags; its help lists the `AIPD_*` settings it reads."""
    from worker.gateway.settings import GatewaySettings

    lines = [
        "Start the AIP gateway: the MCP server Hermes calls, and the writer of the runtime's",
        "stores. It takes no flags: it reads these AIPD_* environment variables (plus the",
        "AIPD_NATS_* credential files a worker reads), described in docs/gateway.md",
        '"Settings":',
        "",
    ]
    return "\n".join(lines + _settings_lines(GatewaySettings))


def _console_description() -> str:
    """The console's own `AIPD_CONSOLE_*` variables."""
    from worker.console.settings import ConsoleSettings

    lines = [
        "Serve the read-only web console: runs, their chunks and receipts, approvals and",
        "escalations with the command that answers each, the DLQ (docs/console.md). Every",
        "page but /health needs a token of AIPD_CONSOLE_TOKENS_FILE. Its own settings are",
        "these environment variables; NATS, Redis and the trusted worker keys are the flags",
        "below (each also AIPD_<NAME>).",
        "",
    ]
    return "\n".join(lines + _settings_lines(ConsoleSettings))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="aip-hermes-worker",
        description="Drive Hermes Agent endpoints from NATS JetStream, fenced by Redis.",
        epilog="Exit codes: " + ", ".join(f"{c.value} {c.name.lower()}" for c in Exit) + ".",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start a worker", description="Start a worker.")
    add_settings_flags(run)
    run.set_defaults(func=cmd_run)

    gateway = sub.add_parser(
        "gateway",
        help="start the AIP gateway (MCP server + runtime stores); AIPD_* settings",
        description=_gateway_description(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gateway.set_defaults(func=cmd_gateway)

    console = sub.add_parser(
        "console",
        help="serve the read-only web console (runs, escalations, DLQ); AIPD_CONSOLE_*",
        description=_console_description(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_settings_flags(console, NATS, REDIS, WORKER_KEYS, LOGS)
    console.set_defaults(func=cmd_console)

    prov = sub.add_parser("provision", help="create or update streams and consumers")
    add_settings_flags(prov, NATS, ENDPOINTS, STREAMS)
    prov.add_argument(
        "--runtime-stores",
        action="store_true",
        help="also create the AIP runtime's queue and lifecycle streams (delegation results) "
        "and the native binding's message-id bucket",
    )
    prov.add_argument(
        "--allow-nats-below-minimum",
        action="store_true",
        help="provision on a nats-server older than worker/bus/server_requirements.py accepts",
    )
    prov.add_argument(
        "--allow-store-shortfall",
        action="store_true",
        help="provision although the account's JetStream storage cannot hold the stream limits",
    )
    prov.set_defaults(func=cmd_provision)

    from worker.commands import bus_commands

    bus_commands.add_commands(sub)

    from worker.commands import dlq_admin

    dlq_admin.add_commands(sub)

    schemas = sub.add_parser("schemas", help="JSON Schema and AsyncAPI files")
    schemas_sub = schemas.add_subparsers(dest="schemas_command", required=True)
    export = schemas_sub.add_parser(
        "export", help="write schemas/json/*.json, subjects/asyncapi.json, docs/configuration.md"
    )
    export.add_argument("--check", action="store_true", help="only report drift")
    export.set_defaults(func=cmd_schemas)

    from worker.wiring import add_extra_commands

    add_extra_commands(sub)

    # Here, not in add_extra_commands: the conformance command reads the manifest from
    # worker.wiring's registry, and wiring importing it back would close a circle.
    from worker.commands import completion, conformance

    conformance.add_commands(sub)

    completion.add_commands(sub, parser)  # last: its script lists every command above
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "command", None) not in ("run", "gateway"):
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return _event_loop_runner()(_run(args))
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except Exception as exc:
        # Every expected failure is one line naming what to fix (worker/commands/failures.py);
        # anything else is a bug, and its traceback is shown.
        known = explain(exc, args)
        if known is None:
            raise
        code, line = known
        print(line, file=sys.stderr)
        return code


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, int]], int]:
    """uvloop when installed (+10-40% on the JetStream paths here), unless AIPD_USE_UVLOOP=false."""
    import os

    if os.environ.get("AIPD_USE_UVLOOP", "true").lower() not in ("0", "false", "no"):
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run
    return asyncio.run


async def _run(args: argparse.Namespace) -> int:
    result: int = await args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
