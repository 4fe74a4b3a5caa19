"""`/v1/responses`: create (stream or not), retrieve and delete stored responses.

Quirks kept on purpose: LLM failures still answer `completed` with the error as the text; a
streamed `function_call_output` is an array of `input_text` parts but a plain string in the
non-stream body; text deltas are batched every 50 ms; a stream has no `[DONE]`; a client that
disconnects does not interrupt the agent, whose stored snapshot ends `incomplete`.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
import uuid
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
from worker.testing.fake_hermes.headers import SESSION_ID_HEADER, echo_key
from worker.testing.fake_hermes.inputs import last_input_text
from worker.testing.fake_hermes.responses_store import StoredResponse
from worker.testing.fake_hermes.sse import named_frame, open_stream, paced
from worker.testing.fake_hermes.state import STATE, FakeState

BATCH_S = 0.05
_FINGERPRINT_FIELDS = (
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "conversation",
    "tools",
    "store",
)


def _hex_id(prefix: str, length: int) -> str:
    return prefix + secrets.token_hex(length)[:length]


def _not_found(response_id: str) -> web.Response:
    return openai_error(f"Response not found: {response_id}", status=404)


async def get_response(request: web.Request) -> web.Response:
    """GET /v1/responses/{response_id} → exactly the stored object."""
    response_id = request.match_info["response_id"]
    stored = request.app[STATE].responses.get(response_id)
    if stored is None:
        return _not_found(response_id)
    return json_reply(stored.data)


async def delete_response(request: web.Request) -> web.Response:
    """DELETE /v1/responses/{response_id} → `{"id","object":"response","deleted":true}`."""
    response_id = request.match_info["response_id"]
    if not request.app[STATE].responses.delete(response_id):
        return _not_found(response_id)
    return json_reply({"id": response_id, "object": "response", "deleted": True})


class _Request:
    """A validated create request."""

    def __init__(
        self, text: str, model: str, session_id: str, store: bool, conversation: str | None
    ) -> None:
        self.text = text
        self.model = model
        self.session_id = session_id
        self.store = store
        self.conversation = conversation
        self.instructions: str | None = None


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses, streaming or not."""
    state = request.app[STATE]
    ok, body = await read_json(request)
    if not ok or not isinstance(body, dict):
        return short_error("Invalid JSON in request body")
    raw_input = body.get("input")
    if raw_input is None:
        return openai_error("Missing 'input' field")
    if not isinstance(raw_input, str | list):
        return openai_error("'input' must be a string or array")
    previous = body.get("previous_response_id")
    conversation = body.get("conversation")
    if previous and conversation:
        return openai_error("Cannot use both 'conversation' and 'previous_response_id'")
    if conversation:
        previous = state.responses.conversation(str(conversation))
    req = _Request(
        last_input_text(raw_input),
        str(body.get("model") or "hermes-agent"),
        str(uuid.uuid4()),
        body.get("store", True) is not False,
        str(conversation) if conversation else None,
    )
    instructions = body.get("instructions")
    req.instructions = instructions if isinstance(instructions, str) else None
    if previous:
        stored = state.responses.get(str(previous))
        if stored is None:
            return openai_error(f"Previous response not found: {previous}", status=404)
        req.session_id = stored.session_id
        req.instructions = req.instructions or stored.instructions
    if state.runs.at_capacity():
        return rate_limited(state.config.max_concurrent_runs)
    headers = {SESSION_ID_HEADER: req.session_id, **echo_key(request)}
    if body.get("stream") is True:
        with state.runs.agent_slot():
            return await _stream(request, state, req, headers)
    key = request.headers.get("Idempotency-Key")
    with state.runs.agent_slot():
        if key:
            fingerprint = hashlib.sha256(
                dumps({k: body.get(k) for k in _FINGERPRINT_FIELDS}).encode()
            ).hexdigest()
            outcome = await state.idempotency.outcome(
                "responses:" + key, fingerprint, lambda: _turn(state, req)
            )
        else:
            outcome = await _turn(state, req)
    data = _non_stream_body(outcome, req.model)
    _store(state, req, data)
    return json_reply(data, headers=headers)


async def _turn(state: FakeState, req: _Request) -> agent.Finished | agent.Failed:
    outcome = await agent.collect(req.text)
    _record(state, req, outcome)
    return outcome


def _record(state: FakeState, req: _Request, outcome: agent.Finished | agent.Failed) -> None:
    if isinstance(outcome, agent.Finished):
        state.sessions.record_turn(
            req.session_id, req.text, outcome.messages, outcome.usage, state.config.llm_model
        )
    else:
        state.sessions.record_turn(req.session_id, req.text, [], None, state.config.llm_model)


def _store(state: FakeState, req: _Request, data: dict[str, Any]) -> None:
    if not req.store:
        return
    state.responses.put(data["id"], StoredResponse(data, req.session_id, req.instructions))
    if req.conversation is not None:
        state.responses.set_conversation(req.conversation, data["id"])


def _non_stream_body(outcome: agent.Finished | agent.Failed, model: str) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if isinstance(outcome, agent.Finished):
        for tool in outcome.tools:
            output.append(
                {
                    "type": "function_call",
                    "name": agent.TOOL,
                    "arguments": tool.call.arguments,
                    "call_id": tool.call.call_id,
                }
            )
            output.append(
                {
                    "type": "function_call_output",
                    "call_id": tool.call.call_id,
                    "output": tool.result,
                }
            )
        text, usage = outcome.text, outcome.usage
    else:
        text, usage = outcome.error, agent.ZERO_USAGE
    output.append(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    )
    return {
        "id": _hex_id("resp_", 28),
        "object": "response",
        "status": "completed",
        "created_at": int(time.time()),
        "model": model,
        "output": output,
        "usage": usage.as_hermes(),
    }


class _StreamWriter:
    """Numbered, named frames; a vanished client turns writes into no-ops (never interrupts)."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._seq = 0
        self.detached = False

    async def send(self, event_type: str, **fields: Any) -> None:
        payload = {"type": event_type, **fields, "sequence_number": self._seq}
        self._seq += 1
        if self.detached:
            return
        try:
            await self._response.write(named_frame(event_type, payload))
        except ConnectionError:
            self.detached = True


async def _stream(
    request: web.Request, state: FakeState, req: _Request, headers: dict[str, str]
) -> web.StreamResponse:
    with state.connections.track(request):
        response = await open_stream(request, headers)
        writer = _StreamWriter(response)
        task = asyncio.create_task(_render(state, req, writer))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # The client left: the agent runs on, as in Hermes 0.19.0.
            writer.detached = True
            raise
    if not writer.detached:
        await response.write_eof()
    return response


async def _render(state: FakeState, req: _Request, writer: _StreamWriter) -> None:
    response_id = _hex_id("resp_", 28)
    envelope: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "status": "in_progress",
        "created_at": int(time.time()),
        "model": req.model,
        "output": [],
    }
    if req.store:
        _store(state, req, {**envelope, "output": []})
    await writer.send("response.created", response=dict(envelope))
    items: list[dict[str, Any]] = []
    message = _MessageItem(writer)
    usage = agent.ZERO_USAGE
    loop = asyncio.get_running_loop()
    async for step in paced(agent.run_turn(req.text, None), BATCH_S):
        if isinstance(step, agent.TextDelta):
            await message.add(step.text if not step.after_tool else "\n\n" + step.text, len(items))
            if loop.time() - message.batch_started >= BATCH_S:
                await message.flush()
            continue
        await message.flush()
        match step:
            case agent.ToolCompleted(call, result):
                await _tool_items(writer, items, call, result)
            case agent.Finished(_, turn_usage):
                usage = turn_usage
                _record(state, req, step)
            case agent.Failed(error):
                await message.add(error, len(items))
                await message.flush()
                _record(state, req, step)
    if message.started:
        items.append(await message.finish())
    envelope.update(status="completed", output=items, usage=usage.as_hermes())
    await writer.send("response.completed", response=envelope)
    if writer.detached:
        envelope = {**envelope, "status": "incomplete"}
    _store(state, req, envelope)


async def _tool_items(
    writer: _StreamWriter, items: list[dict[str, Any]], call: agent.ToolCall, result: str
) -> None:
    call_item = {
        "id": _hex_id("fc_", 24),
        "type": "function_call",
        "status": "in_progress",
        "name": agent.TOOL,
        "call_id": call.call_id,
        "arguments": call.arguments,
    }
    index = len(items)
    await writer.send("response.output_item.added", output_index=index, item=dict(call_item))
    call_item["status"] = "completed"
    await writer.send("response.output_item.done", output_index=index, item=call_item)
    items.append(call_item)
    output_item = {
        "id": _hex_id("fco_", 24),
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": [{"type": "input_text", "text": result}],
        "status": "completed",
    }
    await writer.send("response.output_item.added", output_index=index + 1, item=output_item)
    await writer.send("response.output_item.done", output_index=index + 1, item=output_item)
    items.append(output_item)


class _MessageItem:
    """The assistant message item: opened on the first text, deltas batched, then closed."""

    def __init__(self, writer: _StreamWriter) -> None:
        self._writer = writer
        self.item_id = _hex_id("msg_", 24)
        self.index = 0
        self.started = False
        self.text = ""
        self._pending = ""
        self.batch_started = 0.0

    async def add(self, piece: str, index: int) -> None:
        if not self.started:
            self.started = True
            self.index = index
            item = {
                "id": self.item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            await self._writer.send("response.output_item.added", output_index=index, item=item)
        if not self._pending:
            self.batch_started = asyncio.get_running_loop().time()
        self._pending += piece
        self.text += piece

    async def flush(self) -> None:
        if not self._pending:
            return
        delta, self._pending = self._pending, ""
        await self._writer.send(
            "response.output_text.delta",
            item_id=self.item_id,
            output_index=self.index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    async def finish(self) -> dict[str, Any]:
        await self.flush()
        await self._writer.send(
            "response.output_text.done",
            item_id=self.item_id,
            output_index=self.index,
            content_index=0,
            text=self.text,
            logprobs=[],
        )
        item = {
            "id": self.item_id,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": self.text}],
        }
        await self._writer.send("response.output_item.done", output_index=self.index, item=item)
        return item
