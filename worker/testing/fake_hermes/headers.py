"""The `X-Hermes-Session-Id` / `X-Hermes-Session-Key` request headers and their checks."""

from __future__ import annotations

import hashlib
import re

from aiohttp import web

SESSION_ID_HEADER = "X-Hermes-Session-Id"
SESSION_KEY_HEADER = "X-Hermes-Session-Key"
MAX_HEADER_VALUE = 256
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")


def session_id_problem(value: str) -> str | None:
    """The short-form error message for a bad session id header, or None."""
    if len(value) > MAX_HEADER_VALUE:
        return "Session ID too long"
    if ".." in value or "/" in value or "\\" in value or _CONTROL.search(value):
        return "Invalid session ID"
    if _DRIVE.match(value):
        return "Invalid session ID"
    return None


def session_key_problem(value: str) -> str | None:
    """The short-form error message for a bad session key header, or None."""
    if len(value) > MAX_HEADER_VALUE:
        return "Session key too long"
    if _CONTROL.search(value):
        return "Invalid session key"
    return None


def echo_key(request: web.Request) -> dict[str, str]:
    """`X-Hermes-Session-Key` echoed back when the client sent one."""
    key = request.headers.get(SESSION_KEY_HEADER)
    return {SESSION_KEY_HEADER: key} if key is not None else {}


def derived_chat_session_id(system_text: str, first_user: str) -> str:
    """`api-` + 16 hex of sha256(system + newline + first user message): stable per chat."""
    digest = hashlib.sha256(f"{system_text}\n{first_user}".encode()).hexdigest()
    return "api-" + digest[:16]
