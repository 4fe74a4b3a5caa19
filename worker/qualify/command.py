"""`aip-hermes-worker qualify --endpoint-id hermes-1 --endpoint-id hermes-2 [--record PATH]`.

Drives a running deployment named by the usual settings (flags or `AIPD_*`; credentials
only from files) through the qualification list. Exit codes: 0 no item failed, 1 an item
failed, 2 bad configuration, 3 NATS or Redis unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from worker.commands.cli_settings import add_settings_flags, settings_from
from worker.commands.exit_codes import Exit
from worker.errors import SettingsError


def _broken(value: str) -> tuple[str, str, int]:
    endpoint_id, sep, address = value.partition("=")
    host, colon, port = address.rpartition(":")
    if not sep or not colon or not port.isdigit():
        raise argparse.ArgumentTypeError("expected ID=HOST:PORT, e.g. broken=127.0.0.1:8699")
    return endpoint_id, host, int(port)


async def cmd_qualify(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from worker.qualify.broken import BrokenHermes
    from worker.qualify.deployment import Deployment
    from worker.qualify.driver import drive
    from worker.qualify.items import Broken, Context
    from worker.qualify.settings import QualifySettings

    settings = settings_from(args)
    try:
        qualify = QualifySettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise SettingsError(f"{field} (AIPD_{field.upper()}): {first['msg']}") from None
    deployment = await Deployment.connect(settings, qualify)
    ctx = Context(deployment, list(dict.fromkeys(args.endpoint_id)))
    server: Any = None
    try:
        if args.broken_endpoint is not None:
            endpoint_id, host, port = args.broken_endpoint
            server = BrokenHermes()
            await server.start(host, port)
            ctx.broken = Broken(endpoint_id, server)
        report = await drive(
            ctx,
            record_path=args.record,
            topology="a deployment the driver does not own (no process control)",
            only=args.item or (),
        )
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                await server.close()
        await deployment.close()
    return Exit.FAILED if report.failed else Exit.OK


def add_commands(sub: Any) -> None:
    parser = sub.add_parser(
        "qualify",
        help="drive a running deployment through the spec's qualification list",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--endpoint-id",
        action="append",
        required=True,
        help="a Hermes endpoint under qualification (twice for the two-instance items)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        help="write the record here: a directory (qualification-record.json/.md) or a file",
    )
    parser.add_argument(
        "--broken-endpoint",
        type=_broken,
        metavar="ID=HOST:PORT",
        help="serve a deliberately broken Hermes on HOST:PORT, which the workers know as "
        "endpoint ID (malformed answers, a stop never confirmed, an outage)",
    )
    parser.add_argument("--item", type=int, action="append", help="run only this item (repeatable)")
    add_settings_flags(parser)
    parser.set_defaults(func=cmd_qualify)
