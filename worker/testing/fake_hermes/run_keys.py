"""The durable `Idempotency-Key` store of `POST /v1/runs` (upstream Hermes after 0.19).

Modelled on upstream's design (NousResearch/hermes-agent PR #88408: an SQLite
`runs_idempotency.db`): key -> (fingerprint of the body and the session-key header, run id).
Only fingerprints and run ids are kept, never a payload. A restart keeps it (it is on disk
in Hermes), so a client that lost its reply learns its run even across a restart. On in the
fake only with `FakeConfig.runs_idempotency`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

MAX_KEYS = 10_000
#: Upstream bounds the header; longer keys are refused with a 400.
MAX_KEY_CHARS = 255


@dataclass(frozen=True, slots=True)
class KeyedRun:
    fingerprint: str
    run_id: str


def fingerprint(body: bytes, session_key: str | None) -> str:
    """What makes two submissions "the same": the exact body and the memory-scope header."""
    digest = hashlib.sha256(body)
    digest.update(b"\0" + (session_key or "").encode())
    return digest.hexdigest()


class RunKeys:
    """Key -> the run it created, bounded in size; survives `FakeState.restart`."""

    def __init__(self) -> None:
        self._keys: OrderedDict[str, KeyedRun] = OrderedDict()

    def get(self, key: str) -> KeyedRun | None:
        return self._keys.get(key)

    def put(self, key: str, entry: KeyedRun) -> None:
        self._keys[key] = entry
        self._keys.move_to_end(key)
        while len(self._keys) > MAX_KEYS:
            self._keys.popitem(last=False)
