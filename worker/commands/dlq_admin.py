"""`aip-hermes-worker dlq list | show | replay | discard`: a person reads and answers the DLQ.

The DLQ (`aip.hermes.{endpoint}.dlq`, stream `AIP_HERMES_DLQ`) keeps each envelope a worker
refused before any state, with why (a signed `action_status` Envelope in state
`dead_lettered`: `worker/wire/dead_letters.py`). These commands read it with message gets
(`worker/bus/stream_reads.py`, no consumer) and believe only entries a trusted worker signed
(`AIPD_TRUSTED_WORKER_KEYS_FILE`): anyone who may publish on the DLQ subject could otherwise
plant an "entry" for a person to replay. A message that is not an entry is reported and
skipped, never fatal.

`replay` publishes the dead-lettered Action again once its cause is fixed (a trust file, a
publisher's `Nats-Msg-Id`, a worker bug). Not byte for byte, and not under its old id:

- the stream's duplicate window drops a second message under the same `Nats-Msg-Id` (the
  id), and a worker refuses an Action whose `Nats-Msg-Id` is not its id
  (`connector_host.replay`), so the replay is a **new Action id** (`Nats-Msg-Id` = that id);
- a worker refuses an envelope older than `AIPD_MAX_ENVELOPE_AGE_MS`, so it gets a fresh
  `created_at_unix_ms`, and is signed again with the gateway key (`--sign-key`, default
  `AIPD_GATEWAY_SIGNING_KEY_FILE`); the DLQ does not keep the original signature.

Everything else (capability, input, identity, trace, deadline) is the original's. Exactly
once: before publishing, a `dlq_replayed` receipt naming the new id is filed in the entry's
audit chain (`aip.hermes.{endpoint}.audit.{dlq_id}`), signed with the same key, and a
repeated `replay` (after a crash, or run twice) reuses the id that receipt names, so the
stream's deduplication and the worker's idempotency answer the repeat with the first run's
result. Then the entry is deleted from the DLQ. `discard` files a `dlq_discarded` receipt
and deletes the entry. Deleting a stream message needs the NATS admin user in a deployment
with roles (compose/nats/nats.conf).

Not replayable: a truncated entry (only its first bytes were kept), an envelope that does
not decode as an Action, one from another subject than the endpoint's actions, an approval
governed Action (its approval names the old id: approve and publish a new Action), and an
idempotency collision (the original result stands).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from schemas.action import Action
from schemas.audit import Receipt, ReceiptEvent
from schemas.errors import EnvelopeRejected, ErrorCode
from schemas.ids import is_dlq_id, new_action_id
from subjects.grammar import Subjects
from worker.aip.signing import AipSigner
from worker.bus.publisher import receipt_headers
from worker.bus.stream_reads import drain
from worker.commands.cli_settings import add_settings_flags, believed_worker_keys, settings_from
from worker.errors import DlqRefused, TrustConfigError, UnverifiedResponse
from worker.settings import Settings
from worker.trust.responses import verify_dead_letter, verify_receipt
from worker.trust.signing import (
    SIGNER_HEADER,
    TrustedGatewayKeys,
    read_seed_file,
    sign_envelope,
)
from worker.wire.dead_letters import DeadLetter
from worker.wire.receipts import encode_receipt

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3

#: Who files the DLQ commands' receipts (`Receipt.worker_id`).
RECEIPT_AUTHOR = "dlq-admin"
#: Codes whose envelope cannot run under any id: the original result stands.
COLLISIONS = frozenset(
    {ErrorCode.OPERATOR_POLICY.value, ErrorCode.CONFIGURATION_OR_INPUT.value}
)


@dataclass(frozen=True, slots=True)
class Entry:
    """One DLQ entry as stored: its stream sequence and the decoded entry
    (`worker.wire.dead_letters`: the refused bytes kept, why, and by whom)."""

    seq: int
    entry: DeadLetter
    stored_at: dt.datetime | None
    #: The trusted worker key that signed it (None: unsigned entries allowed).
    signer: str | None

    @property
    def dlq_id(self) -> str:
        return self.entry.dlq_id

    @property
    def code(self) -> str:
        return self.entry.facts.code.value

    @property
    def body(self) -> bytes:
        """The refused message's bytes as kept (all of them when `whole`)."""
        return self.entry.facts.kept

    @property
    def whole(self) -> bool:
        return self.entry.whole

    def document(self, *, with_body: bool) -> dict[str, Any]:
        facts = self.entry.facts
        doc: dict[str, Any] = {
            "dlq_id": self.dlq_id,
            "dlq_seq": self.seq,
            "stored_at": self.stored_at.isoformat() if self.stored_at else None,
            "action_id": self.entry.action_id,
            "code": facts.code.value,
            "category": facts.category.value,
            "reason": facts.reason,
            "subject": facts.subject,
            "source_seq": facts.stream_seq,
            "worker": facts.worker_id,
            "size": facts.size,
            "kept": len(facts.kept),
            "sha256": facts.sha256,
            "signed_by": self.signer,
        }
        if self.entry.retry is not None:
            # An Action whose retry policy was spent (`worker/pipeline/exhausted.py`).
            doc["retry"] = self.entry.retry
        if with_body:
            try:
                doc["envelope"] = msgspec.json.decode(self.body)
            except msgspec.DecodeError:
                doc["envelope_bytes"] = self.body.decode("utf-8", "backslashreplace")
        return doc


def _fail(code: int, message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _trusted(settings: Settings) -> TrustedGatewayKeys | None:
    return believed_worker_keys(settings, "DLQ entries")


async def read_entries(
    js: JetStreamContext, subjects: Subjects, endpoint_id: str, trusted: TrustedGatewayKeys | None
) -> list[Entry]:
    """Every entry on the endpoint's DLQ a trusted worker signed (`trusted` None: every
    well-formed one), oldest first; each other message (not a DLQ entry, or not signed by
    a trusted worker) is reported on stderr by its sequence and never shown as an entry."""
    entries = []
    stream = subjects.stream_name("dlq")
    for msg in await drain(js, stream, subjects.dlq(endpoint_id)):
        try:
            entry, signer = verify_dead_letter(msg.data or b"", trusted)
        except UnverifiedResponse as exc:
            print(
                f"warning: ignored DLQ message seq {msg.seq}: not an entry a trusted worker "
                f"signed ({exc})",
                file=sys.stderr,
            )
            continue
        assert msg.seq is not None
        entries.append(Entry(msg.seq, entry, msg.time, signer))
    return entries


async def _find(
    js: JetStreamContext, settings: Settings, endpoint_id: str, dlq_id: str
) -> Entry:
    subjects = Subjects(settings.subject_prefix)
    for entry in await read_entries(js, subjects, endpoint_id, _trusted(settings)):
        if entry.dlq_id == dlq_id:
            return entry
    raise DlqRefused(
        f"no DLQ entry {dlq_id} on endpoint {endpoint_id} (already replayed or discarded? "
        f"see: aip-hermes-worker audit {dlq_id} --endpoint {endpoint_id})"
    )


def replayable(entry: Entry, subjects: Subjects, endpoint_id: str, max_bytes: int) -> Action:
    """The Action a replay would publish again, or `DlqRefused` naming why there is none.
    The entry's own signature is not checked (it may be why it was dead-lettered): the
    replay is signed by the operator's key, who vouches for the content it re-publishes."""
    from worker.wire.actions import decode_action_content

    code = entry.code
    if code in COLLISIONS:
        raise DlqRefused(
            f"{entry.dlq_id} is an idempotency collision ({code}): the original result of "
            "its Action id stands; publish a new Action for new work (or discard this entry)"
        )
    if entry.entry.facts.subject != subjects.actions(endpoint_id):
        raise DlqRefused(
            f"{entry.dlq_id} came from {entry.entry.facts.subject}, not from "
            f"{subjects.actions(endpoint_id)}: only Actions are replayed"
        )
    if not entry.whole:
        raise DlqRefused(
            f"{entry.dlq_id} kept only the first {len(entry.body)} of "
            f"{entry.entry.facts.size} bytes (AIPD_DLQ_KEEP_BYTES): it cannot be replayed"
        )
    try:
        action = decode_action_content(entry.body, max_bytes=max_bytes)
    except EnvelopeRejected as exc:
        raise DlqRefused(
            f"{entry.dlq_id} does not decode as an Action ({exc.code.value}: {exc.reason}); "
            "fix the publisher and publish a new Action"
        ) from None
    if action.approval is not None:
        raise DlqRefused(
            f"{entry.dlq_id} is an approval-governed Action ({action.capability}): its "
            "approval names its old id, so a replay under a new id would be refused; approve "
            "and publish a new Action (then discard this entry)"
        )
    return action


async def _chain(js: JetStreamContext, subjects: Subjects, endpoint_id: str, dlq_id: str) -> list[
    tuple[bytes, dict[str, str]]
]:
    stream = subjects.stream_name("audit")
    return [
        (m.data or b"", {str(k): str(v) for k, v in (m.headers or {}).items()})
        for m in await drain(js, stream, subjects.audit(endpoint_id, dlq_id))
    ]


def earlier_replay(
    chain: list[tuple[bytes, dict[str, str]]], ours: TrustedGatewayKeys
) -> str | None:
    """The Action id an earlier `replay` of this entry filed, signed by this same key;
    receipts signed by anyone else, and what is no receipt, are ignored (they could name an
    id of their choosing)."""
    for data, _ in chain:
        try:
            receipt, _ = verify_receipt(data, ours)
        except UnverifiedResponse:
            continue
        replayed = receipt.details.get("replay_action_id")
        if receipt.event is ReceiptEvent.DLQ_REPLAYED and isinstance(replayed, str):
            return replayed
    return None


async def file_receipt(
    js: JetStreamContext,
    subjects: Subjects,
    endpoint_id: str,
    dlq_id: str,
    event: ReceiptEvent,
    seed: bytes | None,
    **details: str | None,
) -> Receipt:
    """A signed receipt in the entry's audit chain, stored (PubAck) before the caller acts."""
    now_ms = time.time_ns() // 1_000_000
    receipt = Receipt(
        receipt_id=f"{dlq_id}:{event.value}:{now_ms}:{os.getpid()}",
        event=event,
        action_id=dlq_id,
        endpoint_id=endpoint_id,
        worker_id=RECEIPT_AUTHOR,
        ts_unix_ms=now_ms,
        details=dict(details),
    )
    signer = AipSigner.from_nkey_seed(seed.strip()) if seed is not None else None
    data = encode_receipt(receipt, signer=signer)[0]
    headers = receipt_headers()  # no Nats-Msg-Id: it says why
    await js.publish(subjects.audit(endpoint_id, dlq_id), data, headers=headers)
    return receipt


async def _delete(js: JetStreamContext, settings: Settings, entry: Entry) -> None:
    stream = Subjects(settings.subject_prefix).stream_name("dlq")
    try:
        await js.delete_msg(stream, entry.seq)
    except APIError as exc:
        raise DlqRefused(
            f"cannot delete DLQ entry {entry.dlq_id} (seq {entry.seq}): {exc.description}; "
            "deleting a stream message needs the NATS admin user (AIPD_NATS_* settings)"
        ) from None


def _seed(path: Path | None) -> bytes:
    """The gateway seed that signs; a missing or unreadable one is configuration (exit 2)."""
    if path is None:
        raise TrustConfigError(
            "a replay is signed with the gateway's key: pass --sign-key or set "
            "AIPD_GATEWAY_SIGNING_KEY_FILE"
        )
    try:
        return read_seed_file(path, what="gateway key file (--sign-key)")
    except (OSError, ValueError) as exc:
        raise TrustConfigError(f"--sign-key: {exc}") from None


def _own_keys(seed: bytes) -> TrustedGatewayKeys:
    """Only the key this replay signs with: the one whose earlier receipt is believed."""
    return TrustedGatewayKeys.of([sign_envelope(b"", seed)[SIGNER_HEADER]])


# --- commands ---------------------------------------------------------------------------


async def _connected(settings: Settings) -> Any:
    from worker.bus.connections import connect_nats_for_command

    return await connect_nats_for_command(settings)


async def cmd_list(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    nc = await _connected(settings)
    try:
        entries = await read_entries(
            nc.jetstream(), Subjects(settings.subject_prefix), args.endpoint, _trusted(settings)
        )
    finally:
        await nc.close()
    for entry in entries:
        if args.json:
            print(msgspec.json.encode(entry.document(with_body=False)).decode())
            continue
        doc = entry.document(with_body=False)
        when = entry.stored_at.strftime("%Y-%m-%d %H:%M:%S") if entry.stored_at else "?"
        print(f"{entry.dlq_id} {when} {doc['code']:<40} {doc['size']:>8} B  {doc['reason']}")
    if not args.json:
        print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} on the DLQ of "
              f"{args.endpoint}", file=sys.stderr)
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    nc = await _connected(settings)
    try:
        js = nc.jetstream()
        entry = await _find(js, settings, args.endpoint, args.dlq_id)
        subjects = Subjects(settings.subject_prefix)
        try:
            replayable(entry, subjects, args.endpoint, settings.max_envelope_bytes)
            verdict: str = "replayable"
        except DlqRefused as exc:
            verdict = f"not replayable: {exc}"
    finally:
        await nc.close()
    print(msgspec.json.encode({**entry.document(with_body=True), "replay": verdict}).decode())
    return 0


async def cmd_replay(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    seed = _seed(args.sign_key)
    subjects = Subjects(settings.subject_prefix)
    nc = await _connected(settings)
    try:
        js = nc.jetstream()
        entry = await _find(js, settings, args.endpoint, args.dlq_id)
        original = replayable(entry, subjects, args.endpoint, settings.max_envelope_bytes)
        earlier = earlier_replay(
            await _chain(js, subjects, args.endpoint, entry.dlq_id), _own_keys(seed)
        )
        replay_id = earlier or new_action_id()
        if earlier is None:
            await file_receipt(
                js, subjects, args.endpoint, entry.dlq_id, ReceiptEvent.DLQ_REPLAYED, seed,
                replay_action_id=replay_id, original_action_id=original.id,
                code=entry.code, by=args.as_principal, reason=args.reason,
            )
        action = msgspec.structs.replace(
            original, id=replay_id, created_at_unix_ms=time.time_ns() // 1_000_000
        )
        from worker.client import AipClient

        client = AipClient(nc, prefix=settings.subject_prefix, sign_key=args.sign_key)
        handle = await client.publish(action)
        await _delete(js, settings, entry)
    finally:
        await nc.drain()
    again = " (already published by an earlier replay)" if handle.duplicate else ""
    print(
        f"replayed {entry.dlq_id} as {replay_id}{again}; follow it with: aip-hermes-worker "
        f"result {replay_id} --endpoint {args.endpoint} --wait",
        file=sys.stderr,
    )
    print(replay_id)
    return 0


async def cmd_discard(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    seed = None if args.sign_key is None else _seed(args.sign_key)
    subjects = Subjects(settings.subject_prefix)
    nc = await _connected(settings)
    try:
        js = nc.jetstream()
        entry = await _find(js, settings, args.endpoint, args.dlq_id)
        await file_receipt(
            js, subjects, args.endpoint, entry.dlq_id, ReceiptEvent.DLQ_DISCARDED, seed,
            code=entry.code, by=args.as_principal, reason=args.reason,
        )
        await _delete(js, settings, entry)
    finally:
        await nc.drain()
    print(f"discarded {entry.dlq_id}", file=sys.stderr)
    return 0


def _guarded(command: Any) -> Any:
    """Expected failures as one line and an exit code, never a traceback."""

    async def run(args: argparse.Namespace) -> int:
        try:
            result: int = await command(args)
        except DlqRefused as exc:
            return _fail(EXIT_FAILED, str(exc))
        except TrustConfigError as exc:
            return _fail(EXIT_CONFIG, str(exc))
        except (NatsError, OSError) as exc:
            return _fail(
                EXIT_UNREACHABLE,
                f"NATS failed during the command ({type(exc).__name__}: {str(exc)[:200]}); "
                "check AIPD_NATS_URL and the AIPD_NATS_* credential settings",
            )
        return result

    return run


def _dlq_id(text: str) -> str:
    if not is_dlq_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a DLQ entry id (dlq_ + 32 hex)")
    return text


def add_commands(subparsers: Any) -> None:
    """Add `dlq list | show | replay | discard` (each sets an async `func`)."""
    dlq = subparsers.add_parser(
        "dlq", help="read, replay or discard dead-lettered envelopes (docs/publishing.md)"
    )
    sub = dlq.add_subparsers(dest="dlq_command", required=True)
    gateway_key = os.environ.get("AIPD_GATEWAY_SIGNING_KEY_FILE")

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--endpoint", required=True, help="the endpoint whose DLQ to read")
        add_settings_flags(parser)

    listing = sub.add_parser("list", help="the entries on an endpoint's DLQ, oldest first")
    listing.add_argument("--json", action="store_true", help="one JSON document per entry")
    common(listing)
    listing.set_defaults(func=_guarded(cmd_list))

    show = sub.add_parser(
        "show", help="one entry as JSON: why it was refused, the envelope, whether it replays"
    )
    show.add_argument("dlq_id", type=_dlq_id, help="the entry's id (dlq_…)")
    common(show)
    show.set_defaults(func=_guarded(cmd_show))

    for name, func, helptext in (
        ("replay", cmd_replay,
         "publish the entry's Action again under a new id, signed, receipted, exactly once; "
         "then remove the entry"),
        ("discard", cmd_discard, "remove the entry without replaying it (receipted)"),
    ):
        parser = sub.add_parser(name, help=helptext)
        parser.add_argument("dlq_id", type=_dlq_id, help="the entry's id (dlq_…)")
        parser.add_argument("--as", dest="as_principal", required=True,
                            help="who decides (recorded in the receipt)")
        parser.add_argument("--reason", required=True, help="why (recorded in the receipt)")
        parser.add_argument(
            "--sign-key", type=Path, default=Path(gateway_key) if gateway_key else None,
            help="gateway nkey seed file that signs the replayed Action and the receipt "
            "(env AIPD_GATEWAY_SIGNING_KEY_FILE)"
            + ("" if name == "replay" else "; optional: an unsigned receipt is not verified"),
        )
        common(parser)
        parser.set_defaults(func=_guarded(func))
