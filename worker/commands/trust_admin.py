"""Operator commands of the trust layer: `keys generate` and `approve`.

`approve --as X --key SEEDFILE` signs the decision with X's seed; the worker accepts it only
if that signature verifies against X's membership (`public_key` in the authority file). It
adds one member's decision and prints it with how many of the N approvals the capability's
quorum requires now exist (`approvals`, `required`), and the AIP `ApprovalDecision` a
publisher may carry in the Action (`approval_decision`); the Action runs once N distinct members
approved, and one `--deny` ends it.

`approve` takes the Action itself (`--action-file`, the JSON the publisher will send; `-`
reads stdin) rather than a capability plus input: the fingerprint is then computed by the
same code, from the same bytes, as when the Action runs, so what was read is exactly what
was approved, and the Action's tenant and principal (needed for the membership and
self-approval checks) come with it. The positional ACTION_ID must equal the file's `id`,
which guards against deciding on the wrong file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec
from redis.exceptions import RedisError

from schemas.action import Action
from schemas.approval import ApprovalDecision, ApprovalRecord
from schemas.errors import EnvelopeRejected
from worker.bus.connections import approver_unreachable, open_approver_redis_for
from worker.commands.cli_settings import (
    APPROVER_REDIS,
    AUTHORITY,
    add_settings_flags,
    settings_from,
)
from worker.commands.exit_codes import Exit
from worker.errors import ApprovalRefused, ConnectorError, TrustConfigError
from worker.settings import Settings
from worker.store.approvals import read_records
from worker.store.clock import redis_now_ms
from worker.trust.approval_ledger import DEFAULT_APPROVAL_TTL_MS, Recorded, record_decision
from worker.trust.authority import ApprovalAuthority
from worker.trust.signing import generate_keypair, read_seed_file, write_seed_file
from worker.wire.actions import decode_action

EXIT_FAILED = Exit.FAILED
EXIT_CONFIG = Exit.CONFIGURATION
EXIT_UNREACHABLE = Exit.UNREACHABLE


def keys_generate(out: Path) -> str:
    """Write a new gateway seed to `out` (0600, never overwriting); return its public key."""
    pair = generate_keypair()
    write_seed_file(out, pair.seed)
    return pair.public_key


def load_action_file(path: str) -> Action:
    """The Action in `path` (`-`: stdin): an AIP Action Envelope (`submit --write-action`
    writes one unsigned), decoded and validated exactly as a worker does; a signature it
    carries must verify, but whose it is does not matter here (submit signs it again)."""
    data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    try:
        return decode_action(data)[0]
    except EnvelopeRejected as exc:
        raise ValueError(f"{path}: not a valid Action ({exc.reason})") from None


async def approve_action(
    settings: Settings,
    action: Action,
    *,
    as_principal: str,
    reason: str,
    decision: ApprovalDecision,
    seed: bytes,
    ttl_ms: int = DEFAULT_APPROVAL_TTL_MS,
) -> Recorded:
    """Record a decision, signed with the approver's `seed`, with the authority file and
    Redis named by `settings`; with the quorum's count after it."""
    if settings.approval_authority_file is None:
        raise TrustConfigError(
            "AIPD_APPROVAL_AUTHORITY_FILE (--approval-authority-file) is required to approve"
        )
    redis = open_approver_redis_for(settings)
    try:
        now = await redis_now_ms(redis)
        try:
            authority = ApprovalAuthority.load(settings.approval_authority_file, now_ms=now)
        except TrustConfigError as exc:
            raise TrustConfigError(f"AIPD_APPROVAL_AUTHORITY_FILE: {exc}") from None
        return await record_decision(
            redis, authority, action, as_principal, reason, decision, seed=seed, ttl_ms=ttl_ms
        )
    finally:
        await redis.aclose()


async def show_approval(settings: Settings, action_id: str) -> list[ApprovalRecord]:
    redis = open_approver_redis_for(settings)
    try:
        return await read_records(redis, action_id)
    finally:
        await redis.aclose()


def _fail(code: int, message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


async def cmd_keys_generate(args: argparse.Namespace) -> int:
    try:
        public_key = keys_generate(args.out)
    except FileExistsError:
        return _fail(EXIT_FAILED, f"{args.out} exists; a seed file is never overwritten")
    except OSError as exc:
        return _fail(EXIT_FAILED, f"{args.out}: {exc.strerror}")
    print(public_key)
    return 0


def public_keys_of(seed_or_file: str) -> tuple[str, str]:
    """The public user nkey (`U…`) and did:key of a seed: read from an owner-only file,
    from stdin (`-`), or given as the seed itself (`SU…`, visible to `ps` and in the
    shell's history: a warning says so)."""
    from worker.aip.did_key import public_key_from_nkey
    from worker.trust.signing import public_key_of

    if seed_or_file == "-":
        seed = sys.stdin.buffer.read().strip()
    elif seed_or_file.startswith("SU") and not Path(seed_or_file).exists():
        print(
            "warning: a seed on the command line is visible to other users (ps) and kept in "
            "the shell's history; pass its file, or - to read it from stdin",
            file=sys.stderr,
        )
        seed = seed_or_file.encode()
    else:
        seed = read_seed_file(Path(seed_or_file), what="seed file")
    nkey = public_key_of(seed)
    return nkey, public_key_from_nkey(nkey).did


async def cmd_keys_public(args: argparse.Namespace) -> int:
    nkey, did = public_keys_of(args.seed)
    print(nkey)
    print(did)
    return Exit.OK


async def cmd_approve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        action = load_action_file(args.action_file)
    except (OSError, ValueError) as exc:
        return _fail(EXIT_CONFIG, str(exc))
    if action.id != args.action_id:
        return _fail(EXIT_CONFIG, f"{args.action_file} holds {action.id}, not {args.action_id}")
    decision = ApprovalDecision.DENIED if args.deny else ApprovalDecision.APPROVED
    try:
        seed = read_seed_file(args.key, what="approver key file (--key)")
    except (OSError, ValueError) as exc:
        return _fail(EXIT_CONFIG, f"--key: {exc}")
    try:
        recorded = await approve_action(
            settings,
            action,
            as_principal=args.as_principal,
            reason=args.reason,
            decision=decision,
            seed=seed,
            ttl_ms=int(args.ttl_minutes * 60_000),
        )
    except TrustConfigError as exc:
        return _fail(EXIT_CONFIG, str(exc))
    except ApprovalRefused as exc:
        return _fail(Exit.REFUSED, str(exc))
    except (RedisError, OSError) as exc:
        return _fail(EXIT_UNREACHABLE, approver_unreachable(exc))
    print(msgspec.json.encode(_recorded_document(recorded)).decode())
    if decision is ApprovalDecision.APPROVED:
        print(
            f"{recorded.approvals} of {recorded.required} approvals recorded for {action.id}"
            + ("" if recorded.approvals >= recorded.required else "; the quorum is not met yet"),
            file=sys.stderr,
        )
    else:
        print(f"{action.id} is denied: it will not run", file=sys.stderr)
    return 0


def _recorded_document(recorded: Recorded) -> dict[str, Any]:
    """What `approve` prints: the record, the quorum count, and the AIP decision."""
    document: dict[str, Any] = msgspec.to_builtins(recorded.record)
    document["approvals"] = recorded.approvals
    document["required"] = recorded.required
    document["approval_decision"] = msgspec.to_builtins(recorded.view)
    return document


async def cmd_approval_show(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        records = await show_approval(settings, args.action_id)
    except ConnectorError as exc:
        return _fail(
            EXIT_UNREACHABLE, f"{exc.message}; check AIPD_APPROVER_REDIS_URL or AIPD_REDIS_URL"
        )
    except ValueError as exc:
        return _fail(EXIT_CONFIG, str(exc))
    if not records:
        return _fail(EXIT_FAILED, f"no decision is recorded for {args.action_id}")
    for record in records:  # one per approver, oldest first
        print(msgspec.json.encode(record).decode())
    return 0


def add_commands(subparsers: Any) -> None:
    """Add `keys generate`, `approve` and `approval show` (each sets an async `func`)."""
    keys = subparsers.add_parser("keys", help="nkey seeds for gateways and approvers")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    generate = keys_sub.add_parser(
        "generate",
        help="write a new nkey seed (0600) and print its public key (gateway or approver key)",
    )
    generate.add_argument("--out", type=Path, required=True, help="seed file to create")
    generate.set_defaults(func=cmd_keys_generate)
    public = keys_sub.add_parser(
        "public",
        help="print a seed's public key: the nkey (U…) on the first line, its did:key on "
        "the second",
    )
    public.add_argument(
        "seed",
        metavar="SEED_OR_FILE",
        help="an owner-only seed file (as `keys generate` writes), - for stdin, or the seed",
    )
    public.set_defaults(func=cmd_keys_public)

    approve_cmd = subparsers.add_parser(
        "approve", help="record an approval decision for one Action request"
    )
    approve_cmd.add_argument(
        "action_id", help="the id in --action-file (a guard against the wrong file)"
    )
    approve_cmd.add_argument(
        "--action-file", required=True, help="the Action JSON the publisher sends ('-': stdin)"
    )
    approve_cmd.add_argument(
        "--as", dest="as_principal", required=True, help="approver principal id"
    )
    approve_cmd.add_argument(
        "--key",
        type=Path,
        required=True,
        help="owner-only file with the approver's nkey seed; its public key must be the "
        "membership's public_key (`keys generate` makes one)",
    )
    approve_cmd.add_argument("--reason", required=True, help="why (required, recorded)")
    approve_cmd.add_argument("--deny", action="store_true", help="record a denial (final)")
    approve_cmd.add_argument(
        "--ttl-minutes",
        type=float,
        default=DEFAULT_APPROVAL_TTL_MS / 60_000,
        help="how long an approval stays usable (default 15)",
    )
    add_settings_flags(approve_cmd, APPROVER_REDIS, AUTHORITY)
    approve_cmd.set_defaults(func=cmd_approve)

    approval = subparsers.add_parser("approval", help="inspect approval decisions")
    approval_sub = approval.add_subparsers(dest="approval_command", required=True)
    show = approval_sub.add_parser(
        "show", help="print an Action's recorded decisions (one JSON line per approver)"
    )
    show.add_argument("action_id", help="the Action whose decision to print")
    add_settings_flags(show, APPROVER_REDIS)
    show.set_defaults(func=cmd_approval_show)
