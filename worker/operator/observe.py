"""Follow a bound run: its event stream while one is open, else `GET /v1/runs/{id}` polling.

Hermes 0.19's event stream is single-use and has no replay cursor, so the stream is tried
only right after a new run is bound; a replayed or taken-over execution, and any stream
failure (404, transport, over-size frame, undecodable frame, event limit), fall back to
polling, which is the authority (spec "Observe events and recover by polling").

The observer stops at a terminal state, at an approval prompt, when a cancel is requested
(the caller reconciles it), or at the deadline (a governed timeout is `outcome_unknown`:
the run may still be working).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from schemas.chunk import ChunkKind
from schemas.errors import ErrorCode
from worker import faults
from worker.errors import ConnectorError, EventStreamUnavailable
from worker.execution.cancel_signal import CancelSignal
from worker.hermes.sse import SSEEvent, SSELimits
from worker.operations.run_events import Effect, rule_for
from worker.operations.run_spans import RunSpans
from worker.operator import provider
from worker.operator.binding import BindingState, OperatorBinding, ProviderSnapshot
from worker.operator.events import (
    STATUS_READINGS,
    TERMINAL_EVENT,
    ProviderStatus,
    Reading,
    parse_status,
)
from worker.operator.redaction import bounded_text, redact_event
from worker.operator.session import OperatorSession

#: One SSE frame is capped at 1 MiB (spec), whatever the event limit.
MAX_FRAME_BYTES = 1024 * 1024
#: Progress (last event, next sequence) is persisted at most this often while streaming.
FLUSH_INTERVAL_S = 0.25
#: Bound on one status request, so a hung GET cannot eat the whole observation budget.
MAX_STATUS_REQUEST_S = 10.0

S = BindingState

RUN_GONE = (
    "the bound run answered 404 run_not_found: Hermes no longer knows it (restart or "
    "retention), which is not proof that it had no effect"
)


@dataclass(frozen=True, slots=True)
class PollMode:
    """How a polling loop behaves: normal observation, or a cancellation grace window."""

    #: Stop and hand back to the caller when a cancel is requested.
    yields_to_cancel: bool
    #: Treat `waiting_for_approval` as a new prompt (False while cancelling: only the
    #: stop's outcome matters then).
    approvals: bool
    #: The code of the unknown outcome at the end of the window.
    timeout_code: ErrorCode
    timeout_reason: str


OBSERVE = PollMode(
    yields_to_cancel=True,
    approvals=True,
    timeout_code=ErrorCode.OPERATOR_OUTCOME_UNKNOWN,
    timeout_reason="the governed operator timeout passed before the run reached a terminal state",
)
#: A single read that must not turn a waiting run into a new prompt.
READ_ONCE = PollMode(
    yields_to_cancel=False,
    approvals=False,
    timeout_code=ErrorCode.OPERATOR_OUTCOME_UNKNOWN,
    timeout_reason="",
)
CANCEL_GRACE = PollMode(
    yields_to_cancel=False,
    approvals=False,
    timeout_code=ErrorCode.CANCELLATION_OUTCOME_UNKNOWN,
    timeout_reason="the run did not confirm cancellation within the grace window",
)


class Observer:
    def __init__(
        self, session: OperatorSession, *, answered_prompt: ProviderSnapshot | None = None
    ) -> None:
        self.s = session
        #: A prompt this invocation already answered: seeing it again is not a new approval
        #: until the run has visibly moved on (the provider may lag behind our POST).
        self.answered_prompt = answered_prompt
        self._last_event: str | None = None
        self._dirty = False
        # The bind (or the read that found the binding) just persisted it: the first
        # coalesced progress write can wait a whole interval.
        self._flushed_at = asyncio.get_running_loop().time()
        self._last_status: ProviderStatus | None = None
        #: The streaming path's Redis bookkeeping, off the event path (see `_Bookkeeping`).
        self._books = _Bookkeeping()
        #: The agent and tool spans of the stream being followed (None: untraced).
        self._spans: RunSpans | None = None

    @property
    def binding(self) -> OperatorBinding:
        return self.s.handle.binding

    @property
    def run_id(self) -> str:
        run_id = self.binding.run_id
        if run_id is None:
            raise ConnectorError(ErrorCode.ERROR, "observing a binding without a run id")
        return run_id

    # --- entry points ------------------------------------------------------------------

    async def follow(self, *, stream: bool) -> OperatorBinding:
        """Observe until terminal, approval, cancel request or the deadline."""
        if stream and not self.s.cancel_wanted():
            done = await self._follow_stream()
            if done:
                return self.binding
        return await self.poll(self.s.deadline, OBSERVE)

    async def poll(self, until: float, mode: PollMode) -> OperatorBinding:
        """Poll the run status every poll interval until `until` (loop time)."""
        loop = asyncio.get_running_loop()
        interval = self.s.policy.poll_interval_ms / 1000
        while True:
            if mode.yields_to_cancel and self.s.cancel_wanted():
                await self._flush()
                return self.binding
            left = until - loop.time()
            if left <= 0:
                return await self.conclude_unknown(mode.timeout_code, mode.timeout_reason)
            read = await provider.read_status(
                self.s.ctx.hermes, self.run_id, self.s.headers(), min(left, MAX_STATUS_REQUEST_S)
            )
            match read:
                case provider.RunGone():
                    return await self.conclude_unknown(mode.timeout_code, RUN_GONE)
                case provider.ReadFailed(error=error, transient=False):
                    return await self.conclude_unknown(
                        mode.timeout_code, f"run status unreadable: {error.message}"
                    )
                case provider.ReadFailed():
                    pass  # temporary: the next poll may answer
                case provider.StatusRead(body=body):
                    if await self._on_status(body, mode):
                        return self.binding
            await self.s.capacity.keep()
            if mode.yields_to_cancel:
                await self.s.pause(min(interval, max(0.0, until - loop.time())))
            else:
                await asyncio.sleep(min(interval, max(0.0, until - loop.time())))

    async def read_once(self) -> OperatorBinding:
        """One status read that records only what is certain: a terminal state, or a run
        Hermes no longer knows. A live or waiting run leaves the binding as it is."""
        read = await provider.read_status(
            self.s.ctx.hermes, self.run_id, self.s.headers(), MAX_STATUS_REQUEST_S
        )
        match read:
            case provider.RunGone():
                return await self.conclude_unknown(ErrorCode.OPERATOR_OUTCOME_UNKNOWN, RUN_GONE)
            case provider.StatusRead(body=body):
                await self._on_status(body, READ_ONCE)
        return self.binding

    # --- the event stream --------------------------------------------------------------

    async def _follow_stream(self) -> bool:
        """True when the stream ended the observation (terminal, approval, cancel).

        Whatever way it is left, the bookkeeping is settled or abandoned last: every normal
        exit settled it, and an error leaving the stream (a lost lease, the worker
        stopping) leaves nothing behind that would write. One coroutine for all of it: a
        frame per held run is what 10,000 runs multiply (bench figure 4)."""
        limits = SSELimits(max_frame_bytes=MAX_FRAME_BYTES, max_events=self.s.policy.max_events)
        interrupt = _CancelInterrupt(self.s.ctx.cancel_requested)
        self._spans = RunSpans.open(self.run_id)
        try:
            try:
                async with asyncio.timeout(self.s.remaining_s()):
                    async with provider.open_events(
                        self.s.ctx.hermes, self.run_id, self.s.headers(), limits
                    ) as events:
                        while not self.s.cancel_wanted():
                            interrupt.waiting = True
                            try:
                                event = await anext(events)
                            except StopAsyncIteration:
                                break
                            except ConnectorError as exc:
                                # The stream failed (limit, decode, idle, cut): poll.
                                raise EventStreamUnavailable(exc.message) from None
                            finally:
                                interrupt.waiting = False
                            if await self._on_event(event):
                                return True
                            # Not kept while the next event is awaited: a held run waits
                            # there for most of its life (bench figure 4).
                            del event
                        else:
                            await self._flush()
                            return True
            except asyncio.CancelledError:
                if not interrupt.absorb():
                    raise  # the lease was lost (or the worker stops): not ours to handle
                await self._flush()
                return True
            except (EventStreamUnavailable, TimeoutError):
                pass  # poll instead: the status route is the authority
            finally:
                interrupt.close()
            await self._flush()
            return False
        finally:
            self._books.abandon()
            if self._spans is not None:
                self._spans.close()
                self._spans = None

    async def _on_event(self, event: SSEEvent) -> bool:
        data: dict[str, Any] = event.data if isinstance(event.data, dict) else {}
        name = event.name
        if self._spans is not None:
            self._spans.see(name, data)
        rule = rule_for(name)
        shown = redact_event(data if data else {"event": name})
        match rule.effect:
            case Effect.ADVANCE:
                await self.s.emit(rule.kind, shown, provider_event=name)
                faults.hit("mid_stream", self.s.ctx.action.id)
                self._last_event = name
                self._dirty = True
                self._books.check()
                if not self._books.busy and self._flush_due():
                    self._books.start(self._keep_books())
                return False
            case Effect.APPROVAL:
                return await self.record_approval(
                    shown, name, emit_event=name, sealed=self._sealed(data.get("command"))
                )
            case Effect.COMPLETED:
                output = {"event": name, "output": data.get("output"), "usage": data.get("usage")}
                return await self.conclude(Reading.COMPLETED, output, shown, name)
            case Effect.FAILED:
                output = {"event": name, "error": bounded_text(data.get("error"))}
                reading = (
                    Reading.INTERRUPTED
                    if name == TERMINAL_EVENT[Reading.INTERRUPTED]
                    else Reading.FAILED
                )
                return await self.conclude(reading, output, shown, name)
            case Effect.CANCELLED:
                return await self.conclude(Reading.CANCELLED, {"event": name}, shown, name)

    # --- statuses ----------------------------------------------------------------------

    async def _on_status(self, body: dict[str, Any], mode: PollMode) -> bool:
        status = parse_status(body.get("status"))
        if status is None:
            return await self._unsupported(body.get("status"), mode)
        last_event = body.get("last_event")
        updated_at = body.get("updated_at")
        snapshot = ProviderSnapshot(
            status=status.value,
            last_event=last_event if isinstance(last_event, str) else None,
            updated_at=float(updated_at) if isinstance(updated_at, int | float) else None,
        )
        reading = STATUS_READINGS[status]
        if self.answered_prompt is not None:
            if _same_prompt(self.answered_prompt, snapshot):
                reading = Reading.ACTIVE
            else:
                self.answered_prompt = None  # the run moved on: later prompts are new
        if reading is Reading.APPROVAL and not mode.approvals:
            reading = Reading.ACTIVE
        if snapshot.last_event is not None:
            self._last_event = snapshot.last_event
            self._dirty = True
        match reading:
            case Reading.ACTIVE:
                if status is not self._last_status:
                    self._last_status = status
                    await self.s.emit(
                        ChunkKind.PROGRESS,
                        {"status": status.value, "last_event": snapshot.last_event},
                    )
                await self._flush(coalesce=True)
                return False
            case Reading.APPROVAL:
                pending = {
                    "event": "approval.request",
                    "run_id": self.run_id,
                    "observed": "status",
                    "last_event": snapshot.last_event,
                }
                return await self.record_approval(pending, snapshot.last_event, emit_event=None)
            case Reading.COMPLETED:
                output = {
                    "event": TERMINAL_EVENT[reading],
                    "output": body.get("output"),
                    "usage": body.get("usage"),
                }
            case Reading.FAILED | Reading.INTERRUPTED:
                output = {
                    "event": TERMINAL_EVENT[reading],
                    "error": bounded_text(body.get("error")),
                }
            case Reading.CANCELLED:
                output = {"event": TERMINAL_EVENT[reading]}
        payload = {"status": status.value, **{k: v for k, v in output.items() if k != "usage"}}
        return await self.conclude(reading, output, payload, None)

    async def _unsupported(self, raw: object, mode: PollMode) -> bool:
        shown = bounded_text(raw, 64)
        await self.conclude_unknown(
            mode.timeout_code,
            f"Hermes reported an unsupported run status {shown!r}; failing closed",
        )
        return True

    # --- binding effects ---------------------------------------------------------------

    def _progress(self) -> dict[str, Any]:
        changes: dict[str, Any] = {}
        if self._last_event is not None:
            changes["last_event"] = self._last_event
        if self.s.is_source:
            changes["next_sequence"] = self.s.ctx.next_seq
        return changes

    def _flush_due(self) -> bool:
        return (
            self._dirty
            and asyncio.get_running_loop().time() - self._flushed_at >= FLUSH_INTERVAL_S
        )

    async def _flush(self, *, coalesce: bool = False) -> None:
        """Persist last event and next sequence; coalesced to one write per interval.

        The streaming path's own write (`_keep_books`) is settled first, so the binding's
        writes stay in order and its failure is raised here at the latest."""
        await self._books.settle()
        if not self._dirty or (coalesce and not self._flush_due()):
            return
        await self._write_progress()

    async def _write_progress(self) -> None:
        progress = self._progress()
        self._dirty = False
        self._flushed_at = asyncio.get_running_loop().time()
        await self.s.handle.update(lambda b, now: b.changed(now, **progress))

    async def _keep_books(self) -> None:
        """A streamed event's bookkeeping: the coalesced progress write, the run slot."""
        await self._write_progress()
        await self.s.capacity.keep()

    def _sealed(self, command: Any) -> dict[str, str] | None:
        """The prompt's command sealed to the authority members who may decide on it
        (`worker.operator.sealed_command`); None without a command or an authority."""
        sealer = self.s.policy.sealer
        if sealer is None or not isinstance(command, str) or not command:
            return None
        action = self.s.ctx.action
        return sealer.seal(
            command, tenant_id=action.identity.tenant_id, capability=action.capability,
            now_ms=int(time.time() * 1000),
        ) or None

    async def record_approval(
        self,
        pending: dict[str, Any],
        last_event: str | None,
        *,
        emit_event: str | None,
        sealed: dict[str, str] | None = None,
    ) -> bool:
        """A prompt: the generation moves on, the redacted prompt is retained, and this
        invocation ends `requires_human`."""
        await self._books.settle()
        progress = self._progress()
        if last_event is not None:
            progress["last_event"] = last_event

        def wait(b: OperatorBinding, now: int) -> OperatorBinding | None:
            if b.status is not S.RUNNING:
                return None  # already recorded by a concurrent observer
            return b.moved(
                S.WAITING_FOR_APPROVAL,
                now,
                approval_generation=b.approval_generation + 1,
                pending_approval=pending,
                pending_command_sealed=sealed,
                **progress,
            )

        binding = await self.s.handle.update(wait)
        self._dirty = False
        if binding.status is S.WAITING_FOR_APPROVAL:
            # The run stays open in Hermes while a human decides: keep its slot counted.
            await self.s.capacity.keep(ttl_ms=self.s.policy.timeout_ms, force=True)
            await self.s.emit(
                ChunkKind.PENDING_APPROVAL,
                {**pending, "approval_generation": binding.approval_generation},
                provider_event=emit_event,
            )
        return True

    async def conclude(
        self,
        reading: Reading,
        output: dict[str, Any],
        chunk_payload: dict[str, Any],
        provider_event: str | None,
    ) -> bool:
        """Retain a provider terminal state (written before its chunk is emitted)."""
        state = {
            Reading.COMPLETED: S.COMPLETED,
            Reading.FAILED: S.FAILED,
            Reading.CANCELLED: S.CANCELLED,
            Reading.INTERRUPTED: S.FAILED,
        }[reading]
        await self._books.settle()
        progress = self._progress()
        progress["last_event"] = output["event"]
        error = None
        if reading is Reading.INTERRUPTED:
            error = ConnectorError(
                ErrorCode.OPERATOR_INTERRUPTED,
                "the bound Hermes run was interrupted by its gateway's shutdown; it will not "
                "continue, and its tools may have acted",
            )
        elif state is S.FAILED:
            error = ConnectorError(
                ErrorCode.OPERATOR_FAILED, "the bound Hermes run reported failure"
            )
        binding = await self.s.handle.update(
            lambda b, now: b.ended(state, now, error=error, output=output, **progress)
        )
        self._dirty = False
        if binding.status is state:
            kind = ChunkKind.ERROR if state is S.FAILED else ChunkKind.DONE
            await self.s.emit(kind, chunk_payload, provider_event=provider_event)
        return True

    async def conclude_unknown(self, code: ErrorCode, reason: str) -> OperatorBinding:
        """The run may still act, and we cannot tell: terminal `outcome_unknown`, no replay."""
        error = ConnectorError(code, reason)
        await self._books.settle()
        progress = self._progress()
        await self.s.handle.update(
            lambda b, now: b.ended(S.OUTCOME_UNKNOWN, now, error=error, **progress)
        )
        self._dirty = False
        return self.binding


def _same_prompt(answered: ProviderSnapshot, seen: ProviderSnapshot) -> bool:
    """Is `seen` still the prompt this invocation answered?

    Without a provider `updated_at` to compare, a waiting status whose last event is still
    the same prompt counts as the old prompt until the run is seen to move on.
    """
    if seen.status != ProviderStatus.WAITING_FOR_APPROVAL.value:
        return False
    if answered.updated_at is None or seen.updated_at is None:
        return seen.last_event == answered.last_event
    return seen.last_event == answered.last_event and seen.updated_at == answered.updated_at


class _CancelInterrupt:
    """Stops a wait for the next provider event the moment a cancel is requested.

    A callback on the execution's cancel signal instead of racing two fresh tasks per
    event (that race cost more than the event itself) or a watcher task per stream (a
    task per held run). The task is cancelled only while it waits in `anext`, never while
    it handles an event, so an event is never half-recorded; a cancel that arrives
    meanwhile is seen by the loop's `cancel_wanted()` check.
    """

    def __init__(self, requested: CancelSignal) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._requested = requested
        #: True only while the task waits in `anext` (set and cleared around it by the
        #: caller: a plain flag, as a context manager per event cost more than the event).
        self.waiting = False
        self._fired = False
        requested.add_callback(self._on_requested)

    def _on_requested(self) -> None:
        if self.waiting and not self._fired:
            self._fired = True
            self._task.cancel("operator cancel requested")

    def absorb(self) -> bool:
        """True when the CancelledError being handled is ours alone (then it is undone)."""
        return self._fired and self._task.uncancel() == 0

    def close(self) -> None:
        self._requested.remove_callback(self._on_requested)


class _Bookkeeping:
    """At most one Redis write of the streaming path in flight, off the event path.

    While a run streams, its progress write (every `FLUSH_INTERVAL_S`) and its run slot's
    refresh are Redis round trips; awaited inside the event loop's handling of an event,
    each one held back every event behind it (at 5,000 events/s, a 1-5 ms write delayed
    5-25 chunks, four times a second: most of the relay's p99 in figure 3 of the bench).
    They run as one task instead, started by an event when due and never two at once; a
    failure (a lost lease, Redis down) is raised by the next event (`check`) or by the
    next binding update, which waits for the task first (`settle`), so the binding's writes
    stay in the order they were made and the terminal write always comes last.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        self._task = task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(self._forget_if_done_well)

    def _forget_if_done_well(self, task: asyncio.Task[None]) -> None:
        """A write that succeeded has nothing left to report: let the task go now rather
        than at the next event, which a slow run may not send for minutes (a finished task
        per held run otherwise, bench figure 4). A failure stays for `check`/`settle`."""
        if self._task is task and not task.cancelled() and task.exception() is None:
            self._task = None

    def check(self) -> None:
        """Raise the failure of a finished task (and forget it either way)."""
        task = self._task
        if task is not None and task.done():
            self._task = None
            task.result()

    async def settle(self) -> None:
        """Wait for the task in flight, raising its failure."""
        task, self._task = self._task, None
        if task is not None:
            await task

    def abandon(self) -> None:
        """Cancel a task still in flight (its write is fenced: the next holder's binding
        is never overwritten); its failure, if it already failed, is dropped."""
        task, self._task = self._task, None
        if task is not None:
            if task.done():
                if not task.cancelled():
                    task.exception()  # retrieved: the error that left the stream counts
            else:
                task.cancel()
