"""Structured runs (`/v1/runs…`): start, status, the event stream, approval and stop.

All three mutations are high risk and need AIP approval: a run executes tools on the
Hermes host, an approval choice authorizes a held dangerous command, and a stop interrupts
work mid-effect. `POST /v1/runs` has no provider idempotency key in 0.19.0, so a lost answer
is an unknown outcome (uncertain, never retried); the governed long-running path is the
operator capability, which binds the run id durably before following it.

The event stream is single-use and has no cursor: `run_events` is read-only, but only its
opening is retried (see `worker.operations.streaming`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from schemas._base import WireStruct
from worker.hermes.sse import SSELimits
from worker.operations.calls import HermesCall, JsonOperation, body_of
from worker.operations.classifiers import RunEvents
from worker.operations.input_types import Instructions, Label, Prompt, ResponseId, RunId, SessionId
from worker.operations.messages import ChatMessage, Messages
from worker.operations.retry import ReadRetryPolicy
from worker.operations.specs import spec
from worker.operations.streaming import StreamOperation


class RunStartInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    #: A prompt, or messages whose last one is the turn (earlier ones become history).
    input: Prompt | Messages
    instructions: Instructions | None = None
    #: Where the turn's messages are stored; Hermes does not load its history (0.19.0).
    session_id: SessionId | None = None
    conversation_history: Annotated[list[ChatMessage], msgspec.Meta(max_length=512)] | None = None
    previous_response_id: ResponseId | None = None
    model: Label | None = None


class RunRef(WireStruct, kw_only=True, frozen=True):
    run_id: RunId


class RunApprovalInput(WireStruct, kw_only=True, frozen=True, omit_defaults=True):
    run_id: RunId
    choice: Literal["once", "session", "always", "deny"]
    #: Resolve every pending prompt, not only the oldest.
    all: bool | None = None


def _start(params: RunStartInput) -> HermesCall:
    return HermesCall(body=body_of(params))


def _ref(params: Any) -> HermesCall:
    return HermesCall(params={"run_id": params.run_id})


def _approval(params: RunApprovalInput) -> HermesCall:
    return HermesCall(params={"run_id": params.run_id}, body=body_of(params, exclude={"run_id"}))


def run_operations(
    retry: ReadRetryPolicy, limits: SSELimits
) -> list[JsonOperation | StreamOperation]:
    return [
        JsonOperation(
            spec(
                "run_start",
                RunStartInput,
                "Start an agent run (202 with its run id); not idempotent in Hermes 0.19",
            ),
            _start,
        ),
        JsonOperation(
            spec(
                "run_status",
                RunRef,
                "A run's status (kept 1 h after it ends, forgotten on restart)",
            ),
            _ref,
            retry=retry,
        ),
        StreamOperation(
            spec(
                "run_events",
                RunRef,
                "Follow a run's single-use event stream to its terminal event",
            ),
            _ref,
            RunEvents,
            limits=limits,
            retry=retry,
            run_id_param="run_id",
        ),
        JsonOperation(
            spec(
                "run_approval",
                RunApprovalInput,
                "Answer the oldest pending approval prompt of a run",
            ),
            _approval,
        ),
        JsonOperation(
            spec("run_stop", RunRef, "Ask a run to stop (status becomes cancelled shortly)"),
            _ref,
        ),
    ]
