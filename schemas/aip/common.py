"""Types used across AIP 1.0 messages: Principal, identity, conversation, message parts
(shared/reference/aip-1.0-wire.md §1.0.4, §1.2; upstream `aip-core` `model.rs`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from schemas.aip._base import AipStruct, UInt

#: RFC 3339 text; this project always writes UTC ending in `Z` (`worker.aip.envelope`).
Timestamp = Annotated[str, Meta(description="RFC 3339 timestamp, UTC, ending in `Z`.")]

PrincipalKind = Literal["human", "agent", "service", "tenant", "customer", "contact", "system"]
Risk = Literal["low", "medium", "high", "critical"]


class ExternalRef(AipStruct, frozen=True):
    """A reference to the same thing in another system."""

    system: Annotated[str, Meta(description="The external system's name.")]
    type: Annotated[str, Meta(description="The kind of object in that system.")]
    id: Annotated[str, Meta(description="Its id there.")]


class DelegatedAuthorityGrant(AipStruct, frozen=True):
    """Authority another principal delegated to this one."""

    principal_id: Annotated[str, Meta(description="The principal who granted it.")]
    scopes: Annotated[list[str], Meta(description="Granted scopes; `*` means all.")] = (
        msgspec.field(default_factory=list)
    )
    expires_at: Annotated[
        str | None, Meta(description="RFC 3339 expiry; an expired grant is ignored.")
    ] = None
    reason: Annotated[str | None, Meta(description="Why it was granted.")] = None


class Principal(AipStruct, frozen=True):
    """Who sends, receives, acts or approves."""

    id: Annotated[str, Meta(description="Stable principal id, e.g. `agent:hermes_operator:h1`.")]
    kind: Annotated[PrincipalKind, Meta(description="What kind of party the principal is.")]
    display_name: Annotated[str | None, Meta(description="Human-readable name.")] = None
    trust_domain: Annotated[
        str | None, Meta(description="The trust domain that owns the principal.")
    ] = None
    did: Annotated[
        str | None, Meta(description="The signer's `did:key`, set on `Envelope.from`.")
    ] = None
    external_refs: Annotated[
        list[ExternalRef], Meta(description="The principal in other systems.")
    ] = msgspec.field(default_factory=list)
    delegated_authority: Annotated[
        list[DelegatedAuthorityGrant], Meta(description="Authority delegated to it.")
    ] = msgspec.field(default_factory=list)
    auth_context: Annotated[
        Any, Meta(description="Free authentication metadata; `scopes` is read from it.")
    ] = None


class TenantRef(AipStruct, frozen=True):
    """The tenant an Action belongs to."""

    id: Annotated[str, Meta(description="Tenant id.")]
    system: Annotated[str | None, Meta(description="The system that names the tenant.")] = None


class ExternalAccountRef(AipStruct, frozen=True):
    """An account in an external system."""

    id: Annotated[str, Meta(description="Account id.")]
    system: Annotated[str, Meta(description="The external system.")]


class ExternalUserRef(AipStruct, frozen=True):
    """A user in an external system."""

    id: Annotated[str, Meta(description="User id.")]
    system: Annotated[str, Meta(description="The external system.")]


class CredentialRef(AipStruct, frozen=True):
    """A reference to a credential; never the secret itself."""

    id: Annotated[str, Meta(description="Credential id or vault reference.")]
    issuer: Annotated[str, Meta(description="Who issued it.")]
    scopes: Annotated[list[str], Meta(description="Its scopes.")] = msgspec.field(
        default_factory=list
    )


class OAuthCredentialState(AipStruct, frozen=True):
    """OAuth state of a credential; never a token."""

    issuer: Annotated[str, Meta(description="OAuth issuer.")]
    refresh_available: Annotated[bool, Meta(description="Whether a refresh is possible.")]
    client_id: Annotated[str | None, Meta(description="OAuth client id.")] = None
    scopes: Annotated[list[str], Meta(description="Granted scopes.")] = msgspec.field(
        default_factory=list
    )
    expires_at: Annotated[str | None, Meta(description="RFC 3339 expiry.")] = None


class IdentityContext(AipStruct, frozen=True):
    """Whose Action it is: tenant, accounts, actors and credential reference."""

    tenant: Annotated[TenantRef | None, Meta(description="The tenant.")] = None
    external_account: Annotated[
        ExternalAccountRef | None, Meta(description="The external account acted on.")
    ] = None
    external_user: Annotated[
        ExternalUserRef | None, Meta(description="The external user acted for.")
    ] = None
    human_actor: Annotated[Principal | None, Meta(description="The human behind it.")] = None
    service_account: Annotated[
        Principal | None, Meta(description="The service account it runs as.")
    ] = None
    acted_on_behalf_of: Annotated[
        Principal | None, Meta(description="The principal it acts for.")
    ] = None
    credential_ref: Annotated[
        CredentialRef | None, Meta(description="The credential to use, by reference.")
    ] = None
    oauth: Annotated[
        OAuthCredentialState | None, Meta(description="OAuth state of the credential.")
    ] = None


class Conversation(AipStruct, frozen=True):
    """A channel thread an Action or message belongs to."""

    id: Annotated[str, Meta(description="Conversation id (`conv_…`).")]
    channel: Annotated[Any, Meta(description="Free channel data (provider, thread ids).")]
    status: Annotated[
        Literal["open", "pending", "resolved", "snoozed", "archived"],
        Meta(description="The thread's state."),
    ]
    external_refs: Annotated[
        list[ExternalRef], Meta(description="The thread in other systems.")
    ] = msgspec.field(default_factory=list)
    contact: Annotated[Principal | None, Meta(description="The contact.")] = None
    assignee: Annotated[Principal | None, Meta(description="Who is assigned.")] = None
    priority: Annotated[
        Literal["low", "medium", "high", "urgent"] | None, Meta(description="Priority.")
    ] = None
    labels: Annotated[list[str], Meta(description="Labels.")] = msgspec.field(default_factory=list)
    metadata: Annotated[Any, Meta(description="Free metadata.")] = None


class _Part(AipStruct, tag_field="type", frozen=True):
    pass


class TextPart(_Part, tag="text", frozen=True):
    """Text, e.g. a model's message delta."""

    text: Annotated[str, Meta(description="The text.")]
    format: Annotated[str | None, Meta(description="Its format, e.g. `markdown`.")] = None


class ImagePart(_Part, tag="image", frozen=True):
    """An image, by URL or inline data."""

    mime_type: Annotated[str, Meta(description="Media type.")]
    url: Annotated[str | None, Meta(description="Where it is.")] = None
    data: Annotated[str | None, Meta(description="Inline base64 data.")] = None
    alt: Annotated[str | None, Meta(description="Alternative text.")] = None


class FilePart(_Part, tag="file", frozen=True):
    """A file, by URL or inline data."""

    mime_type: Annotated[str, Meta(description="Media type.")]
    filename: Annotated[str, Meta(description="File name.")]
    url: Annotated[str | None, Meta(description="Where it is.")] = None
    data: Annotated[str | None, Meta(description="Inline base64 data.")] = None
    size_bytes: Annotated[UInt | None, Meta(description="Size in bytes.")] = None


class AudioPart(_Part, tag="audio", frozen=True):
    """Audio, by URL or inline data."""

    mime_type: Annotated[str, Meta(description="Media type.")]
    url: Annotated[str | None, Meta(description="Where it is.")] = None
    data: Annotated[str | None, Meta(description="Inline base64 data.")] = None
    transcript: Annotated[str | None, Meta(description="Its transcript.")] = None


class FormPart(_Part, tag="form", frozen=True):
    """A form for a human to fill in."""

    fields: Annotated[list[Any], Meta(description="The form's fields.")]
    actions: Annotated[list[Any], Meta(description="The form's actions.")]


class CardPart(_Part, tag="card", frozen=True):
    """A card."""

    title: Annotated[str, Meta(description="Title.")]
    body: Annotated[str, Meta(description="Body text.")]
    actions: Annotated[list[Any], Meta(description="Card actions.")] = msgspec.field(
        default_factory=list
    )
    media: Annotated[Any, Meta(description="Card media.")] = None


class JsonPart(_Part, tag="json", frozen=True):
    """Structured JSON."""

    data: Annotated[Any, Meta(description="The JSON value.")]
    schema: Annotated[Any, Meta(description="A JSON Schema describing it.")] = None


class ToolResultPart(_Part, tag="tool_result", frozen=True):
    """A tool call's result."""

    tool_call_id: Annotated[str, Meta(description="The tool call it answers.")]
    data: Annotated[Any, Meta(description="The result.")] = None
    error: Annotated[Any, Meta(description="The tool's error.")] = None


MessagePart = (
    TextPart | ImagePart | FilePart | AudioPart | FormPart | CardPart | JsonPart | ToolResultPart
)
