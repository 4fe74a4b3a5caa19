"""The publisher's commands on the bus: submit, tail, result, cancel, manifest, audit, sign.

Each connects for one command (`connect_nats_for_command`, failing fast), signs with the
gateway key it is given (`--sign-key`, else `AIPD_GATEWAY_SIGNING_KEY_FILE`; `submit` and
`cancel` publish nothing unsigned), and believes a result or chunk chain only when it
verifies against the trusted worker keys (`--trusted-worker-keys`). Exit statuses are
`worker.commands.exit_codes.Exit`: a wait reports how the Action ended, and one that ends
without a result says whether the Action was dead-lettered (`worker/commands/wait_outcome.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from schemas.action import Action
from schemas.chunk import StreamChunk
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.result import ActionResult
from worker.commands.cli_settings import settings_from
from worker.commands.exit_codes import Exit, for_status
from worker.commands.timestamps import iso_utc
from worker.commands.wait_outcome import (
    dead_letter_of,
    dlq_position,
    timeout_line,
    unknown_line,
)
from worker.errors import SettingsError
from worker.settings import Settings
from worker.trust.responses import ChunkRetraction

if TYPE_CHECKING:
    from worker.client import AipClient


def _json_input(text: str) -> dict[str, Any]:
    """`--input`: a JSON object, or `@FILE` holding one (SettingsError naming the problem)."""
    try:
        raw = Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text
        value = json.loads(raw)
    except OSError as exc:
        raise SettingsError(f"--input {text}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"--input {text[:64]}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise SettingsError(f"--input {text[:64]}: not a JSON object")
    return value


def _bus_settings(args: argparse.Namespace) -> Settings:
    """A bus command's settings: its `--nats-url` over the `AIPD_*` environment, so the
    NATS credential settings apply as they do to a worker."""
    return settings_from(args, nats_url=args.nats_url)


async def _connect(settings: Settings) -> Any:
    """A connection for one command, failing fast (nats-py loads only when a command runs)."""
    from worker.bus.connections import connect_nats_for_command

    return await connect_nats_for_command(settings)


#: Where a publisher's gateway seed is found when `--sign-key` is not given.
SIGN_KEY_ENV = "AIPD_GATEWAY_SIGNING_KEY_FILE"


def _sign_key(args: argparse.Namespace, settings: Settings) -> Path | None:
    """The gateway seed `submit` and `cancel` sign with: `--sign-key`, else
    `AIPD_GATEWAY_SIGNING_KEY_FILE`.

    Without one the command refuses to publish (SettingsError, exit 2): a worker
    dead-letters an unsigned Action (`connector_host.authentication`), so publishing it
    would only burn its id, and refuses an unsigned cancel. Only a development deployment
    whose workers accept unsigned envelopes (`AIPD_ALLOW_UNSIGNED_ENVELOPES`, set here
    too) publishes unsigned, warned.
    The seed is read now, so a bad file is named before anything is sent.
    """
    from worker.trust.signing import read_seed_file

    path: Path | None = args.sign_key
    if path is None:
        if settings.allow_unsigned_envelopes:
            print(
                "warning: publishing unsigned (no --sign-key / AIPD_GATEWAY_SIGNING_KEY_FILE; "
                "AIPD_ALLOW_UNSIGNED_ENVELOPES is on): only a development worker runs it",
                file=sys.stderr,
            )
            return None
        raise SettingsError(
            "refusing to publish an unsigned Action (workers dead-letter it as "
            "connector_host.authentication): pass --sign-key FILE or set "
            f"{SIGN_KEY_ENV} to the gateway seed the workers trust"
        )
    read_seed_file(path, what="gateway seed file (--sign-key / AIPD_GATEWAY_SIGNING_KEY_FILE)")
    return path


def _prepared_action(args: argparse.Namespace, settings: Settings) -> Action:
    """The Action `submit` publishes: `--action-file`'s as it is (already approved: its
    id, request and principal are what the approval's fingerprint bound), or one built
    from the flags. A prepared Action older than the workers' envelope age is refused
    here: they would dead-letter it as a replay."""
    from worker.commands.trust_admin import load_action_file

    if args.action_file is not None:
        built = {
            flag: getattr(args, dest)
            for flag, dest in _BUILD_FLAGS.items()
            if getattr(args, dest) is not None
        }
        if built:
            raise SettingsError(
                f"--action-file publishes the Action in the file as it is; drop "
                f"{', '.join(sorted(built))} (they would build another one)"
            )
        action = load_action_file(args.action_file)
        age_ms = time.time_ns() // 1_000_000 - action.created_at_unix_ms
        if age_ms > settings.max_envelope_age_ms:
            raise EnvelopeRejected(
                ErrorCode.HOST_REPLAY,
                f"{args.action_file}'s Action was created {age_ms // 1000} s ago, beyond "
                f"AIPD_MAX_ENVELOPE_AGE_MS ({settings.max_envelope_age_ms // 1000} s): write "
                "it again (submit --write-action) and approve the new one",
            )
        return action
    missing = [
        flag
        for flag in ("--endpoint", "--operation", "--principal")
        if not getattr(args, flag.removeprefix("--").replace("-", "_"))
    ]
    if missing:
        raise SettingsError(
            f"submit needs {', '.join(missing)} (or --action-file with a prepared Action)"
        )
    from worker.client import AipClient

    # build_action reads nothing of the client: writing or checking an Action needs no
    # connection (`--write-action` opens none).
    return AipClient.__new__(AipClient).build_action(
        authentication_issuer=args.issuer,
        endpoint_id=args.endpoint,
        operation=args.operation,
        input=_json_input(args.input) if args.input is not None else {},
        principal_id=args.principal,
        principal_kind=args.principal_kind,
        tenant_id=args.tenant,
        credential_revision=args.revision,
        idempotency_key=args.idempotency_key,
        timeout_ms=args.timeout_ms,
        action_id=args.action_id,
    )


#: The flags that build an Action (flag -> dest); `--action-file` takes none of them.
_BUILD_FLAGS = {
    "--operation": "operation",
    "--input": "input",
    "--principal": "principal",
    "--tenant": "tenant",
    "--revision": "revision",
    "--issuer": "issuer",
    "--idempotency-key": "idempotency_key",
    "--timeout-ms": "timeout_ms",
    "--action-id": "action_id",
}


async def cmd_submit(args: argparse.Namespace) -> int:
    from schemas.ids import split_capability

    settings = _bus_settings(args)
    action = _prepared_action(args, settings)
    endpoint_id, _ = split_capability(action.capability)
    if args.endpoint is not None and args.endpoint != endpoint_id:
        raise SettingsError(
            f"--endpoint {args.endpoint} but the Action's capability {action.capability} is "
            f"endpoint {endpoint_id}'s"
        )
    if args.write_action is not None:
        from worker.wire.actions import GATEWAY_SENDER, decode_action, encode_action

        # The prepared Action as an unsigned AIP Action Envelope: `approve` reads it, and
        # `submit --action-file` publishes it signed (EnvelopeRejected if it cannot travel).
        payload = encode_action(action, signer=None, sender=GATEWAY_SENDER)
        decode_action(payload, max_bytes=settings.max_envelope_bytes)
        with args.write_action.open("xb") as out:  # never over a prepared (approved) one
            out.write(payload)
        print(action.id)
        return Exit.OK
    sign_key = _sign_key(args, settings)
    nc, client = await _signing_client(
        args,
        settings,
        sign_key=sign_key,
        trusted_worker_keys=_trusted_worker_keys(args) if args.wait else None,
    )
    try:
        dlq_from = await dlq_position(nc.jetstream(), client.subjects) if args.wait else 1
        handle = await client.publish(action)
        if args.ack:
            # AIP's Ack body, as the native binding answers an `async` Action.
            print(msgspec.json.encode(handle.ack).decode(), flush=True)
        else:
            print(handle.action_id, flush=True)
        if handle.duplicate:
            print(
                f"warning: the stream already held these exact envelope bytes for {action.id} "
                "inside its duplicate window (its Nats-Msg-Id is bound to them), so this "
                "publish was not stored: the first copy is the one that runs",
                file=sys.stderr,
            )
        if args.wait:
            return await _follow(
                client,
                endpoint_id,
                handle.action_id,
                0,
                args.wait,
                envelope_sha256=handle.envelope_sha256,
                dlq_from=dlq_from,
                envelope=args.envelope,
            )
    finally:
        await nc.drain()
    return Exit.OK


async def _signing_client(
    args: argparse.Namespace,
    settings: Settings,
    *,
    sign_key: Path | None,
    trusted_worker_keys: Path | None = None,
) -> tuple[Any, AipClient]:
    """The connection and a client that signs with `sign_key` and refuses, before signing,
    an envelope over the deployment's `AIPD_MAX_ENVELOPE_BYTES` (what `submit` and `cancel`
    publish)."""
    from worker import tracing
    from worker.client import AipClient

    tracing.configure("aip-hermes-client")  # `submit` starts the trace the workers continue
    nc = await _connect(settings)
    client = AipClient(
        nc,
        prefix=args.prefix,
        sign_key=sign_key,
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


async def _follow(
    client: AipClient,
    endpoint: str,
    action_id: str,
    from_seq: int,
    timeout_s: float,
    *,
    envelope_sha256: str | None = None,
    dlq_from: int = 1,
    text: bool = False,
    verified_only: bool = False,
    envelope: bool = False,
) -> int:
    """Print the chunks, then the result; the exit status says how the Action ended. A
    wait that ends without a result says whether the Action was dead-lettered (REFUSED)
    or not (TIMEOUT). UnverifiedResponse goes to the CLI's handler (UNVERIFIED).

    JSON lines are AIP's own shapes: each chunk's StreamChunk and the result's
    ActionResult, as published (`envelope`: the whole Envelopes, byte for byte)."""
    handle = client.handle(endpoint, action_id, envelope_sha256=envelope_sha256)
    try:
        async with asyncio.timeout(timeout_s):
            async for item in handle.chunk_envelopes(
                from_seq=from_seq, verified_only=verified_only
            ):
                if isinstance(item, ChunkRetraction):
                    line = retraction_text(item) if text else msgspec.json.encode(item).decode()
                else:
                    line = (
                        chunk_text(item.chunk) if text else aip_line(item.data, envelope=envelope)
                    )
                print(line, flush=True)
            believed = await handle.result_envelope(timeout_s=timeout_s)
    except TimeoutError:
        return await _no_result(client, endpoint, action_id, timeout_s, envelope_sha256, dlq_from)
    result = believed.result
    print(_result_text(result) if text else aip_line(believed.data, envelope=envelope), flush=True)
    return for_status(result.status)


def aip_line(data: bytes, *, envelope: bool) -> str:
    """One AIP Envelope as published, for a JSON line: its one body payload (the
    ActionResult, the StreamChunk) as compact JSON, or with `envelope` the whole Envelope
    byte for byte (canonical JSON, its signature verifiable)."""
    if envelope:
        return data.decode("utf-8")
    (payload,) = json.loads(data)["body"].values()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


async def _no_result(
    client: AipClient,
    endpoint: str,
    action_id: str,
    timeout_s: float,
    envelope_sha256: str | None,
    dlq_from: int,
) -> int:
    from nats.errors import Error as NatsError

    try:
        entry = await dead_letter_of(
            client.nc.jetstream(),
            client.subjects,
            endpoint,
            action_id,
            envelope_sha256=envelope_sha256,
            from_seq=dlq_from,
            trusted=client.trusted_worker_keys,
        )
    except NatsError as exc:
        print(unknown_line(action_id, endpoint, timeout_s, exc), file=sys.stderr)
        return Exit.TIMEOUT
    if entry is not None:
        print(entry.describe(action_id, endpoint), file=sys.stderr)
        return Exit.REFUSED
    print(timeout_line(action_id, endpoint, timeout_s), file=sys.stderr)
    return Exit.TIMEOUT


def chunk_text(chunk: StreamChunk) -> str:
    """One chunk for people: time, seq, kind, then its payload as compact JSON."""
    payload = "" if chunk.payload is None else msgspec.json.encode(chunk.payload).decode()
    return f"{iso_utc(chunk.ts_unix_ms)} #{chunk.seq:<4} {chunk.kind.value:<16} {payload}"


def retraction_text(retraction: ChunkRetraction) -> str:
    """A retraction for people: which seqs printed above were not the Action's, and that its
    own chunks follow from the first of them."""
    span = f"#{retraction.from_seq}" + (
        f"..#{retraction.to_seq}" if retraction.to_seq != retraction.from_seq else ""
    )
    return (
        f"retracted {span}: not on the chain the signed result vouches for (a superseded "
        f"worker's late chunks, or forged); the Action's chunks follow from #{retraction.from_seq}"
    )


def _result_text(result: ActionResult) -> str:
    """The result for people: its status, who settled it when, then output or error."""
    head = (
        f"{iso_utc(result.settled_at_unix_ms)} result {result.status.value} "
        f"(settled by {result.settled_by}, fence {result.fence})"
    )
    if result.error is not None:
        return f"{head}\nerror: {result.error.code}: {result.error.message}"
    return f"{head}\noutput: {msgspec.json.encode(result.output).decode()}"


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
            text=args.format == "text",
            verified_only=args.verified_only,
            envelope=args.envelope,
        )
    finally:
        await nc.drain()


async def cmd_result(args: argparse.Namespace) -> int:
    from worker.client import AipClient

    nc = await _connect(_bus_settings(args))
    client = AipClient(nc, prefix=args.prefix, trusted_worker_keys=_trusted_worker_keys(args))
    try:
        if args.wait:
            try:
                believed = await client.handle(args.endpoint, args.action_id).result_envelope(
                    timeout_s=args.wait
                )
            except TimeoutError:
                return await _no_result(client, args.endpoint, args.action_id, args.wait, None, 1)
        else:
            found = await client.stored_result_envelope(args.endpoint, args.action_id)
            if found is None:
                print(
                    f"no result yet for {args.action_id} on endpoint {args.endpoint!r} "
                    "(--wait SECONDS waits for it)",
                    file=sys.stderr,
                )
                return Exit.FAILED
            believed = found
    finally:
        await nc.drain()
    print(aip_line(believed.data, envelope=args.envelope))
    return for_status(believed.result.status)


async def cmd_cancel(args: argparse.Namespace) -> int:
    settings = _bus_settings(args)
    nc, client = await _signing_client(args, settings, sign_key=_sign_key(args, settings))
    try:
        outcome = await client.cancel(
            args.endpoint,
            args.action_id,
            reason=args.reason,
            requested_by=args.requested_by,
            requester_kind=args.requester_kind,
            wait_s=args.wait,
        )
    finally:
        await nc.drain()
    print(msgspec.json.encode(outcome.to_builtins()).decode())
    return Exit.OK if outcome.accepted else Exit.FAILED


async def cmd_manifest(args: argparse.Namespace) -> int:
    from worker.client import AipClient

    nc = await _connect(_bus_settings(args))
    try:
        print(json.dumps(await AipClient(nc, prefix=args.prefix).manifest(args.endpoint), indent=2))
    finally:
        await nc.drain()
    return Exit.OK


async def cmd_audit(args: argparse.Namespace) -> int:
    """Print an Action's receipt chain in order: what every worker decided about it.

    With trusted worker keys only receipts a trusted worker signed are in the chain (a
    gateway's `tool_call` receipt may be signed by a trusted gateway key instead); every
    other message on the subject, forged or malformed, is reported on stderr with its
    audit-stream sequence and left out, and none of them stops the command. No receipt at
    all exits FAILED.
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
            f"{iso_utc(receipt.ts_unix_ms)} {receipt.worker_id:>16} fence={receipt.fence:<3} "
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
        return Exit.FAILED
    return Exit.OK


async def cmd_sign(args: argparse.Namespace) -> int:
    """Sign a payload for publishers using the `nats` CLI: an Action, Cancel or
    DelegationRequest Envelope is printed signed (the AIP signature is inside it)."""
    from worker.aip.signing import AipSigner
    from worker.trust.signing import read_seed_file
    from worker.wire.actions import sign_action_envelope
    from worker.wire.cancels import sign_cancel_envelope
    from worker.wire.delegations import sign_delegation_envelope

    # A one-shot command: nothing else runs on the loop while the file is read.
    source = sys.stdin.buffer if args.payload == "-" else Path(args.payload).open("rb")  # noqa: ASYNC230, SIM115
    with source:
        payload = source.read()
    # Nothing the workers would refuse gets a signature (EnvelopeRejected, exit 2).
    if args.kind == "action":
        signer = AipSigner.from_nkey_seed(read_seed_file(args.key))
        sys.stdout.buffer.write(sign_action_envelope(payload, signer=signer) + b"\n")
        return 0
    if args.kind == "cancel":
        signer = AipSigner.from_nkey_seed(read_seed_file(args.key))
        sys.stdout.buffer.write(sign_cancel_envelope(payload, signer=signer) + b"\n")
        return 0
    signer = AipSigner.from_nkey_seed(read_seed_file(args.key))
    sys.stdout.buffer.write(sign_delegation_envelope(payload, signer=signer) + b"\n")
    return 0


# --- parser -----------------------------------------------------------------------------


def _bus_flags(parser: argparse.ArgumentParser) -> None:
    import os

    parser.add_argument(
        "--nats-url",
        default=os.environ.get("AIPD_NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS server URL(s), comma-separated (env AIPD_NATS_URL; the AIPD_NATS_* "
        "credential files apply too)",
    )
    parser.add_argument(
        "--prefix",
        default=os.environ.get("AIPD_SUBJECT_PREFIX", "aip"),
        help="subject prefix of the deployment (env AIPD_SUBJECT_PREFIX)",
    )


def _keys_file_flag(parser: argparse.ArgumentParser, flag: str, env: str, help: str) -> None:
    """A file flag whose default is the setting `env` names."""
    import os

    default = os.environ.get(env)
    parser.add_argument(
        flag, type=Path, default=Path(default) if default else None, help=f"{help} (env {env})"
    )


def _envelope_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--envelope",
        action="store_true",
        help="JSON lines are the whole AIP Envelopes as published (default: their "
        "ActionResult / StreamChunk bodies)",
    )


def _verify_flag(parser: argparse.ArgumentParser) -> None:
    _keys_file_flag(
        parser,
        "--trusted-worker-keys",
        "AIPD_TRUSTED_WORKER_KEYS_FILE",
        "public nkeys of trusted workers, one per line: results and chunk chains "
        "that do not verify are refused",
    )


def _sign_key_flag(parser: argparse.ArgumentParser, what: str) -> None:
    _keys_file_flag(
        parser,
        "--sign-key",
        SIGN_KEY_ENV,
        f"owner-only gateway nkey seed file that signs {what}; without one nothing is published",
    )


def _endpoint_flag(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--endpoint", required=required, help="the Hermes endpoint id (as in AIPD_HERMES_ENDPOINTS)"
    )


def _action_id_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action_id", help="the Action id (act_ + 32 hex)")


def add_commands(sub: Any) -> None:

    submit = sub.add_parser(
        "submit",
        help="publish a signed Action and print its id (--wait: follow it to its result)",
        description="Publish an Action, signed with --sign-key or AIPD_GATEWAY_SIGNING_KEY_FILE, "
        "built from the flags or prepared in --action-file (governed publishing: "
        "submit --write-action FILE, approve --action-file FILE, submit --action-file FILE).",
    )
    _bus_flags(submit)
    _endpoint_flag(submit, required=False)
    submit.add_argument(
        "--operation", help="e.g. models, operator (required without --action-file)"
    )
    submit.add_argument("--input", help="the Action's input: a JSON object, or @FILE holding one")
    submit.add_argument(
        "--principal", help="principal id of the caller (required without --action-file)"
    )
    submit.add_argument("--principal-kind", default="user", help="principal kind (default user)")
    submit.add_argument("--tenant", help="tenant of the principal")
    submit.add_argument("--revision", type=int, help="credential revision of the principal")
    submit.add_argument("--issuer", help="authentication issuer of the principal")
    submit.add_argument("--idempotency-key", help="default: the Action id")
    submit.add_argument("--timeout-ms", type=int, help="the Action's timeout_ms")
    submit.add_argument("--action-id", help="reuse an id (a replay); default: a new one")
    submit.add_argument(
        "--action-file",
        help="publish this prepared Action JSON as it is (e.g. after `approve --action-file`); "
        "'-' reads stdin; takes none of the flags that build one",
    )
    submit.add_argument(
        "--write-action",
        type=Path,
        metavar="FILE",
        help="write the Action built from the flags to FILE (a new file) and print its id, "
        "publishing nothing (for `approve --action-file FILE`, then `submit --action-file FILE`)",
    )
    _sign_key_flag(submit, "the Action")
    submit.add_argument(
        "--ack",
        action="store_true",
        help="print the publish's answer as AIP's Ack body (one JSON line: action_id, status "
        "queued, or cached when the stream already held these exact envelope bytes) instead "
        "of the bare Action id",
    )
    submit.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="then print its chunks and result; exit status by outcome (README: Exit codes)",
    )
    _verify_flag(submit)
    _envelope_flag(submit)
    submit.set_defaults(func=cmd_submit)

    tail = sub.add_parser("tail", help="follow an Action's chunks, then print its result")
    _bus_flags(tail)
    _action_id_arg(tail)
    _endpoint_flag(tail)
    tail.add_argument("--from-seq", type=int, default=0, help="start at this chunk seq")
    tail.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for the result (300)"
    )
    tail.add_argument(
        "--format",
        choices=("json", "text"),
        default="json",
        help="json: one raw JSON document per line; text: ISO 8601 UTC times, for people",
    )
    tail.add_argument(
        "--verified-only",
        action="store_true",
        help="print no chunk before the signed result vouches for it (all at the end): "
        "never one off the Action's chain, forged or a superseded worker's",
    )
    _verify_flag(tail)
    _envelope_flag(tail)
    tail.set_defaults(func=cmd_tail)

    result = sub.add_parser("result", help="print an Action's stored result")
    _bus_flags(result)
    _action_id_arg(result)
    _endpoint_flag(result)
    result.add_argument(
        "--wait", type=float, metavar="SECONDS", help="wait up to SECONDS for the result"
    )
    _verify_flag(result)
    _envelope_flag(result)
    result.set_defaults(func=cmd_result)

    cancel = sub.add_parser("cancel", help="request cancellation of an Action")
    _bus_flags(cancel)
    _action_id_arg(cancel)
    _endpoint_flag(cancel)
    cancel.add_argument(
        "--requested-by", required=True, help="who asks: the Cancel's `from` (authorized, recorded)"
    )
    cancel.add_argument(
        "--requester-kind",
        choices=("human", "agent", "service", "tenant", "customer", "contact", "system"),
        help="the requester's AIP Principal kind (default: from the id's prefix)",
    )
    cancel.add_argument("--reason", default="", help="why (recorded)")
    cancel.add_argument(
        "--wait",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the cancel to settle the Action (the worker's "
        "AIPD_CANCEL_REPLY_WAIT_MS caps it); the answer is then its terminal result",
    )
    _sign_key_flag(cancel, "the cancel request")
    cancel.set_defaults(func=cmd_cancel)

    manifest = sub.add_parser("manifest", help="ask a worker for an endpoint's manifest")
    _bus_flags(manifest)
    _endpoint_flag(manifest)
    manifest.set_defaults(func=cmd_manifest)

    audit = sub.add_parser("audit", help="print an Action's audit receipt chain in order")
    _bus_flags(audit)
    audit.add_argument("action_id", help="an Action id, or a DLQ entry's own id (dlq_…)")
    _endpoint_flag(audit)
    audit.add_argument(
        "--json", action="store_true", help="one raw JSON receipt per line (Unix ms times)"
    )
    _verify_flag(audit)
    _keys_file_flag(
        audit,
        "--trusted-gateway-keys",
        "AIPD_TRUSTED_GATEWAY_KEYS_FILE",
        "public nkeys of trusted gateways: their own tool_call receipts verify against these",
    )
    audit.set_defaults(func=cmd_audit)

    sign = sub.add_parser(
        "sign",
        help="print an Action, Cancel or DelegationRequest Envelope signed",
    )
    sign.add_argument("payload", help="the exact payload file to sign, or - for stdin")
    sign.add_argument("--key", type=Path, required=True, help="gateway nkey seed file")
    sign.add_argument(
        "--kind",
        choices=("action", "delegation", "cancel"),
        default="action",
        help="what the payload is; it is decoded as the workers do before it is signed",
    )
    sign.set_defaults(func=cmd_sign)
