"""`/v1/runs`: start, status, the single-use event stream, approval and stop.

The start handler is also where the start faults act: after validation and the cap (so a
fault never hides a 400 or 429) and, for the "after create" kinds, after the run exists, which
is exactly the ambiguity a client must treat as an unknown outcome.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from worker import tracing
from worker.testing.fake_hermes import faults as f
from worker.testing.fake_hermes.channel import Signal
from worker.testing.fake_hermes.envelopes import (
    aiohttp_500,
    json_reply,
    not_active,
    openai_error,
    rate_limited,
    read_json,
    run_not_found,
    server_error,
)
from worker.testing.fake_hermes.inputs import last_input_text
from worker.testing.fake_hermes.run_keys import MAX_KEY_CHARS, KeyedRun, fingerprint
from worker.testing.fake_hermes.runs import Run, normalize_choice
from worker.testing.fake_hermes.sse import KEEPALIVE, STREAM_CLOSED, data_frame, open_stream
from worker.testing.fake_hermes.state import STATE, FakeState

SESSION_KEY_HEADER = "X-Hermes-Session-Key"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
MALFORMED_FRAME = b'data: {"event": "message.delta", "delta": \n\n'
FLOOD_BATCH = 256


def _history_error(history: object) -> str | None:
    if not isinstance(history, list):
        return "'conversation_history' must be an array of message objects"
    for index, item in enumerate(history):
        if not isinstance(item, dict) or "role" not in item or "content" not in item:
            return f"conversation_history[{index}] must have 'role' and 'content' fields"
    return None


async def create_run(request: web.Request) -> web.StreamResponse:
    """POST /v1/runs → 202 `{"run_id","status":"started"}` (never idempotent in 0.19.0;
    with `runs_idempotency`, a known `Idempotency-Key` answers its run instead)."""
    state = request.app[STATE]
    ok, body = await read_json(request)
    if not ok:
        return openai_error("Invalid JSON")
    keyed = _keyed_start(request, state, await request.read())
    if isinstance(keyed, web.Response):
        return keyed
    if not isinstance(body, dict):
        return aiohttp_500()  # 0.19.0 calls `.get` on whatever JSON arrived
    raw_input = body.get("input")
    if raw_input is None or raw_input == "" or raw_input == []:
        return openai_error("Missing 'input' field")
    if not isinstance(raw_input, str | list):
        return openai_error("No user message found in input")
    if "conversation_history" in body:
        problem = _history_error(body["conversation_history"])
        if problem is not None:
            return openai_error(problem)
    if state.runs.at_capacity():
        return rate_limited(state.config.max_concurrent_runs)
    text = last_input_text(raw_input)
    fault = state.faults.take_start(text)
    if isinstance(fault, f.StartReject):
        return openai_error(fault.message, status=fault.status, code=fault.code)
    if isinstance(fault, f.StartHang) and not fault.create_run:
        return await state.connections.hold(request)
    session_id = body.get("session_id")
    model = body.get("model")
    run = state.runs.create(
        text,
        str(session_id) if session_id else None,
        str(model) if model else None,
        on_created=lambda created: state.stats.record_start(created.session_id),
    )
    run.trace = tracing.trace_context(request.headers)
    if keyed is not None:
        # Recorded with the run, before any reply: a reply lost from here on is learnt back.
        state.run_keys.put(keyed[0], KeyedRun(keyed[1], run.run_id))
    match fault:
        case f.StartServerError():
            return server_error()
        case f.StartDrop():
            return state.connections.drop(request)
        case f.StartNoRunId(status=status):
            return json_reply({"status": "started"}, status=status)
        case f.StartHang():
            return await state.connections.hold(request)
    headers = {}
    if SESSION_KEY_HEADER in request.headers:
        headers[SESSION_KEY_HEADER] = request.headers[SESSION_KEY_HEADER]
    return json_reply({"run_id": run.run_id, "status": "started"}, status=202, headers=headers)


def _keyed_start(
    request: web.Request, state: FakeState, raw: bytes
) -> web.Response | tuple[str, str] | None:
    """With `runs_idempotency`: the reply for a key already used (its run, even at the run
    cap; or a 409 for another body), else `(key, fingerprint)` to record with the new run.
    None without the flag or the header (0.19: the header is ignored here)."""
    if not state.config.runs_idempotency:
        return None
    key = request.headers.get(IDEMPOTENCY_KEY_HEADER)
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_CHARS:
        return openai_error("Invalid Idempotency-Key", code="invalid_idempotency_key")
    print_ = fingerprint(raw, request.headers.get(SESSION_KEY_HEADER))
    known = state.run_keys.get(key)
    if known is None:
        return key, print_
    if known.fingerprint != print_:
        return openai_error(
            "Idempotency-Key was used with a different request",
            status=409,
            code="idempotency_key_conflict",
        )
    run = state.runs.get(known.run_id)
    reply = run.status_object() if run is not None else {"run_id": known.run_id}
    return json_reply(reply, status=202)


async def get_run(request: web.Request) -> web.Response:
    """GET /v1/runs/{run_id} → the status object, 404 once forgotten."""
    run_id = request.match_info["run_id"]
    run = request.app[STATE].runs.get(run_id)
    if run is None:
        return run_not_found(run_id)
    return json_reply(run.status_object())


async def stop_run(request: web.Request) -> web.Response:
    """POST /v1/runs/{run_id}/stop → 200 `stopping`; a finished run is a 404."""
    run_id = request.match_info["run_id"]
    runs = request.app[STATE].runs
    run = runs.get(run_id)
    if run is not None and run.terminal and request.app[STATE].config.run_not_active:
        return not_active(run_id)
    if run is None or run.terminal:
        return run_not_found(run_id)
    runs.stop(run)
    return json_reply({"run_id": run_id, "status": "stopping"})


async def approve_run(request: web.Request) -> web.Response:
    """POST /v1/runs/{run_id}/approval: answer the oldest pending prompt (or all of them)."""
    run_id = request.match_info["run_id"]
    run = request.app[STATE].runs.get(run_id)
    if run is None:
        return run_not_found(run_id)
    ok, body = await read_json(request)
    if not ok or not isinstance(body, dict):
        return openai_error("Invalid JSON")
    config = request.app[STATE].config
    offered = request.app[STATE].runs.offered_choices
    choice = normalize_choice(body.get("choice"), offered)
    if choice is None:
        return openai_error(
            f"Invalid approval choice; expected one of: {', '.join(offered)}",
            code="invalid_approval_choice",
        )
    if run.terminal and config.run_not_active:
        return not_active(run_id)
    if run.terminal or run.task is None or run.task.done():
        return openai_error(
            f"Run has no active approval session: {run_id}",
            status=409,
            code="approval_not_active",
        )
    if run.pending_prompts == 0:
        return openai_error(
            f"Run has no pending approval: {run_id}", status=409, code="approval_not_pending"
        )
    request_id = body.get("request_id") if config.approval_request_ids else None
    if request_id is not None and not isinstance(request_id, str):
        return openai_error("'request_id' must be a string", code="invalid_request_id")
    resolved = run.resolve(choice, body.get("all") is True, request_id)
    if resolved == 0:
        return openai_error(
            f"Run has no pending approval: {run_id}", status=409, code="approval_not_pending"
        )
    return json_reply(
        {
            "object": "hermes.run.approval_response",
            "run_id": run_id,
            "choice": choice,
            "resolved": resolved,
        }
    )


async def run_events(request: web.Request) -> web.StreamResponse:
    """GET /v1/runs/{run_id}/events: `data:`-only SSE, buffered from POST, single-use."""
    state = request.app[STATE]
    run_id = request.match_info["run_id"]
    run = state.runs.get(run_id)
    if run is None or run.channel.dropped:
        return await _slow_not_found(state, run_id)
    fault = state.faults.take_events(run_id, run.input_text)
    if isinstance(fault, f.EventsNotFound):
        return await _slow_not_found(state, run_id)
    if isinstance(fault, f.EventsHang):
        return await state.connections.hold(request)
    with state.connections.track(request):
        if isinstance(fault, f.EventsNoise):
            return await _noise(request, run, fault)
        return await _stream(request, state, run, fault)


async def _slow_not_found(state: FakeState, run_id: str) -> web.Response:
    # Hermes polls 20 x 50 ms for the stream to register before it gives up.
    await asyncio.sleep(state.config.missing_stream_delay_s)
    return run_not_found(run_id)


async def _stream(
    request: web.Request, state: FakeState, run: Run, fault: f.EventsFault | None
) -> web.StreamResponse:
    channel = run.channel
    channel.subscribed = True
    response = await open_stream(request)
    injected = not isinstance(fault, f.EventsMalformed | f.EventsOversize)
    sent = 0
    try:
        if isinstance(fault, f.EventsFlood):
            await _flood(response, run, fault.count)
        if isinstance(fault, f.EventsHugeAnswer):
            await _huge_answer(response, run, fault)
        while True:
            item = await channel.get(state.config.keepalive_s)
            if item is Signal.IDLE:
                await response.write(KEEPALIVE)
                continue
            if not injected and (item is Signal.END or sent == _after(fault)):
                await response.write(_injected_frame(run, fault))
                injected = True
            if item is Signal.END:
                await response.write(STREAM_CLOSED)
                break
            if isinstance(fault, f.EventsSlow):
                await asyncio.sleep(fault.delay_s)
            await response.write(data_frame(item))
            sent += 1
            if isinstance(fault, f.EventsDisconnect) and sent >= fault.after:
                return state.connections.drop(request)
    finally:
        # Single use: whoever ends first (normally, by disconnect or by fault) consumes it.
        channel.drop()
    await response.write_eof()
    return response


def _after(fault: f.EventsFault | None) -> int:
    return fault.after if isinstance(fault, f.EventsMalformed | f.EventsOversize) else -1


def _injected_frame(run: Run, fault: f.EventsFault | None) -> bytes:
    if isinstance(fault, f.EventsOversize):
        return data_frame(
            {
                "event": "message.delta",
                "run_id": run.run_id,
                "timestamp": run.updated_at,
                "delta": "x" * fault.size,
            }
        )
    return MALFORMED_FRAME


#: The unit a noise fault repeats: a bare line end, or a keepalive-like comment frame.
_NOISE_UNIT = {"blank_lines": b"\n", "comments": b": keepalive\n\n"}


async def _noise(request: web.Request, run: Run, fault: f.EventsNoise) -> web.StreamResponse:
    """Lines that are never an event, until the client leaves or `max_bytes` are out.

    The run's real events stay buffered (its stream counts as consumed once this ends).
    Between writes the loop gets a turn, so the in-process fake never starves its host.
    """
    response = await open_stream(request)
    unit = _NOISE_UNIT[fault.noise]
    batch = unit * max(1, fault.batch // len(unit))
    sent = 0
    try:
        while sent < fault.max_bytes:
            await response.write(batch)
            sent += len(batch)
            await asyncio.sleep(fault.pace_s)
    except (ConnectionError, RuntimeError):
        pass  # the client went away: what a hostile stream is waiting for
    finally:
        run.channel.drop()
    return response


async def _huge_answer(response: web.StreamResponse, run: Run, fault: f.EventsHugeAnswer) -> None:
    piece = "x" * fault.piece
    for _ in range(max(1, fault.size // fault.piece)):
        await response.write(
            data_frame(
                {
                    "event": "message.delta",
                    "run_id": run.run_id,
                    "timestamp": run.created_at,
                    "delta": piece,
                }
            )
        )


async def _flood(response: web.StreamResponse, run: Run, count: int) -> None:
    frame = data_frame(
        {"event": "message.delta", "run_id": run.run_id, "timestamp": run.created_at, "delta": "."}
    )
    for start in range(0, count, FLOOD_BATCH):
        await response.write(frame * min(FLOOD_BATCH, count - start))
