"""`POST /v1/chat/completions`: OpenAI-shaped replies around one scripted agent turn.

Streams are unnamed `chat.completion.chunk` frames ending in `data: [DONE]`, with tool
lifecycle on named `event: hermes.tool.progress` frames. Failures are still HTTP 200 and are
flagged in a `hermes` block (and, non-streaming, in `X-Hermes-*` headers).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

from aiohttp import web

from worker.testing.fake_hermes import agent
from worker.testing.fake_hermes.envelopes import (
    dumps,
    json_reply,
    openai_error,
    rate_limited,
    read_json,
    short_error,
)
from worker.testing.fake_hermes.headers import (
    SESSION_ID_HEADER,
    SESSION_KEY_HEADER,
    derived_chat_session_id,
    echo_key,
    session_id_problem,
    session_key_problem,
)
from worker.testing.fake_hermes.inputs import content_text
from worker.testing.fake_hermes.sse import (
    DONE,
    IDLE,
    KEEPALIVE,
    data_frame,
    named_frame,
    open_stream,
    paced,
)
from worker.testing.fake_hermes.state import STATE, FakeState

_ALLOWED_PARTS = frozenset({"text", "input_text", "output_text", "image_url", "input_image"})
_FINGERPRINT_FIELDS = ("model", "messages", "tools", "tool_choice", "stream")
TOOL_EMOJI = "\U0001f4bb"


def _unsupported_part(messages: list[Any]) -> web.Response | None:
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(part, dict) and str(kind).lower() not in _ALLOWED_PARTS:
                return openai_error(
                    f"Unsupported content part type {kind!r}. "
                    "Only text and image_url/input_image parts are supported.",
                    code="unsupported_content_type",
                    param=f"messages[{index}].content",
                )
    return None


def _coerce_stream(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _completion_id() -> str:
    return "chatcmpl-" + secrets.token_hex(15)[:29]


def _hermes_block(error: str) -> dict[str, Any]:
    return {
        "completed": False,
        "partial": False,
        "failed": True,
        "error": error,
        "error_code": "agent_error",
    }


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions, streaming or not."""
    state = request.app[STATE]
    ok, body = await read_json(request)
    if not ok or not isinstance(body, dict):
        return openai_error("Invalid JSON in request body")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return short_error("Missing or invalid 'messages' field")
    unsupported = _unsupported_part(messages)
    if unsupported is not None:
        return unsupported
    dicts = [m for m in messages if isinstance(m, dict)]
    users = [content_text(m.get("content")) for m in dicts if m.get("role") == "user"]
    if not any(
        content_text(m.get("content")).strip()
        for m in dicts
        if m.get("role") in ("user", "assistant")
    ):
        return short_error("No user message found in messages")
    header_id = request.headers.get(SESSION_ID_HEADER)
    if header_id is not None and (problem := session_id_problem(header_id)) is not None:
        return short_error(problem)
    header_key = request.headers.get(SESSION_KEY_HEADER)
    if header_key is not None and (problem := session_key_problem(header_key)) is not None:
        return short_error(problem)
    if state.runs.at_capacity():
        return rate_limited(state.config.max_concurrent_runs)
    system = next((content_text(m.get("content")) for m in dicts if m.get("role") == "system"), "")
    session_id = header_id or derived_chat_session_id(system, users[0] if users else "")
    text = users[-1] if users else ""
    model = str(body.get("model") or "hermes-agent")
    headers = {SESSION_ID_HEADER: session_id, **echo_key(request)}
    if _coerce_stream(body.get("stream")):
        with state.runs.agent_slot():
            return await _stream(request, state, text, model, session_id, headers)
    key = request.headers.get("Idempotency-Key")
    with state.runs.agent_slot():
        if key:
            fingerprint = hashlib.sha256(
                dumps({k: body.get(k) for k in _FINGERPRINT_FIELDS}).encode()
            ).hexdigest()
            outcome = await state.idempotency.outcome(
                "chat:" + key, fingerprint, lambda: _turn(state, session_id, text)
            )
        else:
            outcome = await _turn(state, session_id, text)
    return _non_stream_reply(outcome, model, headers)


async def _turn(state: FakeState, session_id: str, text: str) -> agent.Finished | agent.Failed:
    outcome = await agent.collect(text)
    _record(state, session_id, text, outcome)
    return outcome


def _record(
    state: FakeState, session_id: str, text: str, outcome: agent.Finished | agent.Failed
) -> None:
    if isinstance(outcome, agent.Finished):
        state.sessions.record_turn(
            session_id, text, outcome.messages, outcome.usage, state.config.llm_model
        )
    else:
        state.sessions.record_turn(session_id, text, [], None, state.config.llm_model)


def _non_stream_reply(
    outcome: agent.Finished | agent.Failed, model: str, headers: dict[str, str]
) -> web.Response:
    body: dict[str, Any] = {
        "id": _completion_id(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
    }
    if isinstance(outcome, agent.Finished):
        body["choices"] = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": outcome.text},
                "finish_reason": "stop",
            }
        ]
        body["usage"] = outcome.usage.as_openai()
        return json_reply(body, headers=headers)
    body["choices"] = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": outcome.error},
            "finish_reason": "error",
        }
    ]
    body["usage"] = agent.ZERO_USAGE.as_openai()
    body["hermes"] = _hermes_block(outcome.error)
    failure_headers = {
        **headers,
        "X-Hermes-Completed": "false",
        "X-Hermes-Partial": "false",
        "X-Hermes-Error": outcome.error[:200],
    }
    return json_reply(body, headers=failure_headers)


async def _stream(
    request: web.Request,
    state: FakeState,
    text: str,
    model: str,
    session_id: str,
    headers: dict[str, str],
) -> web.StreamResponse:
    completion_id = _completion_id()
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return data_frame(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
                **extra,
            }
        )

    with state.connections.track(request):
        response = await open_stream(request, headers)
        await response.write(chunk({"role": "assistant"}, None))
        async for step in paced(agent.run_turn(text, None), state.config.keepalive_s):
            if step is IDLE:
                await response.write(KEEPALIVE)
                continue
            match step:
                case agent.ToolStarted(call):
                    progress = {
                        "tool": agent.TOOL,
                        "emoji": TOOL_EMOJI,
                        "label": call.command,
                        "toolCallId": call.call_id,
                        "status": "running",
                    }
                    await response.write(named_frame("hermes.tool.progress", progress))
                case agent.ToolCompleted(call):
                    progress = {
                        "tool": agent.TOOL,
                        "toolCallId": call.call_id,
                        "status": "completed",
                    }
                    await response.write(named_frame("hermes.tool.progress", progress))
                case agent.TextDelta(piece, after_tool):
                    content = "\n\n" + piece if after_tool else piece
                    await response.write(chunk({"content": content}, None))
                case agent.Finished(_, usage):
                    _record(state, session_id, text, step)
                    await response.write(chunk({}, "stop", usage=usage.as_openai()))
                case agent.Failed(error):
                    _record(state, session_id, text, step)
                    await response.write(
                        chunk(
                            {},
                            "error",
                            usage=agent.ZERO_USAGE.as_openai(),
                            error={"message": error, "type": "agent_error"},
                            hermes=_hermes_block(error),
                        )
                    )
        await response.write(DONE)
        await response.write_eof()
        return response
