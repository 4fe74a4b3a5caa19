"""Governance and security: who may act, through which gateway, with whose approval.

`TrustGate` is what the runtime calls; the modules below it each own one check.
"""

from worker.trust.approval_ledger import approve, check_approval
from worker.trust.authority import ApprovalAuthority
from worker.trust.gate import AdmitDecision, TrustGate
from worker.trust.identities import IdentityDirectory, TrustedIdentity
from worker.trust.projection import trusted_projection
from worker.trust.signing import (
    TrustedGatewayKeys,
    generate_keypair,
    sign_envelope,
    verify_envelope,
)

__all__ = [
    "AdmitDecision",
    "ApprovalAuthority",
    "IdentityDirectory",
    "TrustGate",
    "TrustedGatewayKeys",
    "TrustedIdentity",
    "approve",
    "check_approval",
    "generate_keypair",
    "sign_envelope",
    "trusted_projection",
    "verify_envelope",
]
