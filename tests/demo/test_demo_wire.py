"""Everything the demo's story puts on the bus is AIP 1.0 (issue #25's "Done means").

The story runs in this process on its own embedded NATS and Redis; a plain core-NATS
subscription on `>` sees every message any process publishes there, JetStream's copies to
pull consumers included. Each message on the project's subjects (and each reply that is an
Envelope) is checked against the exported JSON Schema of its `message_type` with the
`jsonschema` library, a validator this project did not write. Signatures and chains are the
business of the per-family wire tests; this test answers two questions: is there any message
on our subjects that an AIP reader could not parse, and is there a chunk of an Action whose
capability does not stream (upstream publishes none: the result is the whole answer)?
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import nats
import pytest
from nats.aio.msg import Msg

import worker.demo as demo
from subjects.grammar import DEFAULT_PREFIX
from worker.delegation.action_id import delegation_action_id
from worker.demo.console import Console
from worker.demo.environment import DemoEnvironment
from worker.operations.catalog import STREAMING

pytestmark = pytest.mark.demo

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas" / "json"
#: NATS' own subjects: the JetStream API and its acks, service discovery, the system account.
SERVER_SUBJECTS = ("$JS.", "$SRV.", "$SYS.", "$KV.", "$O.")
#: What one story must show at least, by message type (a capture that saw nothing proves
#: nothing).
EXPECTED_TYPES = (
    "aip.core.v1.action",
    "aip.core.v1.stream_chunk",
    "aip.core.v1.action_result",
    "aip.core.v1.escalation",
    "aip.core.v1.escalation_resolution",
    "aip.core.v1.cancel",
    "aip.agent.v1.delegation_request",
    "aip.lifecycle.v1.action_status",
    "aip.lifecycle.v1.action_list",
    "aip.audit.v1.receipt_chain",
)


@dataclass
class Capture:
    """Every message seen on the demo's NATS, in arrival order."""

    messages: list[tuple[str, bytes]] = field(default_factory=list)
    connection: Any = None

    async def start(self, url: str) -> None:
        async def keep(msg: Msg) -> None:
            self.messages.append((msg.subject, msg.data))

        self.connection = await nats.connect(url, allow_reconnect=False)
        await self.connection.subscribe(">", cb=keep)
        await self.connection.flush()

    async def stop(self) -> None:
        if self.connection is not None and not self.connection.is_closed:
            await self.connection.close()


def _validators() -> dict[str, jsonschema.Draft202012Validator]:
    found = {}
    for path in SCHEMAS.glob("aip.*.json"):
        schema = json.loads(path.read_text("utf-8"))
        found[path.stem] = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.FormatChecker()
        )
    return found


def _ours(subject: str) -> bool:
    return subject.startswith(DEFAULT_PREFIX + ".")


def _documents(messages: list[tuple[str, bytes]]) -> list[tuple[str, bytes, Any]]:
    """Each message that is not the server's, with its JSON document (None: not JSON)."""
    found: list[tuple[str, bytes, Any]] = []
    for subject, data in messages:
        if subject.startswith(SERVER_SUBJECTS) or not data:
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        found.append((subject, data, doc))
    return found


def _problems(messages: list[tuple[str, bytes]]) -> tuple[list[str], Counter[str]]:
    validators = _validators()
    problems: list[str] = []
    seen: Counter[str] = Counter()
    for subject, data, doc in _documents(messages):
        envelope = isinstance(doc, dict) and "aip_version" in doc
        if not envelope:
            if _ours(subject):
                problems.append(f"{subject}: not an AIP Envelope: {data[:120]!r}")
            continue
        assert isinstance(doc, dict)
        message_type = str(doc.get("message_type"))
        validator = validators.get(message_type)
        if validator is None:
            problems.append(f"{subject}: no exported schema for {message_type!r}")
            continue
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path)
            problems.append(f"{subject} ({message_type}): {where}: {errors[0].message[:200]}")
            continue
        seen[message_type] += 1
    return problems, seen


def _unstreamed_chunks(messages: list[tuple[str, bytes]]) -> list[str]:
    """The chunks of Actions whose capability does not stream, read by hand: an Action's
    capability from its Envelope (`body.action.capability_id`, a delegation's
    `child_action`; a delegation itself runs as the operator under the id
    `delegation_action_id` derives), whether it streams from the
    capability table (`STREAMING`: those the manifest publishes with expected completion
    `streaming`), a chunk's Action from `body.stream_chunk.action_id`."""
    capability_of: dict[str, str] = {}
    chunked: list[tuple[str, str]] = []
    for subject, _, doc in _documents(messages):
        body = doc.get("body") if isinstance(doc, dict) else None
        if not isinstance(body, dict):
            continue
        delegation = body.get("delegation_request")
        if isinstance(delegation, dict):
            # Executed by the operator under an id derived from the delegation's.
            delegated = delegation_action_id(str(delegation.get("delegation_id")))
            capability_of[delegated] = "cap:hermes_agent:*:operator"
            delegation = delegation.get("child_action")
        for action in (body.get("action"), delegation):
            if isinstance(action, dict):
                capability_of[str(action.get("id"))] = str(action.get("capability_id"))
        if isinstance(body.get("stream_chunk"), dict):
            chunked.append((subject, str(body["stream_chunk"].get("action_id"))))
    found = []
    for subject, action_id in chunked:
        capability = capability_of.get(action_id)
        if capability is None:
            found.append(f"{subject}: a chunk of an Action never seen")
        elif capability.startswith("cap:hermes_agent:") and (
            capability.rsplit(":", 1)[-1] not in STREAMING
        ):
            found.append(f"{subject}: a chunk of {capability}, which does not stream")
    return found


def _summary(problems: list[str], total: int) -> str:
    """One line per subject family (ids folded to `*`), with its count and first problem."""
    families: dict[str, tuple[int, str]] = {}
    for problem in problems:
        subject = problem.split(" ", 1)[0].rstrip(":")
        family = re.sub(r"(act|esc|msg|dlg)_[0-9a-f]+", "*", subject)
        count, first = families.get(family, (0, problem))
        families[family] = (count + 1, first)
    lines = [f"{len(problems)} of {total} messages are not schema-valid AIP Envelopes:"]
    lines += [f"  {n:4d} x {family}: {first[:240]}" for family, (n, first) in families.items()]
    return "\n".join(lines)


async def test_every_message_of_the_demo_story_is_a_schema_valid_aip_envelope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capture = Capture()

    class CapturingEnvironment(DemoEnvironment):
        async def start_services(self) -> None:
            await super().start_services()
            assert self.nats is not None
            await capture.start(self.nats.url)

    monkeypatch.setattr(demo, "DemoEnvironment", CapturingEnvironment)
    try:
        code = await demo.run_demo(short=True, console=Console())
    finally:
        await capture.stop()
    assert code == demo.EXIT_OK
    problems, seen = _problems(capture.messages)
    assert not problems, _summary(problems, len(capture.messages))
    for message_type in EXPECTED_TYPES:
        assert seen[message_type] > 0, (message_type, dict(seen))
    unstreamed = _unstreamed_chunks(capture.messages)
    assert not unstreamed, unstreamed[:10]
