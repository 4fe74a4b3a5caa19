"""The native NATS binding's subjects (aip-1.0-wire.md §3.1): where a requester sends each
message type, `aip.v1.{trust_domain}.{service}.{version}.{message_type}`, every variable
part sanitised as the reference writes it. One place, for the responders and for the
answers that name the Action subject in the manifest."""

from __future__ import annotations

from typing import Final

_SANITISED: Final = str.maketrans({".": "_", " ": "_", "/": "_", "\\": "_"})


def sanitise(part: str) -> str:
    """One variable part of a binding subject, as the reference writes it (§3.1)."""
    return part.translate(_SANITISED)


def service_subject(trust_domain: str, service: str, version: str) -> str:
    """`aip.v1.{td}.{service}.{version}`: the binding's subject prefix."""
    return ".".join(("aip", "v1", *(sanitise(p) for p in (trust_domain, service, version))))


def request_subject(trust_domain: str, service: str, version: str, message_type: str) -> str:
    """Where a requester sends one message type (the reference's `subject_for`)."""
    return f"{service_subject(trust_domain, service, version)}.{sanitise(message_type)}"
