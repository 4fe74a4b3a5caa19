"""What the driver asks each Hermes to do: a plain instruction a real model follows, plus
the scenario word the project's fake LLM acts on.

Qualification runs against a real Hermes, whose model may be a real one (the instruction is
for it) or the project's fake LLM (the word is for it; `worker.testing.scenario` takes its
words from here, so the fake and the driver cannot drift). A real model cannot be told to
fail an HTTP call or to stream at a fixed pace, so FAILING and SLOW are only deterministic
with the fake LLM (docs/qualification.md).
"""

from __future__ import annotations

#: The agent calls the `terminal` tool with a harmless `echo`; no approval is needed.
TOOL_ECHO = "scenario-tool-echo"
#: The agent calls `terminal` with `chmod 777 …`, which Hermes holds for approval (manual mode).
NEEDS_APPROVAL = "scenario-needs-approval"
#: As NEEDS_APPROVAL (the word contains it), then the same command once more after the first
#: decision: Hermes asks twice in one run (approval generations 1 and 2; a `once` decision
#: approves one command only).
NEEDS_TWO_APPROVALS = NEEDS_APPROVAL + "-twice"
#: The reply is streamed slowly (`worker.testing.scenario.SLOW_DELTAS` deltas,
#: `SLOW_DELTA_DELAY_S` apart): runs can be stopped.
SLOW_REPLY = "scenario-slow-reply"
#: The LLM answers with an HTTP error, so the run ends `run.failed`.
LLM_ERROR = "scenario-llm-error"

#: The shell command the echo scenario runs, and what it prints.
ECHO_COMMAND = "echo hello-from-tool"
#: The command that needs approval (the file is created in the scratch working directory).
APPROVAL_COMMAND = "chmod 777 aip-scenario-file.txt"

PLAIN = "Reply with one short sentence saying that the qualification run reached you."
TOOL = f"Use the terminal tool to run `{ECHO_COMMAND}`, then say what it printed. {TOOL_ECHO}"
APPROVAL = (
    f"Use the terminal tool to run `{APPROVAL_COMMAND}`, then say it is done. {NEEDS_APPROVAL}"
)
APPROVAL_TWICE = (
    f"Use the terminal tool to run `{APPROVAL_COMMAND}`, then run exactly the same command a "
    f"second time, then say it is done. {NEEDS_TWO_APPROVALS}"
)
SLOW = f"Write the words tick0 to tick39, slowly, one at a time. {SLOW_REPLY}"
#: A real model cannot be told to fail; the fake LLM answers this word with an HTTP 400.
FAILING = f"This turn must fail. {LLM_ERROR}"
