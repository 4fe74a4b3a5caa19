"""Who may speak to the native NATS binding, and each request heard once.

Two guarantees of the binding (aip-1.0-wire.md §2.6, the reference gateway's acceptance
policy) are enforced here and nowhere else:

* **The signer is a trusted, bound principal.** `AIPD_AIP_TRUSTED_SIGNERS_FILE` binds each
  `did:key` to one principal; a request's `from.id` / `from.kind` must be that principal,
  and the identity our Action carries is projected from the binding (never from the wire).
  The file is policy like every trust file (`read_policy_file`: regular, under 1 MiB, only
  its owner may write it). One line per signer::

      did:key:z6Mk… PRINCIPAL_ID [kind=KIND] [revision=N] [issuer=URL] [tenant=TENANT]

  `kind` defaults to `service`; `revision` (default 1), `issuer` and `tenant` are the facts
  the workers' identity directory checks the projected identity against. `#` starts a
  comment line.
* **Fresh, and once.** `sent_at` within [now - 300 s, now + 30 s], and each `message_id`
  claimed once, durably: the gateway has no Redis, so the claim is a `create` in a
  JetStream key-value bucket (`AIP_NATIVE_MESSAGE_IDS`, file storage, entries kept for the
  replay window's span). `create` succeeds for exactly one writer however many gateways
  share the queue group, and survives a gateway restart; an entry older than the window
  may go, since `sent_at` refuses such a request anyway.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from schemas.action import Identity
from worker.aip.did_key import public_key_from_did
from worker.aip.errors import AipWireError
from worker.errors import NativeRefusal, TrustConfigError
from worker.trust.files import read_policy_file
from worker.trust.replay import DEFAULT_MAX_AGE_MS, DEFAULT_MAX_SKEW_MS

WHAT: Final = "AIP trusted signers file"
#: The bucket of claimed request message ids.
CLAIMS_BUCKET: Final = "AIP_NATIVE_MESSAGE_IDS"
#: How long a claim is kept: the replay window's span and a margin for clock skew.
CLAIM_TTL_S: Final = (DEFAULT_MAX_AGE_MS + DEFAULT_MAX_SKEW_MS) / 1000 + 60
_KIND_RE: Final = re.compile(r"^(human|agent|service|organization|system|device)\Z")
_FIELD_RE: Final = re.compile(r"^(kind|revision|issuer|tenant)=(\S{1,512})\Z")


@dataclass(frozen=True, slots=True)
class SignerBinding:
    """One trusted signer and the principal it speaks as."""

    did: str
    principal_id: str
    principal_kind: str = "service"
    revision: int = 1
    issuer: str | None = None
    tenant_id: str | None = None

    def identity(self) -> Identity:
        """The identity the Action runs as: the binding's, whatever the request says."""
        return Identity(
            principal_id=self.principal_id,
            principal_kind=self.principal_kind,
            tenant_id=self.tenant_id,
            authentication_issuer=self.issuer,
            credential_revision=self.revision,
        )


def _parse_line(path: Path, number: int, line: str) -> SignerBinding:
    where = f"{WHAT} {path}: line {number}"
    parts = line.split()
    if len(parts) < 2:
        raise TrustConfigError(f"{where}: expected 'did:key:z… PRINCIPAL_ID [key=value…]'")
    did, principal_id, *extras = parts
    try:
        public_key_from_did(did)
    except AipWireError as exc:
        raise TrustConfigError(f"{where}: not an Ed25519 did:key ({exc})") from None
    if len(principal_id) > 512:
        raise TrustConfigError(f"{where}: the principal id is over 512 characters")
    fields: dict[str, str] = {}
    for extra in extras:
        found = _FIELD_RE.match(extra)
        if found is None or found.group(1) in fields:
            raise TrustConfigError(
                f"{where}: {extra[:40]!r} is not one of kind=, revision=, issuer=, tenant= "
                "(each at most once)"
            )
        fields[found.group(1)] = found.group(2)
    kind = fields.get("kind", "service")
    if not _KIND_RE.match(kind):
        raise TrustConfigError(f"{where}: kind {kind[:40]!r} is not an AIP principal kind")
    revision_text = fields.get("revision", "1")
    if not revision_text.isdigit() or int(revision_text) < 1:
        raise TrustConfigError(f"{where}: revision must be a positive integer")
    return SignerBinding(
        did=did,
        principal_id=principal_id,
        principal_kind=kind,
        revision=int(revision_text),
        issuer=fields.get("issuer"),
        tenant_id=fields.get("tenant"),
    )


class TrustedSigners:
    """did:key → the principal it is bound to."""

    def __init__(self, bindings: Mapping[str, SignerBinding]) -> None:
        self._bindings = dict(bindings)

    @classmethod
    def load(cls, path: Path) -> TrustedSigners:
        """The bindings of `path`; TrustConfigError for a file anyone but its owner may
        write, a malformed line, or a did listed twice (refused at start, never at use)."""
        policy = read_policy_file(path, what=WHAT)
        try:
            text = policy.data.decode("utf-8")
        except UnicodeDecodeError:
            raise TrustConfigError(f"{WHAT} {path}: not UTF-8") from None
        bindings: dict[str, SignerBinding] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            binding = _parse_line(path, number, line)
            if binding.did in bindings:
                raise TrustConfigError(f"{WHAT} {path}: line {number} repeats a did")
            bindings[binding.did] = binding
        if not bindings:
            raise TrustConfigError(f"{WHAT} {path}: no signer")
        return cls(bindings)

    def __len__(self) -> int:
        return len(self._bindings)

    def sender_of(self, did: str, sender: Mapping[str, Any] | None) -> SignerBinding:
        """The binding of a request signed by `did` whose `from` is `sender`; NativeRefusal
        `auth.unverified_actor` for an unbound did, `auth.claim_mismatch` for a `from` that
        is not the bound principal."""
        binding = self._bindings.get(did)
        if binding is None:
            raise NativeRefusal(
                "auth.unverified_actor", "the signer's did:key is not a trusted signer"
            )
        if (
            sender is None
            or sender.get("id") != binding.principal_id
            or sender.get("kind") != binding.principal_kind
        ):
            raise NativeRefusal(
                "auth.claim_mismatch", "from is not the principal the signer is bound to"
            )
        return binding


def check_sent_at(sent_at_ms: int, now_ms: int | None = None) -> None:
    """NativeRefusal `replay.message_id` unless `sent_at` is within [now - 300 s, now + 30 s]."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if now - sent_at_ms > DEFAULT_MAX_AGE_MS:
        raise NativeRefusal(
            "replay.message_id",
            f"sent_at is {now - sent_at_ms} ms old; at most {DEFAULT_MAX_AGE_MS} ms is accepted",
        )
    if sent_at_ms - now > DEFAULT_MAX_SKEW_MS:
        raise NativeRefusal(
            "replay.message_id",
            f"sent_at is {sent_at_ms - now} ms in the future; at most {DEFAULT_MAX_SKEW_MS} ms",
        )


async def open_bucket(
    js: JetStreamContext, bucket: str, ttl_s: float, description: str, replicas: int = 1
) -> KeyValue:
    """A gateway's key-value bucket (history 1, file storage, entries kept `ttl_s`), created
    on first start when it is missing: every `create` in it wins for exactly one writer
    across all gateways, and survives their restarts."""
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        return await js.create_key_value(
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=ttl_s,
                storage=StorageType.FILE,
                replicas=replicas,
                description=description,
            )
        )


class MessageClaims:
    """Each request `message_id` claimed once, durably, in a JetStream key-value bucket."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, *, replicas: int = 1) -> MessageClaims:
        description = "aip.native.nats.v1 request message ids (replay guard)"
        return cls(await open_bucket(js, CLAIMS_BUCKET, CLAIM_TTL_S, description, replicas))

    async def claim(self, signer_did: str, message_id: str) -> None:
        """Claim `message_id` (NativeRefusal `replay.message_id` if anyone claimed it
        before). The key is a digest: message ids may hold characters a key may not."""
        key = hashlib.sha256(message_id.encode("utf-8")).hexdigest()
        try:
            await self.kv.create(key, signer_did.encode("utf-8"))
        except KeyWrongLastSequenceError:
            raise NativeRefusal(
                "replay.message_id", "this message_id was already received"
            ) from None
