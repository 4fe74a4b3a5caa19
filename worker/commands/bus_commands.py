"""The publisher's commands on the bus: submit, tail, result, cancel, manifest, audit, sign.

Each connects for one command (`connect_nats_for_command`, failing fast), signs with the
gateway key it is given, and believes a result or chunk chain only when it verifies against
the trusted worker keys (`--trusted-worker-keys`); one that does not exits 4.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from worker.commands.cli_settings import settings_from
from worker.settings import Settings

if TYPE_CHECKING:
    from worker.client import AipClient


def _json_input(text: str) -> dict[str, Any]:
    raw = Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--input must be a JSON object")
    return value


def _bus_settings(args: argparse.Namespace) -> Settings:
    """A bus command's settings: its `--nats-url` over the `AIPD_*` environment, so the
    NATS credential settings apply as they do to a worker."""
    return settings_from(args, nats_url=args.nats_url)


async def _connect(settings: Settings) -> Any:
    """A connection for one command, failing fast (nats-py loads only when a command runs)."""
    from worker.bus.connections import connect_nats_for_command

    return await connect_nats_for_command(settings)


async def cmd_submit(args: argparse.Namespace) -> int:
    nc, client = await _signing_client(
        args, trusted_worker_keys=_trusted_worker_keys(args) if args.wait else None
    )
    try:
        action = client.build_action(
            authentication_issuer=args.issuer,
            endpoint_id=args.endpoint,
            operation=args.operation,
            input=args.input,
            principal_id=args.principal,
            principal_kind=args.principal_kind,
            tenant_id=args.tenant,
            credential_revision=args.revision,
            idempotency_key=args.idempotency_key,
            timeout_ms=args.timeout_ms,
            action_id=args.action_id,
        )
        handle = await client.publish(action)
        print(handle.action_id, flush=True)
        if handle.duplicate:
            print(
                f"warning: the stream already held these exact envelope bytes for {action.id} "
                "inside its duplicate window (its Nats-Msg-Id is bound to them), so this "
                "publish was not stored: the first copy is the one that runs",
                file=sys.stderr,
            )
        if args.wait:
            await _follow(client, args.endpoint, handle.action_id, 0, args.wait)
    finally:
        await nc.drain()
    return 0


#: Exit status of `tail`/`result`/`submit --wait` when a response does not verify against
#: the trusted worker keys (`connector_host.response_signing`).
EXIT_UNVERIFIED = 4


async def _signing_client(
    args: argparse.Namespace, *, trusted_worker_keys: Path | None = None
) -> tuple[Any, AipClient]:
    """The connection and a client that signs with `--sign-key` and refuses, before signing,
    an envelope over the deployment's `AIPD_MAX_ENVELOPE_BYTES` (what `submit` and `cancel`
    publish)."""
    from worker.client import AipClient

    settings = _bus_settings(args)
    nc = await _connect(settings)
    client = AipClient(
        nc,
        prefix=args.prefix,
        sign_key=args.sign_key,
        max_envelope_bytes=settings.max_envelope_bytes,
        trusted_worker_keys=trusted_worker_keys,
    )
    return nc, client


def _trusted_worker_keys(args: argparse.Namespace) -> Path | None:
    """The trusted worker keys file, or None after a warning that nothing is verified."""
    path: Path | None = getattr(args, "trusted_worker_keys", None)
    if path is None:
        print(
            "warning: what workers published (results, chunks, receipts) is not verified "
            "(no --trusted-worker-keys / "
            "AIPD_TRUSTED_WORKER_KEYS_FILE)",
            file=sys.stderr,
        )
    return path


def _unverified(exc: Exception) -> int:
    print(f"refused: {exc} (connector_host.response_signing)", file=sys.stderr)
    return EXIT_UNVERIFIED


async def _follow(
    client: Any, endpoint: str, action_id: str, from_seq: int, timeout_s: float
) -> int:
    from worker.errors import UnverifiedResponse

    handle = client.handle(endpoint, action_id)
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in handle.chunks(from_seq=from_seq):
                print(msgspec.json.encode(chunk).decode(), flush=True)
            result = await handle.result(timeout_s=timeout_s)
    except UnverifiedResponse as exc:
        return _unverified(exc)
    except TimeoutError:
        print(f"no result for {action_id} within {timeout_s:g} s", file=sys.stderr)
        return 1
    print(msgspec.json.encode(result).decode(), flush=True)
    return 0 if result.status.value in ("completed", "requires_human") else 1


async def cmd_tail(args: argparse.Namespace) -> int:
    from worker.client import AipClient

    nc = await _connect(_bus_settings(args))
    try:
        return await _follow(
            AipClient(nc, prefix=args.prefix, trusted_worker_keys=_trusted_worker_keys(args)),
            args.endpoint,
            args.action_id,
            args.from_seq,
            args.timeout,
        )
    finally:
        await nc.drain()


async def cmd_result(args: argparse.Namespace) -> int:
    from worker.client import AipClient
    from worker.errors import UnverifiedResponse

    nc = await _connect(_bus_settings(args))
    client = AipClient(nc, prefix=args.prefix, trusted_worker_keys=_trusted_worker_keys(args))
    try:
        if args.wait:
            result = await client.handle(args.endpoint, args.action_id).result(timeout_s=args.wait)
        else:
            found = await client.stored_result(args.endpoint, args.action_id)
            if found is None:
                print(f"no result yet for {args.action_id}", file=sys.stderr)
                return 1
            result = found
    except UnverifiedResponse as exc:
        return _unverified(exc)
    finally:
        await nc.drain()
    print(msgspec.json.encode(result).decode())
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    nc, client = await _signing_client(args)
    try:
        reply = await client.cancel(
            args.endpoint, args.action_id, reason=args.reason, requested_by=args.requested_by
        )
    finally:
        await nc.drain()
    print(msgspec.json.encode(reply).decode())
    return 0 if reply.accepted else 1


async def cmd_manifest(args: argparse.Namespace) -> int:
    from worker.client import AipClient

    nc = await _connect(_bus_settings(args))
    try:
        print(json.dumps(await AipClient(nc, prefix=args.prefix).manifest(args.endpoint), indent=2))
    finally:
        await nc.drain()
    return 0


#: Exit status of `audit` when nothing on the Action's audit subject verified.
EXIT_NO_RECEIPTS = 1


async def cmd_audit(args: argparse.Namespace) -> int:
    """Print an Action's receipt chain in order: what every worker decided about it.

    With trusted worker keys only receipts a trusted worker signed are in the chain (a
    gateway's `tool_call` receipt may be signed by a trusted gateway key instead); every
    other message on the subject, forged or malformed, is reported on stderr with its
    audit-stream sequence and left out, and none of them stops the command.
    """
    from worker.client import AipClient
    from worker.trust.signing import TrustedGatewayKeys

    gateway_keys = (
        TrustedGatewayKeys.load(args.trusted_gateway_keys)
        if args.trusted_gateway_keys is not None
        else None
    )
    nc = await _connect(_bus_settings(args))
    try:
        client = AipClient(nc, prefix=args.prefix, trusted_worker_keys=_trusted_worker_keys(args))
        chain = await client.audit_chain(
            args.endpoint, args.action_id, trusted_gateway_keys=gateway_keys
        )
    finally:
        await nc.drain()
    for entry in chain.entries:
        receipt = entry.receipt
        if args.json:
            print(msgspec.json.encode(receipt).decode())
            continue
        details = " ".join(f"{k}={v}" for k, v in receipt.details.items() if v is not None)
        print(
            f"{receipt.ts_unix_ms} {receipt.worker_id:>16} fence={receipt.fence:<3} "
            f"{receipt.event.value:<16} {details}"
        )
    for aside in chain.unverified:
        print(
            f"warning: excluded audit seq {aside.seq} ({aside.receipt_id}): unverified: "
            f"{aside.reason}",
            file=sys.stderr,
        )
    for aside in chain.malformed:
        print(f"warning: skipped audit seq {aside.seq}: {aside.reason}", file=sys.stderr)
    if not chain.entries:
        what = "verified receipts" if chain.verified else "receipts"
        print(f"no {what} for {args.action_id}", file=sys.stderr)
        return EXIT_NO_RECEIPTS
    return 0


async def cmd_sign(args: argparse.Namespace) -> int:
    """Print the signature headers for a payload, for publishers using the `nats` CLI."""
    from schemas.codec import decode_action, decode_cancel, decode_delegation
    from worker.trust.signing import read_seed_file, sign_envelope

    # A one-shot command: nothing else runs on the loop while the file is read.
    source = sys.stdin.buffer if args.payload == "-" else Path(args.payload).open("rb")  # noqa: ASYNC230, SIM115
    with source:
        payload = source.read()
    # Nothing the workers would refuse gets a signature (EnvelopeRejected, exit 2).
    decoders = {"action": decode_action, "delegation": decode_delegation, "cancel": decode_cancel}
    decoders[args.kind](payload)
    for name, value in sign_envelope(payload, read_seed_file(args.key)).items():
        print(f"{name}:{value}")
    return 0


# --- parser -----------------------------------------------------------------------------


def _bus_flags(parser: argparse.ArgumentParser) -> None:
    import os

    parser.add_argument(
        "--nats-url", default=os.environ.get("AIPD_NATS_URL", "nats://127.0.0.1:4222")
    )
    parser.add_argument("--prefix", default=os.environ.get("AIPD_SUBJECT_PREFIX", "aip"))


def _keys_file_flag(parser: argparse.ArgumentParser, flag: str, env: str, help: str) -> None:
    """A trusted-keys file flag whose default is the setting `env` names."""
    import os

    default = os.environ.get(env)
    parser.add_argument(
        flag, type=Path, default=Path(default) if default else None, help=f"{help} (env {env})"
    )


def _verify_flag(parser: argparse.ArgumentParser) -> None:
    _keys_file_flag(
        parser,
        "--trusted-worker-keys",
        "AIPD_TRUSTED_WORKER_KEYS_FILE",
        "public nkeys of trusted workers, one per line: results and chunk chains "
        "that do not verify are refused",
    )


def add_commands(sub: Any) -> None:

    submit = sub.add_parser("submit", help="publish an Action and print its id")
    _bus_flags(submit)
    submit.add_argument("--endpoint", required=True)
    submit.add_argument("--operation", required=True, help="e.g. models, operator")
    submit.add_argument("--input", type=_json_input, default={}, help="JSON object or @file")
    submit.add_argument("--principal", required=True, help="principal id of the caller")
    submit.add_argument("--principal-kind", default="user")
    submit.add_argument("--tenant")
    submit.add_argument("--revision", type=int, help="credential revision of the principal")
    submit.add_argument("--issuer", help="authentication issuer of the principal")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--timeout-ms", type=int)
    submit.add_argument("--action-id", help="reuse an id (a replay); default: a new one")
    submit.add_argument("--sign-key", type=Path, help="gateway nkey seed file to sign with")
    submit.add_argument("--wait", type=float, metavar="SECONDS", help="then follow it")
    _verify_flag(submit)
    submit.set_defaults(func=cmd_submit)

    tail = sub.add_parser("tail", help="follow an Action's chunks, then print its result")
    _bus_flags(tail)
    tail.add_argument("action_id")
    tail.add_argument("--endpoint", required=True)
    tail.add_argument("--from-seq", type=int, default=0)
    tail.add_argument("--timeout", type=float, default=300.0)
    _verify_flag(tail)
    tail.set_defaults(func=cmd_tail)

    result = sub.add_parser("result", help="print an Action's stored result")
    _bus_flags(result)
    result.add_argument("action_id")
    result.add_argument("--endpoint", required=True)
    result.add_argument("--wait", type=float, metavar="SECONDS")
    _verify_flag(result)
    result.set_defaults(func=cmd_result)

    cancel = sub.add_parser("cancel", help="request cancellation of an Action")
    _bus_flags(cancel)
    cancel.add_argument("action_id")
    cancel.add_argument("--endpoint", required=True)
    cancel.add_argument("--requested-by", required=True)
    cancel.add_argument("--reason", default="")
    cancel.add_argument("--sign-key", type=Path)
    cancel.set_defaults(func=cmd_cancel)

    manifest = sub.add_parser("manifest", help="ask a worker for an endpoint's manifest")
    _bus_flags(manifest)
    manifest.add_argument("--endpoint", required=True)
    manifest.set_defaults(func=cmd_manifest)

    audit = sub.add_parser("audit", help="print an Action's audit receipt chain in order")
    _bus_flags(audit)
    audit.add_argument("action_id", help="an Action id, or a DLQ entry's Aip-Dlq-Id (dlq_…)")
    audit.add_argument("--endpoint", required=True)
    audit.add_argument("--json", action="store_true", help="one JSON receipt per line")
    _verify_flag(audit)
    _keys_file_flag(
        audit,
        "--trusted-gateway-keys",
        "AIPD_TRUSTED_GATEWAY_KEYS_FILE",
        "public nkeys of trusted gateways: their own tool_call receipts verify against these",
    )
    audit.set_defaults(func=cmd_audit)

    sign = sub.add_parser("sign", help="print Aip-Signer/Aip-Signature headers for a payload")
    sign.add_argument("payload", help="the exact payload file to sign, or - for stdin")
    sign.add_argument("--key", type=Path, required=True, help="gateway nkey seed file")
    sign.add_argument(
        "--kind",
        choices=("action", "delegation", "cancel"),
        default="action",
        help="what the payload is; it is decoded as the workers do before it is signed",
    )
    sign.set_defaults(func=cmd_sign)
