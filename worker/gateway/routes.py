"""The route table: which subjects serve a capability (`AIPD_CAPABILITY_ROUTES`).

A route maps a capability-id prefix to a subject prefix `P`; the child is published to
`P.actions`, its chunks and result are read from `P.chunks.{id}` / `P.results.{id}`, and a
cancel goes to `P.cancel` — the worker's own subject grammar (`EndpointSubjects` over the
base `P`), so the built-in route `cap:hermes_agent:{endpoint}:` -> `{prefix}.hermes.{endpoint}`
reaches this bus's workers.
`{endpoint}` in a prefix matches one endpoint id and is substituted into the subject prefix.
The longest matching prefix wins; a capability no prefix matches is refused before anything
is stored or sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from subjects.grammar import EndpointSubjects, Subjects
from worker.errors import RouteConfigError

ENDPOINT_PLACEHOLDER = "{endpoint}"
_SUBJECT_PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_{}-]+)*\Z")
#: One endpoint id at the start of the rest of a capability id (the grammar's endpoint shape).
_ENDPOINT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


@dataclass(frozen=True, slots=True)
class Route:
    """Where one capability is served."""

    capability_prefix: str
    #: Actions, cancel, chunks and results under the route's subject prefix.
    subjects: EndpointSubjects
    #: The endpoint id the placeholder matched, for a Hermes route.
    endpoint_id: str | None

    @property
    def audit_endpoint(self) -> str:
        """The endpoint token of the audit subject receipts about this child go to."""
        return self.endpoint_id or "_gateway"


@dataclass(frozen=True, slots=True)
class _Entry:
    capability_prefix: str
    subject_prefix: str

    def match(self, capability: str) -> Route | None:
        head, placeholder, tail = self.capability_prefix.partition(ENDPOINT_PLACEHOLDER)
        if not placeholder:
            if capability.startswith(self.capability_prefix):
                return Route(self.capability_prefix, EndpointSubjects(self.subject_prefix), None)
            return None
        if not capability.startswith(head):
            return None
        rest = capability[len(head) :]
        found = _ENDPOINT_RE.match(rest)
        if found is None or not rest[found.end() :].startswith(tail):
            return None
        endpoint_id = found.group(0)
        subject = self.subject_prefix.replace(ENDPOINT_PLACEHOLDER, endpoint_id)
        return Route(self.capability_prefix, EndpointSubjects(subject), endpoint_id)


class RouteTable:
    def __init__(self, entries: dict[str, str]) -> None:
        for capability_prefix, subject_prefix in entries.items():
            where = f"AIPD_CAPABILITY_ROUTES entry {capability_prefix!r}"
            if not capability_prefix.startswith("cap:") or len(capability_prefix) < 5:
                raise RouteConfigError(f"{where}: a capability prefix starts with 'cap:'")
            if not _SUBJECT_PREFIX_RE.fullmatch(subject_prefix) or ">" in subject_prefix:
                raise RouteConfigError(f"{where}: {subject_prefix!r} is not a subject prefix")
            uses = ENDPOINT_PLACEHOLDER in subject_prefix
            if uses and ENDPOINT_PLACEHOLDER not in capability_prefix:
                raise RouteConfigError(f"{where}: the subject uses {{endpoint}}, the prefix not")
        # Longest prefix first: the most specific route wins.
        self._entries = sorted(
            (_Entry(c, s) for c, s in entries.items()),
            key=lambda e: len(e.capability_prefix),
            reverse=True,
        )

    @classmethod
    def from_setting(cls, subject_prefix: str, raw: str | None) -> RouteTable:
        """The built-in Hermes route, with `raw` (JSON object) merged over it."""
        entries: dict[str, str] = {
            "cap:hermes_agent:{endpoint}:": Subjects(subject_prefix).endpoint_base(
                ENDPOINT_PLACEHOLDER
            )
        }
        if raw:
            try:
                document = json.loads(raw)
            except ValueError as exc:
                raise RouteConfigError(f"AIPD_CAPABILITY_ROUTES is not JSON ({exc})") from None
            if not isinstance(document, dict):
                raise RouteConfigError("AIPD_CAPABILITY_ROUTES must be a JSON object")
            for key, value in document.items():
                if value is None:
                    entries.pop(key, None)
                elif isinstance(value, str):
                    entries[key] = value
                else:
                    raise RouteConfigError(
                        f"AIPD_CAPABILITY_ROUTES entry {key!r}: the subject prefix is a string"
                    )
        return cls(entries)

    def resolve(self, capability: str) -> Route | None:
        for entry in self._entries:
            route = entry.match(capability)
            if route is not None:
                return route
        return None

    def describe(self) -> dict[str, str]:
        return {e.capability_prefix: e.subject_prefix for e in self._entries}
