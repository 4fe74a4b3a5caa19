"""`/api/sessions…`: CRUD, messages, fork, and synchronous or streamed session chat.

Session chat ignores the run cap and has no approval channel, and an LLM failure is a 200
whose message is the error text; the stream names every event and suffixes each payload with
`session_id`, `run_id`, `seq` and `ts`, ending with `done`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from aiohttp import web

from worker.testing.fake_hermes import agent
from worker.testing.fake_hermes.envelopes import (
    aiohttp_500,
    json_reply,
    openai_error,
    read_json,
    session_not_found,
    short_error,
)
from worker.testing.fake_hermes.headers import SESSION_ID_HEADER, echo_key, session_key_problem
from worker.testing.fake_hermes.inputs import content_text
from worker.testing.fake_hermes.sessions import (
    Session,
    SessionError,
    TitleTooLongOnCreate,
    check_create_id,
)
from worker.testing.fake_hermes.sse import IDLE, KEEPALIVE, named_frame, open_stream, paced
from worker.testing.fake_hermes.state import STATE, FakeState
from worker.testing.fake_hermes.stats import now

DEFAULT_LIMIT = 50
MAX_LIMIT = 200


def _envelope(session: Session) -> dict[str, Any]:
    return {"object": "hermes.session", "session": session.to_json()}


def _error(exc: SessionError) -> web.Response:
    return openai_error(exc.message, status=exc.status, code=exc.code)


def _int_param(raw: str | None, default: int) -> int:
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        return default
    return value if value >= 0 else default


async def list_sessions(request: web.Request) -> web.Response:
    """GET /api/sessions: `limit` ≤ 200, `offset`, `source`; `has_more` = page is full."""
    state = request.app[STATE]
    limit = min(_int_param(request.query.get("limit"), DEFAULT_LIMIT), MAX_LIMIT)
    offset = _int_param(request.query.get("offset"), 0)
    rows = state.sessions.page(limit=limit, offset=offset, source=request.query.get("source"))
    return json_reply(
        {
            "object": "list",
            "data": [s.to_json(listing=True) for s in rows],
            "limit": limit,
            "offset": offset,
            "has_more": len(rows) == limit,
        }
    )


async def create_session(request: web.Request) -> web.Response:
    """POST /api/sessions → 201 (a too-long title is aiohttp's text 500, as in 0.19.0)."""
    state = request.app[STATE]
    ok, body = await read_json(request)
    if not ok:
        return openai_error("Invalid JSON in request body")
    if not isinstance(body, dict):
        return openai_error("Request body must be a JSON object")
    raw_id = body.get("id", body.get("session_id"))
    system_prompt = body.get("system_prompt")
    try:
        session_id = None if raw_id is None else str(raw_id)
        if session_id is not None:
            check_create_id(session_id)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise SessionError(400, "invalid_system_prompt", "system_prompt must be a string")
        model = body.get("model")
        session = state.sessions.create(
            session_id, body.get("title"), str(model) if model else None, system_prompt
        )
    except SessionError as exc:
        return _error(exc)
    except TitleTooLongOnCreate:
        return aiohttp_500()
    return json_reply(_envelope(session), status=201)


async def get_session(request: web.Request) -> web.Response:
    """GET /api/sessions/{session_id} (no format check on the id)."""
    session_id = request.match_info["session_id"]
    session = request.app[STATE].sessions.get(session_id)
    if session is None:
        return session_not_found(session_id)
    return json_reply(_envelope(session))


async def patch_session(request: web.Request) -> web.Response:
    """PATCH: existence is checked before the body is even parsed."""
    state = request.app[STATE]
    session_id = request.match_info["session_id"]
    session = state.sessions.get(session_id)
    if session is None:
        return session_not_found(session_id)
    ok, body = await read_json(request)
    if not ok:
        return openai_error("Invalid JSON in request body")
    if not isinstance(body, dict):
        return openai_error("Request body must be a JSON object")
    try:
        state.sessions.patch(session, body)
    except SessionError as exc:
        return _error(exc)
    return json_reply(_envelope(session))


async def delete_session(request: web.Request) -> web.Response:
    """DELETE → `{"object":"hermes.session.deleted","id","deleted":true}`."""
    session_id = request.match_info["session_id"]
    try:
        request.app[STATE].sessions.delete(session_id)
    except SessionError as exc:
        return _error(exc)
    return json_reply({"object": "hermes.session.deleted", "id": session_id, "deleted": True})


async def session_messages(request: web.Request) -> web.Response:
    """GET …/messages: the whole transcript, no pagination."""
    session_id = request.match_info["session_id"]
    session = request.app[STATE].sessions.get(session_id)
    if session is None:
        return session_not_found(session_id)
    return json_reply({"object": "list", "session_id": session.id, "data": session.messages})


async def fork_session(request: web.Request) -> web.Response:
    """POST …/fork → 201; rows are written before the title is validated."""
    state = request.app[STATE]
    session_id = request.match_info["session_id"]
    source = state.sessions.get(session_id)
    if source is None:
        return session_not_found(session_id)
    ok, body = await read_json(request)
    if not ok:
        return openai_error("Invalid JSON in request body")
    if not isinstance(body, dict):
        return openai_error("Request body must be a JSON object")
    raw_id = body.get("id", body.get("session_id"))
    try:
        child = state.sessions.fork(
            source, None if raw_id is None else str(raw_id), body.get("title"), "title" in body
        )
    except SessionError as exc:
        return _error(exc)
    return json_reply(_envelope(child), status=201)


class _ChatRequest:
    """A validated session chat request."""

    def __init__(self, session: Session, text: str) -> None:
        self.session = session
        self.text = text


async def _parse_chat(request: web.Request) -> _ChatRequest | web.Response:
    state = request.app[STATE]
    key = request.headers.get("X-Hermes-Session-Key")
    if key is not None and (problem := session_key_problem(key)) is not None:
        return short_error(problem)
    session_id = request.match_info["session_id"]
    session = state.sessions.get(session_id)
    if session is None:
        return session_not_found(session_id)
    ok, body = await read_json(request)
    if not ok or not isinstance(body, dict):
        return openai_error("Invalid JSON in request body")
    text = content_text(body.get("message", body.get("input")))
    if not text.strip():
        return openai_error("Missing 'message' field", code="missing_message")
    system = body.get("system_message", body.get("instructions"))
    if system is not None and not isinstance(system, str):
        return openai_error("system_message must be a string", code="invalid_system_message")
    return _ChatRequest(session, text)


def _record(state: FakeState, chat: _ChatRequest, outcome: agent.Finished | agent.Failed) -> None:
    if isinstance(outcome, agent.Finished):
        state.sessions.record_turn(
            chat.session.id, chat.text, outcome.messages, outcome.usage, state.config.llm_model
        )
    else:
        state.sessions.record_turn(chat.session.id, chat.text, [], None, state.config.llm_model)


async def session_chat(request: web.Request) -> web.Response:
    """POST …/chat: one synchronous turn; failures are 200 with the error as content."""
    state = request.app[STATE]
    chat = await _parse_chat(request)
    if isinstance(chat, web.Response):
        return chat
    outcome = await agent.collect(chat.text)
    _record(state, chat, outcome)
    if isinstance(outcome, agent.Finished):
        content, usage = outcome.text, outcome.usage
    else:
        content, usage = outcome.error, agent.ZERO_USAGE
    headers = {SESSION_ID_HEADER: chat.session.id, **echo_key(request)}
    return json_reply(
        {
            "object": "hermes.session.chat.completion",
            "session_id": chat.session.id,
            "message": {"role": "assistant", "content": content},
            "usage": usage.as_hermes(),
        },
        headers=headers,
    )


async def session_chat_stream(request: web.Request) -> web.StreamResponse:
    """POST …/chat/stream: named events, each suffixed with session_id/run_id/seq/ts."""
    state = request.app[STATE]
    chat = await _parse_chat(request)
    if isinstance(chat, web.Response):
        return chat
    session_id = chat.session.id
    run_id = "run_" + secrets.token_hex(16)
    message_id = "msg_" + secrets.token_hex(16)
    seq = 0

    def frame(event: str, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        payload = {**fields, "session_id": session_id, "run_id": run_id, "seq": seq, "ts": now()}
        return named_frame(event, payload)

    with state.connections.track(request):
        response = await open_stream(request, {SESSION_ID_HEADER: session_id, **echo_key(request)})
        await response.write(
            frame("run.started", user_message={"role": "user", "content": chat.text})
        )
        await response.write(
            frame("message.started", message={"id": message_id, "role": "assistant"})
        )
        async for step in paced(agent.run_turn(chat.text, None), state.config.keepalive_s):
            if step is IDLE:
                await response.write(KEEPALIVE)
                continue
            match step:
                case agent.ToolStarted(call):
                    await response.write(
                        frame(
                            "tool.started",
                            message_id=message_id,
                            tool_name=agent.TOOL,
                            preview=call.command,
                            args={"command": call.command},
                        )
                    )
                case agent.ToolCompleted():
                    await response.write(
                        frame(
                            "tool.completed",
                            message_id=message_id,
                            tool_name=agent.TOOL,
                            preview=None,
                            args=None,
                        )
                    )
                case agent.TextDelta(piece, after_tool):
                    delta = "\n\n" + piece if after_tool else piece
                    await response.write(
                        frame("assistant.delta", message_id=message_id, delta=delta)
                    )
                case agent.Finished(text, usage, messages):
                    _record(state, chat, step)
                    await response.write(
                        frame(
                            "tool.progress",
                            message_id=message_id,
                            tool_name="_thinking",
                            delta=text,
                        )
                    )
                    await response.write(_completed(frame, message_id, text))
                    await response.write(
                        frame(
                            "run.completed",
                            message_id=message_id,
                            completed=True,
                            messages=messages,
                            usage=usage.as_hermes(),
                        )
                    )
                case agent.Failed(error):
                    _record(state, chat, step)
                    await response.write(_completed(frame, message_id, error))
                    await response.write(
                        frame(
                            "run.completed",
                            message_id=message_id,
                            completed=True,
                            messages=[],
                            usage=agent.ZERO_USAGE.as_hermes(),
                        )
                    )
        await response.write(frame("done"))
        await response.write_eof()
        return response


def _completed(frame: Callable[..., bytes], message_id: str, content: str) -> bytes:
    return frame(
        "assistant.completed",
        message_id=message_id,
        content=content,
        completed=True,
        partial=False,
        interrupted=False,
    )
