"""The subject grammar (docs/architecture.md §3): every subject and durable name is built here,
nowhere else."""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from schemas.errors import InvalidEndpointId
from schemas.ids import ENDPOINT_ID_PATTERN, is_action_id, is_dlq_id

DEFAULT_PREFIX = "aip"
_ENDPOINT_RE = re.compile(ENDPOINT_ID_PATTERN)
_PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}\Z")
_FOLD_RE = re.compile(r"[^a-z0-9_-]+")
_SESSION_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")


def normalize_endpoint_id(raw: str) -> str:
    """Lower-case, fold every run of other characters into `-`, and validate.

    Normalization is deliberately simple and visible: `Hermes.1` becomes `hermes-1`, so two
    descriptors that normalize to one id are caught as duplicates at startup.
    """
    folded = _FOLD_RE.sub("-", raw.strip().lower()).strip("-")
    if not _ENDPOINT_RE.fullmatch(folded):
        raise InvalidEndpointId(
            f"endpoint id {raw!r} does not normalize to [a-z0-9][a-z0-9_-]{{0,62}}"
        )
    return folded


@dataclass(frozen=True, slots=True)
class EndpointSubjects:
    """What any executor serves under its subject base: Actions in, a cancel request/reply,
    chunks and one result out.

    The base is `{prefix}.hermes.{endpoint}` for a Hermes endpoint of this bus
    (`Subjects.endpoint`), or the subject prefix a gateway route names for another executor
    that speaks the same grammar (`AIPD_CAPABILITY_ROUTES`, docs/gateway.md).
    """

    base: str

    @property
    def actions(self) -> str:
        return f"{self.base}.actions"

    @property
    def cancel(self) -> str:
        """Core NATS request/reply: a signed AIP Cancel Envelope in, an ActionResult or error
        Envelope back (`worker.wire.cancels`)."""
        return f"{self.base}.cancel"

    def chunks(self, action_id: str) -> str:
        return f"{self.base}.chunks.{_checked(action_id)}"

    def results(self, action_id: str) -> str:
        return f"{self.base}.results.{_checked(action_id)}"


@dataclass(frozen=True, slots=True)
class Subjects:
    """Subjects under one prefix (default `aip`)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _PREFIX_RE.fullmatch(self.prefix):
            raise ValueError(f"subject prefix {self.prefix!r} must match [a-z0-9][a-z0-9_-]*")

    # Per-endpoint subjects.
    def endpoint_base(self, endpoint_id: str) -> str:
        """`{prefix}.hermes.{endpoint}`: every subject of one endpoint starts with it."""
        return f"{self.prefix}.hermes.{endpoint_id}"

    def endpoint(self, endpoint_id: str) -> EndpointSubjects:
        return EndpointSubjects(self.endpoint_base(endpoint_id))

    def actions(self, endpoint_id: str) -> str:
        return self.endpoint(endpoint_id).actions

    def delegations(self, endpoint_id: str) -> str:
        return f"{self.prefix}.hermes.{endpoint_id}.delegations"

    def cancel(self, endpoint_id: str) -> str:
        return self.endpoint(endpoint_id).cancel

    def cancel_notice(self, endpoint_id: str) -> str:
        """Internal fan-out among workers: "re-read the durable cancel intent of this Action".

        Carries an `aip.core.v1.cancel` Envelope naming the Action (signed by the relaying
        worker, `worker.wire.cancels.encode_cancel_notice`) and grants nothing: a worker
        holding that Action re-reads its cancel intent in Redis (coalesced, rate-bounded); a
        notice without a recorded intent changes nothing. Workers publish and subscribe it;
        nobody else needs to.
        """
        return f"{self.prefix}.hermes.{endpoint_id}.control.cancel"

    def chunks(self, endpoint_id: str, action_id: str) -> str:
        return self.endpoint(endpoint_id).chunks(action_id)

    def results(self, endpoint_id: str, action_id: str) -> str:
        return self.endpoint(endpoint_id).results(action_id)

    def dlq(self, endpoint_id: str) -> str:
        return f"{self.prefix}.hermes.{endpoint_id}.dlq"

    def audit(self, endpoint_id: str, action_id: str) -> str:
        """Receipts of one Action: the Action id in the subject lets `audit ACTION_ID` read its
        chain with a filtered consumer instead of scanning every receipt of the endpoint.
        A DLQ entry id (`dlq_…`) names the chain of an envelope that was not authenticated."""
        return _audit_subject(self.prefix, endpoint_id, action_id)

    def egress(self, endpoint_id: str) -> str:
        """Channel deliveries bound for a session of this endpoint (work queue)."""
        return f"{self.prefix}.hermes.{endpoint_id}.egress"

    def inbound(self, endpoint_id: str, session_id: str) -> str:
        """Messages of a followed Hermes session (channel ingress)."""
        if not _SESSION_TOKEN_RE.fullmatch(session_id):
            raise ValueError("not an ingress session id")
        return f"{self.prefix}.hermes.{endpoint_id}.inbound.{session_id}"

    def escalations(self, endpoint_id: str) -> str:
        """Escalations a human must decide (schemas/escalation.py)."""
        return f"{self.prefix}.hermes.{endpoint_id}.escalations"

    def escalation_resolutions(self, endpoint_id: str) -> str:
        """Who resolved an escalation, how and why."""
        return f"{self.prefix}.hermes.{endpoint_id}.escalations.resolved"

    def manifest(self, endpoint_id: str) -> str:
        return f"{self.prefix}.hermes.{endpoint_id}.manifest"

    # The AIP runtime's Action queue and lifecycle stores (written by the runtime, read by
    # the delegated-result resolver; see schemas/lifecycle.py).
    def runtime_queue(self, action_id: str) -> str:
        return f"{self.prefix}.runtime.queue.{_checked(action_id)}"

    def runtime_lifecycle(self, action_id: str) -> str:
        return f"{self.prefix}.runtime.lifecycle.{_checked(action_id)}"

    def all_runtime_queue(self) -> str:
        return f"{self.prefix}.runtime.queue.*"

    def all_runtime_lifecycle(self) -> str:
        return f"{self.prefix}.runtime.lifecycle.*"

    def runtime_open(self, shard: str) -> str:
        """One shard of the gateway's index of open children (worker/gateway/open_children.py)."""
        if len(shard) != 1 or shard not in "0123456789abcdef":
            raise ValueError("a shard of the open index is one lowercase hex digit")
        return f"{self.prefix}.runtime.open.{shard}"

    def all_runtime_open(self) -> str:
        return f"{self.prefix}.runtime.open.*"

    def runtime_stream_name(self, kind: str) -> str:
        """`AIP_RUNTIME_QUEUE` / `AIP_RUNTIME_LIFECYCLE` / `AIP_RUNTIME_OPEN` for the default
        prefix."""
        return f"{self.prefix.upper().replace('-', '_')}_RUNTIME_{kind.upper()}"

    # Wildcards that streams bind.
    def all_actions(self) -> str:
        return f"{self.prefix}.hermes.*.actions"

    def all_delegations(self) -> str:
        return f"{self.prefix}.hermes.*.delegations"

    def all_chunks(self) -> str:
        return f"{self.prefix}.hermes.*.chunks.*"

    def all_results(self) -> str:
        return f"{self.prefix}.hermes.*.results.*"

    def all_dlq(self) -> str:
        return f"{self.prefix}.hermes.*.dlq"

    def all_escalations(self) -> list[str]:
        return [
            f"{self.prefix}.hermes.*.escalations",
            f"{self.prefix}.hermes.*.escalations.resolved",
        ]

    def all_inbound(self) -> str:
        return f"{self.prefix}.hermes.*.inbound.*"

    def all_audit(self) -> str:
        return f"{self.prefix}.hermes.*.audit.*"

    # Stream and consumer names.
    def stream_name(self, kind: str) -> str:
        """`AIP_HERMES_ACTIONS` for the default prefix; another prefix gets its own streams."""
        return f"{self.prefix.upper().replace('-', '_')}_HERMES_{kind.upper()}"

    def durable(self, endpoint_id: str, kind: str) -> str:
        return f"hermes_{endpoint_id.replace('-', '_')}_{kind}"


def envelope_msg_id(action_id: str, payload: bytes) -> str:
    """`Nats-Msg-Id` of an Action or DelegationRequest: its Action id and the first 128 bits
    of the sha256 of the exact envelope bytes.

    Bound to the content, so no one can pre-empt an Action's dedupe slot without its exact
    bytes: a message published first under the Action id alone (a squatter, a forgery with
    another body) no longer makes the server drop the genuine publish as its duplicate, while
    a retry of the same bytes still is one. A worker dead-letters an envelope whose header is
    not this (`connector_host.replay`); one without the header is stored every time and
    deduplicated by its Action id in Redis alone (docs/publishing.md)."""
    return f"{action_id}:{hashlib.sha256(payload).hexdigest()[:32]}"


def chunk_msg_id(action_id: str, seq: int, payload_sha256: str) -> str:
    """`Nats-Msg-Id` of a chunk: a republish of the same bytes after a crash is dropped by
    the server, and with the bytes' hash in it a message published first under the same
    seq (a forgery) cannot make the server drop the real chunk as its duplicate."""
    return f"{action_id}:{seq}:{payload_sha256[:32]}"


def result_msg_id(action_id: str, payload_sha256: str | None = None) -> str:
    """`Nats-Msg-Id` of a result: a republish of the same stored bytes is dropped by the
    server, and with the bytes' hash in it a message published first under the Action's id
    (a forgery) cannot make the server drop the real result as its duplicate."""
    if payload_sha256 is None:
        return f"{action_id}:result"
    return f"{action_id}:result:{payload_sha256[:32]}"


def escalation_resolution_msg_id(escalation_id: str) -> str:
    return f"{escalation_id}:resolved"


@functools.lru_cache(maxsize=1024)
def _audit_subject(prefix: str, endpoint_id: str, action_id: str) -> str:
    """`Subjects.audit`, remembered for the Actions in flight: an operator Action publishes
    ~8 receipts, and checking its id for each was most of a receipt's subject cost. An id
    that fails the check raises every time (a raise is not cached)."""
    if is_dlq_id(action_id):
        return f"{prefix}.hermes.{endpoint_id}.audit.{action_id}"
    return f"{prefix}.hermes.{endpoint_id}.audit.{_checked(action_id)}"


def _checked(action_id: str) -> str:
    if not is_action_id(action_id):
        raise ValueError("not an action id")
    return action_id
