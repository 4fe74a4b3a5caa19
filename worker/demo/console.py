"""What the demo prints: setup lines, chunks as they arrive, a status line per Action, a summary.

Plain text with no cursor tricks, so the same output reads well in a terminal, in a CI log
and in the test that asserts the summary. Chunk payloads are shortened to their text (a
delta, a message) and cut to one line; the full messages are on the chunk stream.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from schemas.chunk import StreamChunk
from schemas.result import ActionResult

_WIDTH = 76
#: The first line of the summary; the test finds the table by it.
SUMMARY_TITLE = "summary"
#: The last line: `demo: N/M steps reached their expected state in S s`.
VERDICT_PREFIX = "demo:"


@dataclass(frozen=True, slots=True)
class StepReport:
    """One row of the summary table."""

    key: str
    title: str
    expected: str
    got: str
    reached: bool
    seconds: float
    action_id: str | None = None


def text_of(payload: Any) -> str:
    """The human part of a chunk payload: delta text, message text, or compact JSON."""
    if payload is None:
        return ""
    if isinstance(payload, str):
        return payload
    if isinstance(payload, dict):
        choices = payload.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta") or choices[0].get("message") or {}
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                return str(delta["content"])
        for key in ("delta", "text", "content", "output", "status", "error"):
            value = payload.get(key)
            if isinstance(value, str) and value:
                return value
    return json.dumps(payload, separators=(",", ":"), default=str)


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split()) if text.strip() else repr(text)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class Console:
    """Writes to `out` (stdout by default) and flushes every line: the story is live."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.started = time.monotonic()
        self.muted = False

    def line(self, text: str = "") -> None:
        if not self.muted:
            self.out.write(text + "\n")
            self.out.flush()

    def final(self, text: str) -> None:
        """The last words after an interruption: nothing the unwinding story says follows."""
        self.line(text)
        self.muted = True

    def setup(self, what: str, detail: str) -> None:
        self.line(f"  {what:<10} {detail}")

    def step(self, key: str, title: str) -> None:
        self.line()
        self.line(f"[{key}] {title}")

    def note(self, text: str) -> None:
        self.line(f"    · {text}")

    def published(self, action_id: str, operation: str) -> None:
        self.line(f"    → published {action_id} ({operation})")

    def chunk(self, chunk: StreamChunk) -> None:
        kind = chunk.__struct_config__.tag
        event = f" {chunk.provider_event}" if chunk.provider_event else ""
        text = _one_line(text_of(chunk.payload), _WIDTH - 30)
        self.line(f"      #{chunk.seq:<3} {kind!s:<16}{event:<18} {text}")

    def status(self, result: ActionResult) -> None:
        code = f" ({result.error.code})" if result.error is not None else ""
        self.line(
            f"    ■ {result.action_id} {result.status.value}{code} "
            f"settled by {result.settled_by} (fence {result.fence})"
        )

    def outcome(self, report: StepReport) -> None:
        mark = "✔" if report.reached else "✘"
        self.line(
            f"  {mark} {report.got} (expected {report.expected}) in {report.seconds:.2f} s"
        )

    def summary(self, reports: list[StepReport]) -> bool:
        """Print the table and the verdict line; True when every step reached its state."""
        title_w = max([len(r.title) for r in reports] + [4])
        exp_w = max([len(r.expected) for r in reports] + [8])
        got_w = max([len(r.got) for r in reports] + [3])
        self.line()
        self.line(SUMMARY_TITLE)
        header = f"  {'':<3}{'step':<{title_w}}  {'expected':<{exp_w}}  {'got':<{got_w}}  reached"
        self.line(header)
        self.line("  " + "-" * (len(header) - 2))
        for r in reports:
            self.line(
                f"  {r.key:<3}{r.title:<{title_w}}  {r.expected:<{exp_w}}  {r.got:<{got_w}}  "
                f"{'yes' if r.reached else 'NO'}"
            )
        reached = sum(1 for r in reports if r.reached)
        elapsed = time.monotonic() - self.started
        self.line()
        self.line(
            f"{VERDICT_PREFIX} {reached}/{len(reports)} steps reached their expected state "
            f"in {elapsed:.1f} s"
        )
        return reached == len(reports)
