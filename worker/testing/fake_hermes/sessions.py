"""The session store (Hermes' `state.db`), with the validation quirks of 0.19.0.

Sessions outlive a fake restart, as the SQLite file outlives a Hermes restart. The HTTP
routes in `routes_sessions.py` map this module's `SessionError`s onto the exact envelopes;
here live the rules: id checks that differ between create and fork, title cleaning and
uniqueness, end_reason that only the first caller sets, and the message transcript.
"""

from __future__ import annotations

import itertools
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from worker.testing._errors import HarnessError
from worker.testing.fake_hermes.agent import Usage
from worker.testing.fake_hermes.config import ADVERTISED_MODEL
from worker.testing.fake_hermes.stats import now

MAX_ID_LENGTH = 256
MAX_TITLE_LENGTH = 100
_ZERO_WIDTH = re.compile("[\u200b-\u200f\u2028-\u202f\u2060-\u206f\ufeff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")
_LINEAGE = re.compile(r" #\d+$")


class SessionError(HarnessError):
    """A rejected session operation: HTTP status, error code and message."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class TitleTooLongOnCreate(HarnessError):
    """Create answers this with aiohttp's text/plain 500 (an unhandled exception in Hermes)."""


@dataclass(slots=True)
class Session:
    """One row of the sessions table plus its transcript."""

    id: str
    model: str
    started_at: float
    title: str | None = None
    source: str = "api_server"
    ended_at: float | None = None
    end_reason: str | None = None
    tool_call_count: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    estimated_cost_usd: float | None = None
    api_call_count: int = 0
    parent_session_id: str | None = None
    system_prompt: str | None = None
    has_model_config: bool = False
    messages: list[dict[str, Any]] = field(default_factory=list)

    def last_active(self) -> float:
        """Latest message time, else the start time (the list's sort key)."""
        return self.messages[-1]["timestamp"] if self.messages else self.started_at

    def preview(self) -> str | None:
        """First user message, 60 characters at most plus `...`, newlines as spaces."""
        for message in self.messages:
            if message["role"] == "user":
                text = str(message["content"]).replace("\r", " ").replace("\n", " ")
                return text[:60] + "..." if len(text) > 60 else text
        return None

    def to_json(self, *, listing: bool = False) -> dict[str, Any]:
        """The session object `S`, keys in Hermes' order; list rows add two keys."""
        body: dict[str, Any] = {
            "id": self.id,
            "source": self.source,
            "user_id": None,
            "model": self.model,
            "title": self.title,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
            "message_count": len(self.messages),
            "tool_call_count": self.tool_call_count,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "reasoning_tokens": 0,
            "estimated_cost_usd": self.estimated_cost_usd,
            "actual_cost_usd": None,
            "api_call_count": self.api_call_count,
            "parent_session_id": self.parent_session_id,
        }
        if listing:
            body["last_active"] = self.last_active()
            body["preview"] = self.preview()
        body["has_system_prompt"] = self.system_prompt is not None
        body["has_model_config"] = self.has_model_config
        return body


def clean_title(raw: object) -> str | None:
    """Strip control and zero-width characters, collapse whitespace; blank becomes None."""
    if raw is None:
        return None
    text = _ZERO_WIDTH.sub("", _CONTROL.sub(" ", str(raw)))
    text = " ".join(text.split())
    return text or None


def check_create_id(session_id: str) -> None:
    """Create-time id rules: no traversal, separators, control characters or drive prefix."""
    if len(session_id) > MAX_ID_LENGTH:
        raise SessionError(400, "invalid_session_id", "Session ID too long")
    if (
        ".." in session_id
        or "/" in session_id
        or "\\" in session_id
        or _CONTROL.search(session_id)
        or _DRIVE.match(session_id)
    ):
        raise SessionError(400, "invalid_session_id", "Invalid session ID")


def check_fork_id(session_id: str) -> None:
    """Fork-time id rules are weaker: only CR, LF and NUL are refused."""
    if any(c in session_id for c in "\r\n\x00"):
        raise SessionError(400, "invalid_session_id", "Invalid session ID")


def auto_id() -> str:
    """`api_<unix seconds>_<8 hex>`, the id Hermes gives a session created without one."""
    return f"api_{int(time.time())}_{secrets.token_hex(4)}"


class SessionStore:
    """All sessions, keyed by id; survives `FakeHermes.restart()`."""

    def __init__(self, llm_model: str) -> None:
        self._llm_model = llm_model
        self._sessions: dict[str, Session] = {}
        self._message_ids = itertools.count(1)

    def get(self, session_id: str) -> Session | None:
        """The session, or None."""
        return self._sessions.get(session_id)

    def _require(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(404, "session_not_found", f"Session not found: {session_id}")
        return session

    def _title_owner(self, title: str, exclude: str | None) -> str | None:
        for other in self._sessions.values():
            if other.title == title and other.id != exclude:
                return other.id
        return None

    def page(self, *, limit: int, offset: int, source: str | None) -> list[Session]:
        """Most recently active first, then the page."""
        rows = [s for s in self._sessions.values() if source is None or s.source == source]
        rows.sort(key=lambda s: s.last_active(), reverse=True)
        return rows[offset : offset + limit]

    def create(
        self,
        session_id: str | None,
        title: object,
        model: str | None,
        system_prompt: str | None,
    ) -> Session:
        """POST /api/sessions: ids checked, duplicates refused, title checked last."""
        if session_id is None:
            session_id = auto_id()
        check_create_id(session_id)
        if session_id in self._sessions:
            raise SessionError(409, "session_exists", f"Session already exists: {session_id}")
        cleaned = clean_title(title)
        if cleaned is not None:
            owner = self._title_owner(cleaned, None)
            if owner is not None:
                raise SessionError(400, "invalid_title", f"Title already in use by session {owner}")
            if len(cleaned) > MAX_TITLE_LENGTH:
                raise TitleTooLongOnCreate(cleaned)
        session = Session(
            id=session_id,
            model=model or ADVERTISED_MODEL,
            started_at=now(),
            title=cleaned,
            system_prompt=system_prompt,
            has_model_config=False,
        )
        self._sessions[session_id] = session
        return session

    def _check_title(self, title: str, session_id: str) -> None:
        if len(title) > MAX_TITLE_LENGTH:
            raise SessionError(
                400,
                "invalid_title",
                f"Title too long ({len(title)} chars, max {MAX_TITLE_LENGTH})",
            )
        owner = self._title_owner(title, session_id)
        if owner is not None:
            raise SessionError(
                400, "invalid_title", f"Title '{title}' is already in use by session {owner}"
            )

    def require(self, session_id: str) -> Session:
        """The session, or the 404 `session_not_found` error."""
        return self._require(session_id)

    def patch(self, session: Session, body: dict[str, Any]) -> Session:
        """PATCH: only `title` and `end_reason`; the first end_reason wins."""
        unsupported = sorted(set(body) - {"title", "end_reason"})
        if unsupported:
            raise SessionError(
                400,
                "unsupported_session_field",
                f"Unsupported session fields: {', '.join(unsupported)}",
            )
        if "title" in body:
            cleaned = clean_title(body["title"])
            if cleaned is not None:
                self._check_title(cleaned, session.id)
            session.title = cleaned
        if body.get("end_reason") and session.ended_at is None:
            session.ended_at = now()
            session.end_reason = str(body["end_reason"])
        return session

    def delete(self, session_id: str) -> None:
        """Delete a session; its fork children are orphaned, not deleted."""
        self._require(session_id)
        del self._sessions[session_id]
        for child in self._sessions.values():
            if child.parent_session_id == session_id:
                child.parent_session_id = None

    def fork(self, source: Session, new_id: str | None, title: object, has_title: bool) -> Session:
        """Copy a session; rows are committed before the title is checked (as in 0.19.0)."""
        if new_id is None:
            new_id = auto_id()
        check_fork_id(new_id)
        if new_id in self._sessions:
            raise SessionError(409, "session_exists", f"Session already exists: {new_id}")
        child = Session(
            id=new_id,
            model=source.model,
            started_at=now(),
            parent_session_id=source.id,
            system_prompt=source.system_prompt,
            has_model_config=False,
        )
        for message in source.messages:
            child.messages.append({**message, "id": next(self._message_ids), "session_id": new_id})
        self._sessions[new_id] = child
        if source.ended_at is None:
            source.ended_at = now()
            source.end_reason = "branched"
        wanted = clean_title(title) if has_title else self._lineage_title(source)
        if wanted is not None:
            self._check_title(wanted, new_id)
        child.title = wanted
        return child

    def _lineage_title(self, source: Session) -> str:
        base = _LINEAGE.sub("", source.title) if source.title else "fork"
        taken = {s.title for s in self._sessions.values()}
        if source.title is None and base not in taken:
            return base
        n = 2
        while f"{base} #{n}" in taken:
            n += 1
        return f"{base} #{n}"

    def ensure(self, session_id: str) -> Session:
        """The session a run or chat writes to, created on first use."""
        session = self._sessions.get(session_id)
        if session is None:
            session = Session(id=session_id, model=self._llm_model, started_at=now())
            self._sessions[session_id] = session
        return session

    def record_turn(
        self,
        session_id: str,
        user_text: str,
        messages: list[dict[str, Any]],
        usage: Usage | None,
        model: str,
    ) -> None:
        """Append one agent turn: the user message always, the replies only on success."""
        session = self.ensure(session_id)
        session.model = model
        session.system_prompt = session.system_prompt or "<hermes system prompt>"
        self._append(session, {"role": "user", "content": user_text})
        for message in messages:
            self._append(session, message)
            session.tool_call_count += len(message.get("tool_calls") or [])
        if usage is not None:
            session.input_tokens += usage.input_tokens
            session.output_tokens += usage.output_tokens
            session.api_call_count += 1 + sum(1 for m in messages if m["role"] == "tool")
            session.estimated_cost_usd = 0.0

    def _append(self, session: Session, message: dict[str, Any]) -> None:
        session.messages.append(
            {
                "id": next(self._message_ids),
                "session_id": session.id,
                "role": message["role"],
                "content": message.get("content", ""),
                "tool_call_id": message.get("tool_call_id"),
                "tool_calls": message.get("tool_calls"),
                "tool_name": message.get("tool_name"),
                "timestamp": now(),
                "token_count": None,
                "finish_reason": message.get("finish_reason"),
                "reasoning": message.get("reasoning"),
                "reasoning_content": None,
            }
        )
