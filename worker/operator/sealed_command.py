"""The command behind an approval prompt, readable by the members of the authority only.

The operator retains an approval prompt's `command` as a digest (`worker.operator.redaction`):
Redis, chunks and results are read by more people than may see what a run would execute.
But the approver must see it to decide. So the worker also seals the command, with a
libsodium sealed box, to the public key of each membership of the approval authority that
may decide on the Action's capability for its tenant (their nkeys are Ed25519 keys; the box
uses their X25519 forms), and keeps only those ciphertexts in the operator binding
(`pending_command_sealed`). Whoever reads Redis sees ciphertext; `escalations show
--reveal --key SEED` opens the box with a member's own seed and files a receipt
(`worker/commands/escalation_reveal.py`). A membership added after the prompt cannot open
it; one removed afterwards still can (it held the key when the prompt was raised).
"""

from __future__ import annotations

import base64

import nacl.exceptions
import nacl.public
import nacl.signing
import nkeys

from worker.trust.authority import ApprovalAuthority
from worker.trust.signing import decode_user_public_key

#: Longest command sealed; Hermes' own prompts are far shorter.
MAX_COMMAND_CHARS = 16_384


class CommandSealer:
    """Seals prompts' commands to the authority members who may decide on them."""

    def __init__(self, authority: ApprovalAuthority) -> None:
        self.authority = authority

    def seal(
        self, command: str, *, tenant_id: str | None, capability: str, now_ms: int
    ) -> dict[str, str]:
        """Member public nkey -> the command sealed to it (base64url); empty when no
        member may decide on `capability` for `tenant_id`."""
        plain = command[:MAX_COMMAND_CHARS].encode("utf-8", "replace")
        sealed = {}
        for membership in self.authority.deciders(
            tenant_id=tenant_id, capability=capability, now_ms=now_ms
        ):
            box = nacl.public.SealedBox(_x25519_public(membership.public_key))
            sealed[membership.public_key] = base64.urlsafe_b64encode(box.encrypt(plain)).decode()
        return sealed


def open_sealed(sealed: dict[str, str], public_key: str, seed: bytes) -> str | None:
    """The command sealed to `public_key`, opened with its `seed`; None when nothing was
    sealed to that key or the seed is not that key's."""
    token = sealed.get(public_key)
    if token is None:
        return None
    _, raw = nkeys.decode_seed(seed)
    private = nacl.signing.SigningKey(bytes(raw)).to_curve25519_private_key()
    try:
        plain = nacl.public.SealedBox(private).decrypt(base64.urlsafe_b64decode(token))
    except (nacl.exceptions.CryptoError, ValueError):
        return None
    return plain.decode("utf-8", "replace")


def _x25519_public(public_key: str) -> nacl.public.PublicKey:
    verify = nacl.signing.VerifyKey(decode_user_public_key(public_key))
    return verify.to_curve25519_public_key()
