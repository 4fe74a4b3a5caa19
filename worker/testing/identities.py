"""A complete, valid trust setup in a directory: for tests and the demo.

`write_trust_files(dir)` creates a gateway key pair (seed file 0600, keys file), a worker
response signing key pair (seed file 0600, trusted worker keys file), an identity
directory and an approval authority file whose principals are the constants below (each
approver with its own signing key pair: seed file 0600, public key in its membership), and
returns paths plus helpers to sign envelopes and approval decisions and build settings.
Tests that need a bad file start from these and change one thing, so each failure has
exactly one cause.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.action import Action
from worker.aip.signing import AipSigner
from worker.trust.signing import (
    generate_keypair,
    public_key_of,
    sign_envelope,
    write_seed_file,
)
from worker.wire.actions import GATEWAY_SENDER, encode_action

TENANT_A = "tenant-a"
TENANT_B = "tenant-b"
#: Ordinary callers, one per tenant, and one without a tenant.
USER_A = "user:alice"
USER_B = "user:bob"
USER_UNTENANTED = "user:demo"
#: Approvers: one per tenant (cannot approve for the other), and one untenanted.
APPROVER_A = "approver:carol"
APPROVER_B = "approver:dave"
APPROVER_UNTENANTED = "approver:demo"
PRINCIPAL_KIND = "user"
ISSUER = "https://idp.example.test"
REVISION = 3


def identity_entries() -> list[dict[str, Any]]:
    def entry(principal: str, tenant: str | None) -> dict[str, Any]:
        return {
            "principal_id": principal,
            "revision": REVISION,
            "tenant_id": tenant,
            "credential": f"opaque-credential-of-{principal}",
            "identity": {"principal_kind": PRINCIPAL_KIND, "authentication_issuer": ISSUER},
        }

    return [
        entry(USER_A, TENANT_A),
        entry(USER_B, TENANT_B),
        entry(USER_UNTENANTED, None),
        entry(APPROVER_A, TENANT_A),
        entry(APPROVER_B, TENANT_B),
        entry(APPROVER_UNTENANTED, None),
    ]


def authority_memberships() -> list[dict[str, Any]]:
    def membership(principal: str, tenant: str | None) -> dict[str, Any]:
        return {
            "principal_id": principal,
            "revision": 1,
            "tenant_id": tenant,
            "capability_prefixes": ["cap:hermes_agent:"],
        }

    return [
        membership(APPROVER_A, TENANT_A),
        membership(APPROVER_B, TENANT_B),
        membership(APPROVER_UNTENANTED, None),
    ]


def write_json(path: Path, value: Any, *, mode: int = 0o600) -> Path:
    """Write `value` as JSON with `mode` (set explicitly, whatever the umask)."""
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    os.chmod(path, mode)
    return path


@dataclass(frozen=True, slots=True)
class TrustFiles:
    """Where the trust files are, and the gateway seed that signs for them."""

    directory: Path
    seed_file: Path
    gateway_keys_file: Path
    identity_file: Path
    authority_file: Path
    public_key: str
    seed: bytes = field(repr=False)
    #: The workers' response signing key (every test worker shares it unless given its own
    #: with `add_worker_key`) and the file of trusted worker public keys consumers read.
    worker_seed_file: Path
    worker_keys_file: Path
    #: Each approver's signing seed (what `approve --key` reads), by principal id.
    approver_seeds: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    #: The same seeds as owner-only files.
    approver_seed_files: Mapping[str, Path] = field(default_factory=dict)

    def sign(self, payload: bytes) -> dict[str, str]:
        """`Aip-Signer`/`Aip-Signature` headers for a payload of a subject still signed by
        headers."""
        return sign_envelope(payload, self.seed)

    @property
    def aip_signer(self) -> AipSigner:
        """The gateway key as the AIP signer of Action Envelopes."""
        return AipSigner.from_nkey_seed(self.seed)

    @property
    def did(self) -> str:
        """The gateway key's `did:key` (the same key as `public_key`)."""
        return self.aip_signer.did

    def seal_action(self, action: Action, *, signed: bool = True) -> bytes:
        """`action` as the AIP Action Envelope a gateway publishes, signed by this gateway
        key (`signed=False`: unsigned, for a development worker)."""
        return encode_action(
            action, signer=self.aip_signer if signed else None, sender=GATEWAY_SENDER
        )

    def memberships(self) -> list[dict[str, Any]]:
        """The authority file's memberships as written (with their public keys), for a test
        that rewrites the file with one change."""
        loaded: Any = json.loads(self.authority_file.read_text("utf-8"))
        memberships: list[dict[str, Any]] = (
            loaded["memberships"] if isinstance(loaded, dict) else loaded
        )
        return memberships

    def approver_seed(self, principal_id: str) -> bytes:
        """The seed `principal_id` signs its approval decisions with."""
        return self.approver_seeds[principal_id]

    def add_worker_key(self, name: str) -> Path:
        """A further worker signing key, trusted alongside the first; its seed file."""
        pair = generate_keypair()
        seed_file = self.directory / f"{name}.seed"
        write_seed_file(seed_file, pair.seed)
        with self.worker_keys_file.open("a", encoding="utf-8") as keys:
            keys.write(f"{pair.public_key}\n")
        return seed_file

    def settings_overrides(self, *, allow_unsigned: bool = False) -> dict[str, Any]:
        """Keyword arguments for `Settings(...)` that point at these files."""
        return {
            "trusted_gateway_keys_file": self.gateway_keys_file,
            "trusted_identity_file": self.identity_file,
            "approval_authority_file": self.authority_file,
            "allow_unsigned_envelopes": allow_unsigned,
            "worker_signing_key_file": self.worker_seed_file,
            "trusted_worker_keys_file": self.worker_keys_file,
        }

    def environment(self) -> Mapping[str, str]:
        """The same as `AIPD_*` variables, for a worker started as a subprocess."""
        return {
            "AIPD_TRUSTED_GATEWAY_KEYS_FILE": str(self.gateway_keys_file),
            "AIPD_TRUSTED_IDENTITY_FILE": str(self.identity_file),
            "AIPD_APPROVAL_AUTHORITY_FILE": str(self.authority_file),
            "AIPD_WORKER_SIGNING_KEY_FILE": str(self.worker_seed_file),
            "AIPD_TRUSTED_WORKER_KEYS_FILE": str(self.worker_keys_file),
        }


def write_trust_files(
    directory: Path,
    *,
    identities: Sequence[Mapping[str, Any]] | None = None,
    memberships: Sequence[Mapping[str, Any]] | None = None,
    extra_public_keys: Sequence[str] = (),
    quorums: Sequence[Mapping[str, Any]] | None = None,
) -> TrustFiles:
    """Create the files in `directory` (which must exist); returns where they are.

    With `quorums` the authority file takes its object form
    (`{"memberships": [...], "quorums": [...]}`), else the array of memberships.

    A membership without a `public_key` gets a fresh key pair of its principal (one per
    principal, shared by its memberships in several tenants), its seed in
    `approver-<n>.seed`.
    """
    pair = generate_keypair()
    given = memberships if memberships is not None else authority_memberships()
    chosen = [dict(m) for m in given]
    approver_seeds: dict[str, bytes] = {}
    approver_seed_files: dict[str, Path] = {}
    for membership in chosen:
        principal = str(membership["principal_id"])
        if "public_key" in membership:
            continue
        if principal not in approver_seeds:
            approver = generate_keypair()
            approver_seeds[principal] = approver.seed
            approver_seed_files[principal] = directory / f"approver-{len(approver_seeds)}.seed"
            write_seed_file(approver_seed_files[principal], approver.seed)
        membership["public_key"] = public_key_of(approver_seeds[principal])
    seed_file = directory / "gateway.seed"
    write_seed_file(seed_file, pair.seed)
    keys_file = directory / "gateway-keys.txt"
    keys_file.write_text(
        "# trusted gateway signing keys, one per line\n"
        + "".join(f"{key}\n" for key in (pair.public_key, *extra_public_keys)),
        encoding="utf-8",
    )
    os.chmod(keys_file, 0o644)
    identity_file = write_json(
        directory / "identities.json",
        list(identities) if identities is not None else identity_entries(),
    )
    authority: Any = (
        chosen
        if quorums is None
        else {"memberships": chosen, "quorums": [dict(q) for q in quorums]}
    )
    authority_file = write_json(directory / "authority.json", authority, mode=0o644)
    worker = generate_keypair()
    worker_seed_file = directory / "worker.seed"
    write_seed_file(worker_seed_file, worker.seed)
    worker_keys_file = directory / "worker-keys.txt"
    worker_keys_file.write_text(
        f"# trusted worker response signing keys, one per line\n{worker.public_key}\n",
        encoding="utf-8",
    )
    os.chmod(worker_keys_file, 0o644)
    return TrustFiles(
        directory=directory,
        seed_file=seed_file,
        gateway_keys_file=keys_file,
        identity_file=identity_file,
        authority_file=authority_file,
        public_key=pair.public_key,
        seed=pair.seed,
        approver_seeds=approver_seeds,
        approver_seed_files=approver_seed_files,
        worker_seed_file=worker_seed_file,
        worker_keys_file=worker_keys_file,
    )


def write_api_key_file(directory: Path, name: str = "hermes.key") -> tuple[str, Path]:
    """A fresh Hermes API key and the owner-only file a worker reads it from."""
    key = "key-" + secrets.token_hex(16)
    path = directory / name
    path.write_text(key, encoding="utf-8")
    os.chmod(path, 0o600)
    return key, path
