"""The `/v1/runs` engine: run state machine, approval prompts, stop, retention and the cap.

A run is an asyncio task that plays the scripted agent turn and turns each step into a run
event (`message.delta`, `tool.started`, `approval.request`, …) buffered in its channel. State
is memory-only, like Hermes: `forget_all()` (a restart) makes every run a 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import secrets
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from worker import tracing
from worker.testing.fake_hermes import agent, mcp
from worker.testing.fake_hermes.channel import EventChannel
from worker.testing.fake_hermes.config import FakeConfig
from worker.testing.fake_hermes.sessions import SessionStore
from worker.testing.fake_hermes.stats import now
from worker.testing.scenario import OFF_CONTRACT, word_deltas


class RunStatus(enum.StrEnum):
    """The seven statuses `GET /v1/runs/{id}` reports, and `interrupted` (after 0.19, only
    with `FakeConfig.interrupt_on_restart`)."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


TERMINAL = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED}
)
#: What a shutdown writes on every run it interrupts (upstream PR #114774).
INTERRUPTED_ERROR = "Gateway shutdown interrupted the run."

#: Allowed transitions; anything else is a bug in the fake and raises.
_I = RunStatus.INTERRUPTED
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.FAILED, _I}),
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.WAITING_FOR_APPROVAL,
            RunStatus.STOPPING,
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            _I,
        }
    ),
    RunStatus.WAITING_FOR_APPROVAL: frozenset({RunStatus.RUNNING, RunStatus.STOPPING, _I}),
    # A turn that ends before the interrupt lands still completes (or fails).
    RunStatus.STOPPING: frozenset({RunStatus.CANCELLED, RunStatus.COMPLETED, RunStatus.FAILED, _I}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
    RunStatus.INTERRUPTED: frozenset(),
}

#: Events that do not touch `last_event`/`updated_at` (observed: a streaming run shows none).
QUIET_EVENTS = frozenset({"message.delta", "reasoning.available"})

APPROVAL_ALIASES = {"approve": "once", "approved": "once", "allow": "once"}


def normalize_choice(raw: object, offered: tuple[str, ...] = agent.APPROVAL_CHOICES) -> str | None:
    """The canonical approval choice for a request value, or None when it is not one of
    the `offered` choices."""
    if not isinstance(raw, str):
        return None
    choice = raw.strip().lower()
    choice = APPROVAL_ALIASES.get(choice, choice)
    return choice if choice in offered else None


class Run:
    """One `/v1/runs` run: its status object, its event channel and its pending prompts."""

    def __init__(
        self, run_id: str, session_id: str, model: str, input_text: str, created_at: float
    ) -> None:
        self.run_id = run_id
        self.session_id = session_id
        self.model = model
        self.input_text = input_text
        #: The W3C trace context the run was started with: the fake continues it into its
        #: MCP tool calls, as a traced Hermes would (docs/tracing.md).
        self.trace: dict[str, str] = {}
        self.created_at = created_at
        self.updated_at = created_at
        self.finished_at: float | None = None
        self.status = RunStatus.QUEUED
        self.last_event: str | None = None
        self.output: str | None = None
        self.usage: dict[str, int] | None = None
        self.error: str | None = None
        self.channel = EventChannel(created_at)
        self.task: asyncio.Task[None] | None = None
        self._prompts: deque[asyncio.Future[str]] = deque()
        #: Prompt future -> its `request_id` (after 0.19 only).
        self._prompt_ids: dict[asyncio.Future[str], str] = {}
        #: The id the last `approval.request` announced, for the prompt it opens next.
        self.announced_request_id: str | None = None

    @property
    def terminal(self) -> bool:
        """True once the run completed, failed or was cancelled."""
        return self.status in TERMINAL

    def move(self, status: RunStatus) -> None:
        """Change status along the transition table."""
        if status is self.status:
            return
        if status not in TRANSITIONS[self.status]:
            raise RuntimeError(f"run {self.run_id}: illegal {self.status} -> {status}")
        self.status = status
        self.updated_at = now()
        if status in TERMINAL:
            self.finished_at = self.updated_at

    def emit(self, event: str, **fields: Any) -> None:
        """Buffer one event; every payload carries `event`, `run_id` and `timestamp`."""
        stamp = now()
        if event not in QUIET_EVENTS:
            self.last_event = event
            self.updated_at = stamp
        self.channel.put({"event": event, "run_id": self.run_id, "timestamp": stamp, **fields})

    def status_object(self) -> dict[str, Any]:
        """The `GET /v1/runs/{id}` body."""
        body: dict[str, Any] = {
            "object": "hermes.run",
            "run_id": self.run_id,
            "status": self.status.value,
            "updated_at": self.updated_at,
            "created_at": self.created_at,
            "session_id": self.session_id,
            "model": self.model,
        }
        if self.last_event is not None:
            body["last_event"] = self.last_event
        if self.status is RunStatus.COMPLETED:
            body["output"] = self.output
            body["usage"] = self.usage
        if self.status in (RunStatus.FAILED, RunStatus.INTERRUPTED):
            body["error"] = self.error
        return body

    # --- approvals ---------------------------------------------------------------------

    def open_prompt(self) -> asyncio.Future[str]:
        """Register a pending approval prompt (oldest first)."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._prompts.append(future)
        if self.announced_request_id is not None:
            self._prompt_ids[future] = self.announced_request_id
            self.announced_request_id = None
        return future

    def close_prompt(self, future: asyncio.Future[str]) -> None:
        """Forget a prompt that was answered or timed out."""
        with contextlib.suppress(ValueError):
            self._prompts.remove(future)
        self._prompt_ids.pop(future, None)

    def resolve(self, choice: str, resolve_all: bool, request_id: str | None = None) -> int:
        """Answer the oldest pending prompt (or all); returns how many were resolved. With
        `request_id` (after 0.19) only the prompt of that id, if it is still pending."""
        if request_id is not None:
            for future in list(self._prompts):
                if self._prompt_ids.get(future) == request_id and not future.done():
                    self._prompts.remove(future)
                    future.set_result(choice)
                    return 1
            return 0
        resolved = 0
        while self._prompts and (resolved == 0 or resolve_all):
            future = self._prompts.popleft()
            if not future.done():
                future.set_result(choice)
                resolved += 1
        return resolved

    @property
    def pending_prompts(self) -> int:
        """How many approval prompts wait for an answer."""
        return sum(1 for f in self._prompts if not f.done())


#: Resolves a pending prompt when the run is stopped: the command ends up blocked.
STOPPED = "stopped"


class _RunGate:
    """The approval channel of one run: `waiting_for_approval` until answered or timed out."""

    def __init__(self, run: Run, timeout_s: float) -> None:
        self._run = run
        self._timeout_s = timeout_s

    async def wait(self) -> str | None:
        future = self._run.open_prompt()
        if self._run.status is RunStatus.RUNNING:
            self._run.move(RunStatus.WAITING_FOR_APPROVAL)
        try:
            choice = await asyncio.wait_for(asyncio.shield(future), self._timeout_s)
        except TimeoutError:
            return None
        finally:
            self._run.close_prompt(future)
            if self._run.status is RunStatus.WAITING_FOR_APPROVAL:
                self._run.move(RunStatus.RUNNING)
        return None if choice == STOPPED else choice


class RunRegistry:
    """Every run the server knows, plus the concurrency cap shared with chat and responses."""

    def __init__(self, config: FakeConfig, sessions: SessionStore) -> None:
        self._config = config
        self._sessions = sessions
        self._runs: dict[str, Run] = {}
        self._other_agents = 0
        #: MCP tools by name (see `mcp`); kept across a restart, like Hermes' config.
        self.mcp_tools: dict[str, mcp.McpTool] = {}

    # --- the shared cap ----------------------------------------------------------------

    @property
    def active_runs(self) -> int:
        """Runs not yet terminal (what `/health/detailed` calls `active_api_runs`)."""
        return sum(1 for run in self._runs.values() if not run.terminal)

    def at_capacity(self) -> bool:
        """True when one more agent would exceed `max_concurrent_runs` (0 = no cap)."""
        cap = self._config.max_concurrent_runs
        return cap > 0 and self.active_runs + self._other_agents >= cap

    @contextlib.contextmanager
    def agent_slot(self) -> Iterator[None]:
        """Hold a cap slot while a chat completion or response runs its agent."""
        self._other_agents += 1
        try:
            yield
        finally:
            self._other_agents -= 1

    # --- lifecycle ---------------------------------------------------------------------

    def create(
        self,
        input_text: str,
        session_id: str | None,
        model: str | None,
        on_created: Callable[[Run], None] | None = None,
    ) -> Run:
        """Create a run and start its agent task; events buffer from now on."""
        run_id = "run_" + secrets.token_hex(16)
        run = Run(run_id, session_id or run_id, model or "hermes-agent", input_text, now())
        self._runs[run_id] = run
        self._sessions.ensure(run.session_id)
        if on_created is not None:
            on_created(run)
        run.task = asyncio.create_task(self._drive(run), name=f"fake-hermes {run_id}")
        return run

    def get(self, run_id: str) -> Run | None:
        """The run, or None when unknown, expired or forgotten by a restart."""
        return self._runs.get(run_id)

    def stop(self, run: Run) -> None:
        """Interrupt a live run: `stopping` now, `cancelled` after `stop_latency_s`."""
        if run.status is RunStatus.STOPPING:
            return
        run.move(RunStatus.STOPPING)
        asyncio.get_running_loop().call_later(self._config.stop_latency_s, self._interrupt, run)

    @staticmethod
    def _interrupt(run: Run) -> None:
        # A run waiting for approval sees its command blocked (`tool.completed` with an
        # error) before it is cancelled; any other run is interrupted where it is.
        if run.resolve(STOPPED, resolve_all=True) == 0 and run.task is not None:
            run.task.cancel()

    def interrupt_all(self) -> None:
        """What a restart does after 0.19 (upstream PR #114774): every live run ends
        `interrupted` before its agent is stopped, and every run stays pollable; event
        streams are gone with the process."""
        for run in self._runs.values():
            run.channel.drop()
            if not run.terminal:
                run.error = INTERRUPTED_ERROR
                run.move(RunStatus.INTERRUPTED)
                run.last_event = "run.interrupted"
            if run.task is not None:
                run.task.cancel()

    def forget_all(self) -> None:
        """What a Hermes restart does: every run vanishes, without a terminal event."""
        runs = list(self._runs.values())
        self._runs.clear()
        for run in runs:
            run.channel.drop()
            if run.task is not None:
                run.task.cancel()

    def sweep(self) -> None:
        """Drop expired terminal runs and buffers nobody subscribed to in time."""
        stamp = now()
        for run_id, run in list(self._runs.items()):
            if run.finished_at is not None and stamp - run.finished_at > (
                self._config.terminal_retention_s
            ):
                del self._runs[run_id]
                run.channel.drop()
            elif (
                not run.channel.subscribed
                and stamp - run.channel.created_at > self._config.unsubscribed_stream_ttl_s
            ):
                run.channel.drop()

    # --- the agent task ----------------------------------------------------------------

    async def _drive(self, run: Run) -> None:
        try:
            try:
                await asyncio.sleep(self._config.build_delay_s)
                if run.status is RunStatus.QUEUED:  # else stopped while the agent was built
                    run.move(RunStatus.RUNNING)
                    await self._play(run)
            except asyncio.CancelledError:
                if run.run_id not in self._runs or run.status is RunStatus.INTERRUPTED:
                    return  # a restart: no terminal event, like a dead process
            if run.status is RunStatus.STOPPING:
                run.move(RunStatus.CANCELLED)
                run.emit("run.cancelled")
                self._sessions.record_turn(run.session_id, run.input_text, [], None, self._model)
        finally:
            run.channel.finish()

    async def _play(self, run: Run) -> None:
        arguments = mcp.delegated_arguments(run.input_text)
        tool = self.mcp_tools.get(mcp.AIP_CALL)
        if arguments is not None and tool is not None and OFF_CONTRACT not in run.input_text:
            await self._play_delegated(run, tool, arguments)
            return
        gate = _RunGate(run, self._config.approval_timeout_s)
        async with contextlib.aclosing(agent.run_turn(run.input_text, gate)) as steps:
            async for step in steps:
                self._render(run, step)
                if run.status is RunStatus.STOPPING:
                    return

    async def _play_delegated(
        self, run: Run, tool: mcp.McpTool, arguments: dict[str, Any]
    ) -> None:
        """One `aip_call` with the exact arguments, then prose, then `run.completed`."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Hermes has no main argument to preview for an MCP tool (agent/display.py).
        run.emit("tool.started", tool=mcp.HERMES_TOOL_NAME, preview=None)
        failed = False
        try:
            with tracing.span(f"execute_tool {mcp.AIP_CALL}", carrier=run.trace):
                result = await tool(arguments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            result, failed = f"error: {exc}", True
        if run.status is RunStatus.STOPPING:
            return
        run.emit(
            "tool.completed",
            tool=mcp.HERMES_TOOL_NAME,
            duration=round(loop.time() - started, 3),
            error=failed,
        )
        text = mcp.delegated_final_text(result, failed)
        # As after any tool call, 0.19.0 starts the next text with "\n\n".
        for n, piece in enumerate(word_deltas(text)):
            run.emit("message.delta", delta="\n\n" + piece if n == 0 else piece)
        usage = agent.Usage(agent.INPUT_TOKENS_PER_CALL * 2, agent.OUTPUT_TOKENS_PER_CALL * 2)
        self._render(run, agent.Finished(text, usage, [], []))

    @property
    def offered_choices(self) -> tuple[str, ...]:
        """What an approval prompt offers (`FakeConfig.approval_choices`, else the four)."""
        return self._config.approval_choices or agent.APPROVAL_CHOICES

    @property
    def _model(self) -> str:
        return self._config.llm_model

    def _render(self, run: Run, step: agent.Step) -> None:
        match step:
            case agent.ToolStarted(call):
                run.emit("tool.started", tool=agent.TOOL, preview=call.command)
            case agent.ApprovalRequested(call):
                extra: dict[str, Any] = {}
                if self._config.approval_request_ids:
                    run.announced_request_id = "apr_" + secrets.token_hex(8)
                    extra["request_id"] = run.announced_request_id
                run.emit(
                    "approval.request",
                    command=call.command,
                    pattern_key=agent.APPROVAL_DESCRIPTION,
                    pattern_keys=[agent.APPROVAL_DESCRIPTION],
                    description=agent.APPROVAL_DESCRIPTION,
                    allow_permanent=True,
                    choices=list(self.offered_choices),
                    **extra,
                )
            case agent.ApprovalResolved(choice):
                run.emit("approval.responded", choice=choice, resolved=1)
            case agent.ToolCompleted(_, _, duration, error):
                run.emit("tool.completed", tool=agent.TOOL, duration=duration, error=error)
            case agent.TextDelta(text, after_tool):
                run.emit("message.delta", delta="\n\n" + text if after_tool else text)
            case agent.Finished(text, usage, messages, _):
                run.emit("reasoning.available", text=text)
                run.output = text
                run.usage = usage.as_hermes()
                run.move(RunStatus.COMPLETED)
                run.emit("run.completed", output=text, usage=run.usage)
                self._sessions.record_turn(
                    run.session_id, run.input_text, messages, usage, self._model
                )
            case agent.Failed(error):
                run.error = error
                run.move(RunStatus.FAILED)
                run.emit("run.failed", error=error)
                self._sessions.record_turn(run.session_id, run.input_text, [], None, self._model)
