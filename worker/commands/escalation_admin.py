"""`aip-hermes-worker escalations list | show | resolve`: a human answers an escalation.

Resolving an **approval** escalation answers the paused run: it builds the resume Action
(`{"resume": {"source_action_id", "choice"}}`) under a fresh random id, opened write-once
for the escalation (`ResumeClaim`) so every approver of a quorum decides on the same resume,
records this approver's decision for it through the same code path as `approve` (authority
file, no self-approval, the same member counts once), and, once N distinct members approved
it (N: the authority file's quorum for the operator capability), records the resolution
write-once (it names the resume id) and publishes the resume, carrying the completing
approver's AIP `ApprovalDecision`, signed with `--sign-key`. Before the quorum is met it
records only the decision and says how many of N exist. Running it again after a crash
reuses the resume id the recorded resolution (or claim) names, so nothing is answered twice.
A member choosing another approving answer than the opened one is refused; a member
answering `deny` denies the opened resume (final: it never runs) and answers the run with a
`deny` resume of its own, which one approval suffices for (`required_approvals`): the
escalation is resolved as rejected.

The id is random, not derived from the escalation id: an escalation is public to every
reader of its stream, and a derivable id could be published first by anyone (its real
resume would then be a duplicate and `resolve` would say "answered" while nothing ran).
Nobody sees the random id before the resume carrying it is on the bus. A crash between the
decision and the resolution leaves a decision for an id never published: it expires.

Resolving any **other** escalation records who acknowledged it and why (write-once in
Redis, copied to the stream); it changes nothing else.

The stream's copy of a resolution is an `aip.core.v1.escalation_resolution` Envelope
(`worker.wire.escalations`) signed with the resolver's `--key`: the approver's key for an
answered approval (the key that signs the decision), the acknowledging person's for any
other. Redis stays the authority; the copy is what an AIP reader of the subject sees.

Every command believes only escalations a trusted worker signed
(`AIPD_TRUSTED_WORKER_KEYS_FILE`); one that anyone else appended to the subject is reported
on stderr and ignored: `list` does not show it, `show` and `resolve` refuse it. What an
approval escalation asks is read from the run's own operator binding in Redis (`pending`):
the escalation's copy of the prompt is only a pointer, and `resolve` refuses unless the
binding still waits on that prompt.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from redis.exceptions import RedisError

from schemas.action import Action, Identity
from schemas.aip.approval import ApprovalDecision as AipApprovalDecision
from schemas.approval import ApprovalDecision
from schemas.escalation import (
    Escalation,
    EscalationApproval,
    EscalationKind,
    EscalationResolution,
    ResolutionKind,
    ResumeClaim,
    is_escalation_id,
)
from schemas.ids import capability_id, new_action_id
from schemas.operator import ApprovalChoice
from subjects.grammar import Subjects
from worker.aip.errors import AipWireError
from worker.aip.signing import AipSigner
from worker.bus.connections import approver_unreachable, open_approver_redis_for
from worker.commands.cli_settings import (
    APPROVER_REDIS,
    AUTHORITY,
    NATS,
    WORKER_KEYS,
    add_settings_flags,
    believed_worker_keys,
    settings_from,
)
from worker.commands.exit_codes import Exit
from worker.commands.timestamps import iso_utc, with_iso
from worker.errors import ApprovalRefused, ConnectorError, ResolutionRefused, TrustConfigError
from worker.escalation.ledger import (
    EscalationView,
    Unreadable,
    claim_resume,
    read_escalations,
    read_resolution,
    read_resolutions,
    record_resolution,
)
from worker.fingerprints import approval_fingerprint
from worker.operator.binding import BindingState, decode_binding
from worker.settings import Settings
from worker.store.approvals import ApprovalRecords
from worker.store.clock import redis_now_ms
from worker.store.keys import binding_key
from worker.store.operator_store import OperatorStore
from worker.trust.approval_ledger import Recorded, decision_view, required_approvals
from worker.trust.authority import ApprovalAuthority
from worker.trust.files import describe_principal
from worker.trust.signing import TrustedGatewayKeys, read_seed_file

EXIT_FAILED = Exit.FAILED
EXIT_CONFIG = Exit.CONFIGURATION
EXIT_UNREACHABLE = Exit.UNREACHABLE


def _fail(code: int, message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _escalation_id(text: str) -> str:
    if not is_escalation_id(text):
        raise argparse.ArgumentTypeError("an escalation id is esc_ followed by 32 hex digits")
    return text


def _trusted(settings: Settings) -> TrustedGatewayKeys | None:
    return believed_worker_keys(settings, "escalations")


async def _views(settings: Settings, endpoint_id: str) -> tuple[list[EscalationView], Unreadable]:
    from worker.bus.connections import connect_nats_for_command

    trusted = _trusted(settings)
    nc = await connect_nats_for_command(settings)
    try:
        unreadable = Unreadable()
        views = await read_escalations(
            nc.jetstream(),
            Subjects(settings.subject_prefix),
            endpoint_id,
            unreadable,
            trusted=trusted,
        )
        _warn_skipped(unreadable)
        return views, unreadable
    finally:
        await nc.close()


def _warn_skipped(unreadable: Unreadable) -> None:
    """Say once, on stderr, what was on the subjects and ignored (never shown as real)."""
    if unreadable.count:
        print(
            f"warning: {unreadable.count} unreadable message(s) on the escalation subjects",
            file=sys.stderr,
        )
    for escalation_id, reason in sorted(unreadable.unverified.items()):
        print(
            f"warning: ignored {escalation_id}: not signed by a trusted worker ({reason})",
            file=sys.stderr,
        )


async def _find(settings: Settings, endpoint_id: str, escalation_id: str) -> EscalationView:
    views, unreadable = await _views(settings, endpoint_id)
    for view in views:
        if view.escalation.escalation_id == escalation_id:
            return view
    if escalation_id in unreadable.unverified:
        raise ResolutionRefused(
            f"{escalation_id} is not signed by a trusted worker: it is ignored, never shown "
            "or resolved (someone with publish rights on the escalations subject put it there)"
        )
    raise ResolutionRefused(f"no escalation {escalation_id} on endpoint {endpoint_id}")


async def cmd_list(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        views, _ = await _views(settings, args.endpoint)
    except TrustConfigError as exc:
        return _fail(EXIT_CONFIG, str(exc))
    await _resolutions_from_redis(settings, views)
    shown = [v for v in views if args.all or v.open]
    for view in shown:
        if args.json:
            print(msgspec.json.encode(_document(view)).decode())
            continue
        e = view.escalation
        state = "open" if view.open else f"resolved:{view.resolution.kind.value}"  # type: ignore[union-attr]
        what = e.code.value if e.code else e.status.value
        print(
            f"{e.escalation_id} {iso_utc(e.raised_at_unix_ms)} {state:<20} {e.kind.value:<8} "
            f"{e.action_id} {what}"
        )
    return 0


async def _resolutions_from_redis(settings: Settings, views: list[EscalationView]) -> None:
    """Take each escalation's resolution from Redis, the write-once authority, rather than
    from its copy on `…escalations.resolved` (signed by whoever resolved it, but whether
    that person may resolve is decided only when the record is written). When Redis cannot
    be read the signed copies are shown, with a warning."""
    if not views:
        return
    redis = open_approver_redis_for(settings)
    try:
        stored = await read_resolutions(redis, [v.escalation.escalation_id for v in views])
    except (RedisError, OSError) as exc:
        print(
            f"warning: Redis cannot be read ({type(exc).__name__}): resolutions are shown "
            "from their signed copies on the stream",
            file=sys.stderr,
        )
        return
    finally:
        await redis.aclose()
    for view, resolution in zip(views, stored, strict=True):
        view.resolution = resolution


#: What `show` and `resolve` say about the escalation's own copy of the prompt.
POINTER_NOTE = (
    "the escalation's approval.prompt is a pointer only; what the run waits on is `pending`, "
    "read from the run's operator binding"
)


async def pending_from_binding(redis: Any, approval: EscalationApproval) -> dict[str, Any]:
    """What the paused run itself waits on, from its durable operator binding in Redis
    (the redacted prompt Hermes asked, as the worker retained it), never from the
    escalation's text; `read` says whether it could be read and `matches` whether the
    binding still waits on the prompt this escalation points at."""
    where = binding_key(approval.source_action_id)
    source = f"operator binding {where} (Redis)"
    try:
        stored = await OperatorStore.reader(redis).read(where)
    except (RedisError, OSError) as exc:
        return {
            "read": "failed",
            "from": source,
            "note": f"the Redis user of this command cannot read the operator binding "
            f"({type(exc).__name__}: {str(exc)[:200]}); what the run waits on is unknown, so "
            "do not answer from the escalation's text (resolve refuses)",
        }
    if stored.doc is None:
        return {"read": "missing", "from": source, "note": "the run has no binding (expired?)"}
    try:
        binding = decode_binding(stored.doc)
    except ConnectorError as exc:
        return {"read": "failed", "from": source, "note": exc.message}
    matches = (
        binding.status is BindingState.WAITING_FOR_APPROVAL
        and binding.approval_generation == approval.approval_generation
        and (approval.run_id is None or binding.run_id == approval.run_id)
        and binding.pending_approval is not None
    )
    return {
        "read": "ok",
        "from": source,
        "status": binding.status.value,
        "run_id": binding.run_id,
        "approval_generation": binding.approval_generation,
        "prompt": binding.pending_approval,
        "matches": matches,
    }


async def cmd_show(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        view = await _find(settings, args.endpoint, args.escalation_id)
    except ResolutionRefused as exc:
        return _fail(EXIT_FAILED, str(exc))
    except TrustConfigError as exc:
        return _fail(EXIT_CONFIG, str(exc))
    document: dict[str, Any] = {}
    redis = open_approver_redis_for(settings)
    try:
        # Redis decides, not the stream's copy (which may also be missing: a
        # crash after the write-once record).
        view.resolution = await read_resolution(redis, args.escalation_id)
        approval = view.escalation.approval
        if approval is not None:
            document["pending"] = await pending_from_binding(redis, approval)
            document["note"] = POINTER_NOTE
        if args.reveal:
            from worker.commands.escalation_reveal import reveal

            if args.key is None or args.as_principal is None:
                return _fail(EXIT_CONFIG, "--reveal needs --as (the member) and --key (its seed)")
            try:
                document["revealed"] = await reveal(
                    settings, redis, view.escalation, as_principal=args.as_principal,
                    key_file=args.key, reason=args.reason,
                )
            except ResolutionRefused as exc:
                # Refused like a resolution the approver may not make: not "no such record".
                return _fail(Exit.REFUSED, str(exc))
            except TrustConfigError as exc:
                return _fail(EXIT_CONFIG, str(exc))
    finally:
        await redis.aclose()
    shown = {**_document(view), **document}
    print(msgspec.json.encode(shown if args.json else with_iso(shown)).decode())
    return 0


def _document(view: EscalationView) -> dict[str, Any]:
    return {
        "escalation": msgspec.to_builtins(view.escalation),
        "resolution": msgspec.to_builtins(view.resolution) if view.resolution else None,
    }


def build_resume(
    escalation: Escalation,
    choice: ApprovalChoice,
    *,
    resume_id: str,
    resolve_all: bool,
    decision: AipApprovalDecision | None = None,
    created_at_unix_ms: int = 0,
) -> Action:
    """The resume Action `resume_id` an approval escalation's answer becomes, as the
    source's principal (the only principal, besides the tenant's authority members, the
    worker lets resume the run: `worker.trust.resume_authority`).

    Its request (capability, input and principal: what the decision's fingerprint binds)
    depends only on the escalation and the choice, so a repeated `resolve` decides the same
    request.
    """
    approval = escalation.approval
    if approval is None:
        raise ResolutionRefused("not an approval escalation")
    return Action(
        id=resume_id,
        capability=capability_id(escalation.endpoint_id, "operator"),
        input={
            "resume": {
                "source_action_id": approval.source_action_id,
                "choice": choice.value,
                "resolve_all": resolve_all,
            }
        },
        identity=Identity(
            principal_id=escalation.principal_id,
            principal_kind=escalation.principal_kind,
            tenant_id=escalation.tenant_id,
            authentication_issuer=escalation.authentication_issuer,
            credential_revision=escalation.credential_revision,
        ),
        created_at_unix_ms=created_at_unix_ms,
        idempotency_key=resume_id,
        approval=decision,
    )


@dataclass(frozen=True, slots=True)
class QuorumPending:
    """An approver's decision is recorded, but fewer than `required` distinct members have
    approved the resume: nothing is resolved or published yet."""

    escalation_id: str
    approvals: int
    required: int


async def resolve_approval(
    settings: Settings,
    escalation: Escalation,
    *,
    choice: ApprovalChoice,
    resolve_all: bool,
    as_principal: str,
    reason: str,
    sign_key: Path,
    approver_seed: bytes,
) -> EscalationResolution | QuorumPending:
    """Decide (signed with the approver's `approver_seed`, as `approve --key` does) the
    resume Action that answers `escalation`; once the quorum is met, record the resolution
    and publish the resume (signed with the gateway's `sign_key`)."""
    from worker.bus.connections import connect_nats_for_command
    from worker.client import AipClient
    from worker.commands.trust_admin import approve_action

    approval = escalation.approval
    if approval is None:
        raise ResolutionRefused("not an approval escalation")
    if choice not in approval.choices:
        offered = ", ".join(c.value for c in approval.choices)
        raise ResolutionRefused(f"choice {choice.value!r} was not offered (offered: {offered})")
    redis = open_approver_redis_for(settings)
    try:
        earlier = await read_resolution(redis, escalation.escalation_id)
        if earlier is not None and (earlier.choice is not choice or not earlier.resume_action_id):
            raise ResolutionRefused(_already(earlier))
        if earlier is not None:
            # A repeat after a crash: the run moved on already; finish the publishing.
            resume_id = earlier.resume_action_id
        else:
            # The first decision answers what the run itself waits on.
            _check_pending(await pending_from_binding(redis, approval), escalation)
            # The opened resume's id is one nobody could know before it is published.
            claim = await claim_resume(
                redis,
                ResumeClaim(
                    escalation_id=escalation.escalation_id,
                    resume_action_id=new_action_id(),
                    choice=choice,
                    resolve_all=resolve_all,
                    opened_by=as_principal,
                ),
            )
            resume_id = await _resume_for(
                settings, escalation, claim, choice, resolve_all, as_principal, reason,
                approver_seed,
            )  # fmt: skip
        assert resume_id is not None
        resume = build_resume(escalation, choice, resume_id=resume_id, resolve_all=resolve_all)
        recorded = await _decided(settings, redis, resume, as_principal)
        if recorded is None:
            recorded = await approve_action(
                settings,
                resume,
                as_principal=as_principal,
                reason=reason,
                decision=ApprovalDecision.APPROVED,
                seed=approver_seed,
            )
        if earlier is None and recorded.approvals < recorded.required:
            return QuorumPending(escalation.escalation_id, recorded.approvals, recorded.required)
        resolution = earlier or await record_resolution(
            redis,
            EscalationResolution(
                escalation_id=escalation.escalation_id,
                action_id=escalation.action_id,
                endpoint_id=escalation.endpoint_id,
                kind=ResolutionKind.ANSWERED,
                resolved_by=recorded.record.approver_principal_id,
                reason=recorded.record.reason,
                resolved_at_unix_ms=await redis_now_ms(redis),
                choice=choice,
                resume_action_id=resume.id,
            ),
        )
    finally:
        await redis.aclose()
    if resolution.resume_action_id != resume.id or resolution.choice is not choice:
        raise ResolutionRefused(_already(resolution))
    signed = build_resume(
        escalation,
        choice,
        resume_id=resume.id,
        resolve_all=resolve_all,
        decision=recorded.view,
        created_at_unix_ms=resolution.resolved_at_unix_ms,
    )
    nc = await connect_nats_for_command(settings)
    try:
        client = AipClient(nc, prefix=settings.subject_prefix, sign_key=sign_key)
        await client.publish(signed)
        await _publish_resolution(nc, settings, resolution, approver_seed)
    finally:
        await nc.drain()
    return resolution


async def _resume_for(
    settings: Settings,
    escalation: Escalation,
    claim: ResumeClaim,
    choice: ApprovalChoice,
    resolve_all: bool,
    as_principal: str,
    reason: str,
    approver_seed: bytes,
) -> str:
    """The resume id this approver decides on: the opened one for the same answer; for a
    `deny` against an opened approving answer, a new one, after denying the opened resume
    (a single denial ends the quorum: that resume can never run)."""
    from worker.commands.trust_admin import approve_action

    if claim.choice is choice:
        if claim.resolve_all != resolve_all:
            raise ResolutionRefused(
                f"{escalation.escalation_id}: {describe_principal(claim.opened_by)} opened "
                f"{choice.value!r} with resolve_all={claim.resolve_all}; answer the same"
            )
        return claim.resume_action_id
    if choice is not ApprovalChoice.DENY:
        raise ResolutionRefused(
            f"{escalation.escalation_id}: {describe_principal(claim.opened_by)} opened "
            f"{claim.choice.value!r}; approve that answer, or answer 'deny' to end it"
        )
    opened = build_resume(
        escalation, claim.choice, resume_id=claim.resume_action_id, resolve_all=claim.resolve_all
    )
    await approve_action(
        settings,
        opened,
        as_principal=as_principal,
        reason=reason,
        decision=ApprovalDecision.DENIED,
        seed=approver_seed,
    )
    return new_action_id()


def _check_pending(pending: dict[str, Any], escalation: Escalation) -> None:
    """Refuse unless the run's binding could be read and still waits on this prompt."""
    if pending.get("read") != "ok":
        raise ResolutionRefused(
            f"{escalation.escalation_id}: cannot read what the run waits on from its "
            f"{pending.get('from')}: {pending.get('note')}"
        )
    if not pending.get("matches"):
        raise ResolutionRefused(
            f"{escalation.escalation_id}: the run no longer waits on this prompt (binding "
            f"{pending.get('status')}, approval generation {pending.get('approval_generation')})"
        )


async def _decided(
    settings: Settings, redis: Any, resume: Action, as_principal: str
) -> Recorded | None:
    """This approver's live decision already recorded for this resume (a repeated
    `resolve`), with the quorum's count, if any; a denial by anyone, or a decision for
    another choice, means it cannot be approved."""
    if settings.approval_authority_file is None:
        raise TrustConfigError(
            "AIPD_APPROVAL_AUTHORITY_FILE (--approval-authority-file) is required to approve"
        )
    stored, now = await ApprovalRecords(redis).read_at(resume.id)
    for decision in stored:
        record = decision.record
        if record.decision is not ApprovalDecision.APPROVED:
            raise ResolutionRefused(
                f"the resume {resume.id} was denied by {record.approver_principal_id}"
            )
        if record.input_fingerprint != approval_fingerprint(resume):
            raise ResolutionRefused(
                f"the resume {resume.id} was already decided with another choice by "
                f"{record.approver_principal_id}"
            )
    live = [d for d in stored if d.record.expires_at_unix_ms > now]
    own = [d for d in live if d.record.approver_principal_id == as_principal]
    if not own:
        return None
    try:
        authority = ApprovalAuthority.load(settings.approval_authority_file, now_ms=now)
    except TrustConfigError as exc:
        raise TrustConfigError(f"AIPD_APPROVAL_AUTHORITY_FILE: {exc}") from None
    approvers = {d.record.approver_principal_id for d in live}
    return Recorded(
        own[0].record,
        len(approvers),
        required_approvals(authority, resume),
        decision_view(own[0].record, own[0].signer),
    )


def _already(resolution: EscalationResolution) -> str:
    how = resolution.choice.value if resolution.choice else resolution.kind.value
    return (
        f"{resolution.escalation_id} was already resolved ({how}) by {resolution.resolved_by} "
        f"at {iso_utc(resolution.resolved_at_unix_ms)}"
    )


async def acknowledge(
    settings: Settings, escalation: Escalation, *, as_principal: str, reason: str, seed: bytes
) -> EscalationResolution:
    """Record who took over a non-approval escalation and why (write-once), and copy it to
    the stream signed with that person's `seed`."""
    from worker.bus.connections import connect_nats_for_command

    if not reason.strip():
        raise ResolutionRefused("a reason is required")
    _resolver_signer(seed)  # a key that cannot sign is refused before anything is recorded
    redis = open_approver_redis_for(settings)
    try:
        resolution = await record_resolution(
            redis,
            EscalationResolution(
                escalation_id=escalation.escalation_id,
                action_id=escalation.action_id,
                endpoint_id=escalation.endpoint_id,
                kind=ResolutionKind.ACKNOWLEDGED,
                resolved_by=as_principal,
                reason=reason.strip()[:2_000],
                resolved_at_unix_ms=await redis_now_ms(redis),
            ),
        )
    finally:
        await redis.aclose()
    if resolution.resolved_by != as_principal or resolution.kind is not ResolutionKind.ACKNOWLEDGED:
        raise ResolutionRefused(_already(resolution))
    nc = await connect_nats_for_command(settings)
    try:
        await _publish_resolution(nc, settings, resolution, seed)
    finally:
        await nc.drain()
    return resolution


async def _publish_resolution(
    nc: Any, settings: Settings, resolution: EscalationResolution, seed: bytes
) -> None:
    """Copy `resolution` to the stream as an `escalation_resolution` Envelope signed with
    the resolver's `seed` (the key that signs their decisions)."""
    from worker.bus.publisher import BusPublisher

    publisher = BusPublisher(nc.jetstream(), Subjects(settings.subject_prefix), nc=nc)
    await publisher.escalation_resolution(resolution, signer=_resolver_signer(seed))


def _resolver_signer(seed: bytes) -> AipSigner:
    """The resolver's nkey seed as an AIP signer; ResolutionRefused if it is not one."""
    try:
        return AipSigner.from_nkey_seed(seed.strip())
    except (AipWireError, ValueError) as exc:
        raise ResolutionRefused(f"--key is not a user nkey seed: {exc}") from None


async def _say_pending(settings: Settings, escalation: Escalation) -> None:
    """Tell the approver, before anything is decided, what the run itself waits on."""
    assert escalation.approval is not None
    redis = open_approver_redis_for(settings)
    try:
        pending = await pending_from_binding(redis, escalation.approval)
    finally:
        await redis.aclose()
    if pending.get("read") == "ok":
        print(
            f"answering what the run waits on, from its {pending['from']}: "
            f"{msgspec.json.encode(pending.get('prompt')).decode()} ({POINTER_NOTE})",
            file=sys.stderr,
        )


async def cmd_resolve(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:
        view = await _find(settings, args.endpoint, args.escalation_id)
        escalation = view.escalation
        if escalation.kind is EscalationKind.APPROVAL:
            if args.choice is None or args.sign_key is None or args.key is None:
                return _fail(
                    EXIT_CONFIG,
                    "an approval escalation is answered with --choice, --key (the approver's "
                    "seed that signs the decision) and --sign-key (the gateway seed that "
                    "signs the resume Action)",
                )
            try:
                approver_seed = read_seed_file(args.key, what="approver key file (--key)")
            except (OSError, ValueError) as exc:
                return _fail(EXIT_CONFIG, f"--key: {exc}")
            await _say_pending(settings, escalation)
            resolution = await resolve_approval(
                settings,
                escalation,
                choice=ApprovalChoice(args.choice),
                resolve_all=args.resolve_all,
                as_principal=args.as_principal,
                reason=args.reason,
                sign_key=args.sign_key,
                approver_seed=approver_seed,
            )
        else:
            if args.choice is not None:
                return _fail(EXIT_CONFIG, "--choice answers approval escalations only")
            if args.key is None:
                return _fail(
                    EXIT_CONFIG,
                    "an escalation is acknowledged with --key (your nkey seed, which signs "
                    "the resolution published on the stream)",
                )
            try:
                seed = read_seed_file(args.key, what="resolver key file (--key)")
            except (OSError, ValueError) as exc:
                return _fail(EXIT_CONFIG, f"--key: {exc}")
            resolution = await acknowledge(
                settings,
                escalation,
                as_principal=args.as_principal,
                reason=args.reason,
                seed=seed,
            )
    except (ResolutionRefused, ApprovalRefused) as exc:
        return _fail(Exit.REFUSED, str(exc))
    except TrustConfigError as exc:
        return _fail(EXIT_CONFIG, str(exc))
    except (RedisError, OSError) as exc:
        return _fail(EXIT_UNREACHABLE, approver_unreachable(exc))
    except ConnectorError as exc:
        return _fail(EXIT_UNREACHABLE, exc.message)
    if isinstance(resolution, QuorumPending):
        print(
            f"{resolution.approvals} of {resolution.required} approvals recorded for "
            f"{resolution.escalation_id}; the run resumes once the quorum is met",
            file=sys.stderr,
        )
        print(msgspec.json.encode(
            {"escalation_id": resolution.escalation_id, "approvals": resolution.approvals,
             "required": resolution.required}
        ).decode())  # fmt: skip
        return 0
    print(msgspec.json.encode(resolution).decode())
    return 0


def add_commands(subparsers: Any) -> None:
    """Add `escalations list | show | resolve` (each sets an async `func`)."""
    escalations = subparsers.add_parser("escalations", help="escalations a human must decide")
    sub = escalations.add_subparsers(dest="escalations_command", required=True)

    listing = sub.add_parser("list", help="open escalations of an endpoint (--all: every one)")
    listing.add_argument("--endpoint", required=True, help="the endpoint whose escalations")
    listing.add_argument("--all", action="store_true", help="resolved ones too")
    listing.add_argument(
        "--json", action="store_true", help="one raw JSON document per line (Unix ms times)"
    )
    add_settings_flags(listing, NATS, APPROVER_REDIS, WORKER_KEYS)
    listing.set_defaults(func=cmd_list)

    show = sub.add_parser("show", help="an escalation and its resolution, as JSON")
    show.add_argument("escalation_id", type=_escalation_id, help="esc_ + 32 hex")
    show.add_argument("--endpoint", required=True, help="the endpoint that raised it")
    show.add_argument(
        "--json", action="store_true", help="the raw document (no *_utc companions of times)"
    )
    show.add_argument(
        "--reveal", action="store_true",
        help="also show the command behind an approval escalation (authority members only, "
        "with --as and --key; receipted in the source Action's audit chain)",
    )
    show.add_argument("--as", dest="as_principal", help="with --reveal: the member you are")
    show.add_argument("--key", type=Path, help="with --reveal: that member's nkey seed file")
    show.add_argument("--reason", default="", help="with --reveal: why (recorded)")
    add_settings_flags(show, NATS, APPROVER_REDIS, WORKER_KEYS, AUTHORITY)
    show.set_defaults(func=cmd_show)

    resolve = sub.add_parser(
        "resolve",
        help="answer an approval escalation (--choice, publishes the signed resume) or "
        "acknowledge any other one",
    )
    resolve.add_argument("escalation_id", type=_escalation_id, help="esc_ + 32 hex")
    resolve.add_argument("--endpoint", required=True, help="the endpoint that raised it")
    resolve.add_argument("--as", dest="as_principal", required=True, help="who decides")
    resolve.add_argument("--reason", required=True, help="why (required, recorded)")
    resolve.add_argument(
        "--choice",
        choices=[c.value for c in ApprovalChoice],
        help="the answer to an approval escalation (one it offered)",
    )
    resolve.add_argument("--resolve-all", action="store_true", help="Hermes resolve_all")
    resolve.add_argument(
        "--key",
        type=Path,
        help="your nkey seed file: signs the decision (an approval) and the resolution "
        "Envelope published on the stream",
    )
    resolve.add_argument(
        "--sign-key", type=Path, help="gateway nkey seed file that signs the resume Action"
    )
    add_settings_flags(resolve, NATS, APPROVER_REDIS, WORKER_KEYS, AUTHORITY)
    resolve.set_defaults(func=cmd_resolve)
