"""Every Redis key this project uses is built here, nowhere else (docs/architecture.md §5).

Every key of one Action carries the hash tag `{act_…}` so each script touches one slot and
runs unchanged on Redis Cluster. A resume Action keeps its keys under its *source* action's
tag (`…:{act_source}:lease:{act_resume}`) so the scripts that touch both stay in one slot.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from schemas.channel import INGRESS_SESSION_PATTERN
from schemas.ids import is_action_id, is_endpoint_id

NAMESPACE = "aip:connector:hermes_agent:operator_runs:v1"
CAPACITY_NAMESPACE = "aip:connector:hermes_agent:capacity:v1"
APPROVALS_PREFIX = "aip:approvals"
ESCALATIONS_PREFIX = "aip:escalations"
CHANNEL_NAMESPACE = "aip:connector:hermes_agent:channel:v1"
IDEMPOTENCY_NAMESPACE = "aip:connector:hermes_agent:idempotency:v1"
#: The `message_id`s of the request/reply Envelopes no stream stores (Cancels) already used.
REQUEST_IDS_NAMESPACE = "aip:connector:hermes_agent:request_ids:v1"


def request_id_key(message_id: str) -> str:
    """The key that claims one request Envelope's `message_id` (any non-empty string on the
    wire, so its sha256 names the key: fixed length, no separator of ours inside)."""
    return f"{REQUEST_IDS_NAMESPACE}:{hashlib.sha256(message_id.encode()).hexdigest()}"


def _tag(action_id: str) -> str:
    if not is_action_id(action_id):
        # Keys are only ever built from validated ids; this guards the slot layout.
        raise ValueError("not an action id")
    return "{" + action_id + "}"


@dataclass(frozen=True, slots=True)
class ActionKeys:
    """The keys one Action's delivery uses: its lease, stored result and cancel intent.

    For an ordinary Action all three sit under its own tag. For a resume Action they sit
    under the source Action's tag with the resume id as a suffix.
    """

    action_id: str
    #: The Action whose hash tag these keys share (the action itself, or a resume's source).
    slot_action_id: str
    #: `{action_id}`, `NAMESPACE:{slot}` and, for a resume, `:action_id`: what every key is
    #: built around, each id validated once and printed once, when the keys are made,
    #: rather than at each of the ~18 key reads of an operator Action.
    _own_tag: str = field(init=False, repr=False, compare=False)
    _base: str = field(init=False, repr=False, compare=False)
    _suffix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        own_tag = _tag(self.action_id)
        resume = self.slot_action_id != self.action_id
        slot_tag = _tag(self.slot_action_id) if resume else own_tag
        object.__setattr__(self, "_own_tag", own_tag)
        object.__setattr__(self, "_base", _base_of(slot_tag))
        object.__setattr__(self, "_suffix", f":{self.action_id}" if resume else "")

    @classmethod
    def of(cls, action_id: str, *, source_action_id: str | None = None) -> ActionKeys:
        return cls(action_id=action_id, slot_action_id=source_action_id or action_id)

    @property
    def lease(self) -> str:
        return f"{self._base}:lease{self._suffix}"

    @property
    def result(self) -> str:
        return f"{self._base}:result{self._suffix}"

    @property
    def terminal(self) -> str:
        """The terminal chunk the settle stored beside the result (same TTL), so whoever
        republishes the result republishes the chunk that closes its stream too."""
        return f"{self._base}:terminal{self._suffix}"

    @property
    def owed_chunks(self) -> str:
        """Chunks the bus refused while the Action ran (a full or failing JetStream store),
        stored by the settle beside the result (same TTL) so the republish sends them
        before the terminal chunk and the chain stays gap-free (`worker/pipeline/outbox.py`)."""
        return f"{self._base}:owed_chunks{self._suffix}"

    @property
    def cancel(self) -> str:
        return f"{self._base}:cancel{self._suffix}"

    @property
    def cancel_pending(self) -> str:
        """Cancel intents recorded before any worker leased the Action, per requester."""
        return f"{self._base}:cancel_pending{self._suffix}"

    @property
    def resume_alias(self) -> str:
        """Under the resume's *own* tag: which source slot holds its keys (for cancels)."""
        return f"{NAMESPACE}:{self._own_tag}:resume_of"

    @property
    def is_resume(self) -> bool:
        return self.slot_action_id != self.action_id

    @property
    def binding(self) -> str:
        """The operator binding of the slot's source Action (shared by its resumes)."""
        return _binding_at(self._base)

    @property
    def approvals(self) -> str:
        """The ApprovalRecord an approval authority wrote for this Action."""
        return _approvals_at(self._own_tag)


@dataclass(frozen=True, slots=True)
class IngressKeys:
    """The keys of one followed channel session (docs/channels.md): the follower's lease and
    the cursor (the last message id it published), under one `{endpoint:session}` tag, so
    each ingress script touches one slot."""

    lease: str
    cursor: str

    @classmethod
    def of(cls, endpoint_id: str, session_id: str) -> IngressKeys:
        if not is_endpoint_id(endpoint_id):
            raise ValueError("not an endpoint id")
        if not re.match(INGRESS_SESSION_PATTERN, session_id):
            raise ValueError("not an ingress session id")
        base = f"{CHANNEL_NAMESPACE}:{{{endpoint_id}:{session_id}}}"
        return cls(lease=f"{base}:lease", cursor=f"{base}:cursor")


def idempotency_key(scope_digest: str) -> str:
    """The record of one idempotency key in its scope (`worker/pipeline/idempotency.py`
    computes the digest). Its own `{idem_…}` tag: the record names its holder Action, whose
    keys live in another slot, so no script ever touches both."""
    if not re.fullmatch(r"[0-9a-f]{64}", scope_digest):
        raise ValueError("not a scope digest")
    return f"{IDEMPOTENCY_NAMESPACE}:{{idem_{scope_digest}}}"


def binding_key(action_id: str) -> str:
    """The operator binding of `action_id` (a source Action: a resume shares its source's),
    for callers holding an id rather than a delivery's keys; spelled as `ActionKeys.binding`."""
    return _binding_at(_base_of(_tag(action_id)))


def approvals_key(action_id: str) -> str:
    """The ApprovalRecord of `action_id`, for callers holding an id rather than a delivery's
    keys (each Action's approval prefetch among them: no `ActionKeys` is built for it, ~2 µs
    against ~0.5); spelled as `ActionKeys.approvals`."""
    return _approvals_at(_tag(action_id))


def _base_of(tag: str) -> str:
    """The operator-runs namespace under one Action's hash tag: every `ActionKeys` key but
    the approvals and the resume alias starts with it."""
    return f"{NAMESPACE}:{tag}"


def _binding_at(base: str) -> str:
    return f"{base}:binding"


def _approvals_at(tag: str) -> str:
    return f"{APPROVALS_PREFIX}:{tag}"


def escalation_resolution_key(escalation_id: str) -> str:
    """The write-once resolution of one escalation (its own slot: one key, one command)."""
    from schemas.escalation import is_escalation_id

    if not is_escalation_id(escalation_id):
        raise ValueError("not an escalation id")
    return f"{ESCALATIONS_PREFIX}:{{{escalation_id}}}:resolution"


def escalation_resume_key(escalation_id: str) -> str:
    """The write-once resume an approval escalation's first approver opened (its id and
    choice), which every member of a quorum then approves."""
    from schemas.escalation import is_escalation_id

    if not is_escalation_id(escalation_id):
        raise ValueError("not an escalation id")
    return f"{ESCALATIONS_PREFIX}:{{{escalation_id}}}:resume"


def capacity_key(endpoint_id: str) -> str:
    """The per-endpoint run semaphore (a sorted set of holders scored by expiry)."""
    if not is_endpoint_id(endpoint_id):
        raise ValueError("not an endpoint id")
    return f"{CAPACITY_NAMESPACE}:{{{endpoint_id}}}"
