"""Governance and security: who may act, through which gateway, with whose approval.

`TrustGate` is what the runtime calls; the modules below it each own one check.
"""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
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

__getattr__ = lazy_exports(
    __name__,
    {
        "approve": "worker.trust.approval_ledger",
        "check_approval": "worker.trust.approval_ledger",
        "ApprovalAuthority": "worker.trust.authority",
        "AdmitDecision": "worker.trust.gate",
        "TrustGate": "worker.trust.gate",
        "IdentityDirectory": "worker.trust.identities",
        "TrustedIdentity": "worker.trust.identities",
        "trusted_projection": "worker.trust.projection",
        "TrustedGatewayKeys": "worker.trust.signing",
        "generate_keypair": "worker.trust.signing",
        "sign_envelope": "worker.trust.signing",
        "verify_envelope": "worker.trust.signing",
    },
)
