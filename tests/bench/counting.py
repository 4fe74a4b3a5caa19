"""Count the Redis commands a process *sends*, from inside that process.

`INFO commandstats` counts what Redis executed, including every `redis.call` inside a Lua
script, so it cannot tell one EVALSHA round trip from the five commands it runs. The
targets speak of commands sent, so each measured process installs this counter: redis-py
packs every command it sends, single or pipelined, through `pack_command` exactly once, and
the worker's multiplexed script connection packs through `worker.store.multiplexed.pack`;
those two are the places counted. The totals are written to `AIPD_BENCH_COUNT_FILE` at exit
(every worker kind exits cleanly on SIGTERM at the end of a measurement).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection

from worker.store import multiplexed

COUNT_FILE_ENV = "AIPD_BENCH_COUNT_FILE"

sent: Counter[str] = Counter()
#: EVALSHA calls by script SHA1, so a report can name the scripts an Action runs.
scripts: Counter[str] = Counter()
#: Pipeline executions and the commands they carried (the heartbeat is the one pipeline).
pipelines: Counter[str] = Counter()


def install() -> None:
    """Wrap `pack_command` once and arrange for the totals to be written at exit."""
    original = AbstractConnection.pack_command
    if getattr(original, "_bench_counting", False):
        return

    def pack_command(self: AbstractConnection, *args: Any) -> Any:
        _count(args)
        return original(self, *args)

    original_pack = multiplexed.pack

    def pack(args: tuple[Any, ...]) -> bytes:
        _count(args)
        return original_pack(args)

    multiplexed.pack = pack

    pack_command._bench_counting = True  # type: ignore[attr-defined]
    AbstractConnection.pack_command = pack_command  # type: ignore[method-assign]
    execute = Pipeline.execute

    async def pipeline_execute(self: Pipeline, raise_on_error: bool = True) -> Any:
        pipelines["executions"] += 1
        pipelines["commands"] += len(self.command_stack)
        return await execute(self, raise_on_error)

    Pipeline.execute = pipeline_execute  # type: ignore[method-assign]
    execute_many = multiplexed.Multiplexed.execute_many

    async def shared_execute_many(self: multiplexed.Multiplexed, commands: Any) -> Any:
        pipelines["executions"] += 1
        pipelines["commands"] += len(commands)
        return await execute_many(self, commands)

    multiplexed.Multiplexed.execute_many = shared_execute_many  # type: ignore[method-assign]
    target = os.environ.get(COUNT_FILE_ENV)
    if target:
        atexit.register(_write, Path(target))


def _count(args: tuple[Any, ...]) -> None:
    name = args[0]
    command = name.decode() if isinstance(name, bytes) else str(name).upper()
    sent[command] += 1
    if command == "EVALSHA":
        sha = args[1]
        scripts[sha.decode() if isinstance(sha, bytes) else str(sha)] += 1


def _write(path: Path) -> None:
    path.write_text(
        json.dumps({"sent": dict(sent), "scripts": dict(scripts), "pipelines": dict(pipelines)}),
        encoding="utf-8",
    )


def read_counts(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Commands and EVALSHAs by SHA one process wrote at exit (empty after a kill -9)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}, {}
    return (
        {str(k): int(v) for k, v in data["sent"].items()},
        {str(k): int(v) for k, v in data["scripts"].items()},
    )


def read_pipelines(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {str(k): int(v) for k, v in data.get("pipelines", {}).items()}


def script_names() -> dict[str, str]:
    """SHA1 → name of every Lua script of the worker (`worker/store/lua/*.lua`)."""
    lua = Path(__file__).resolve().parents[2] / "worker" / "store" / "lua"
    return {
        hashlib.sha1(path.read_bytes()).hexdigest(): path.stem  # noqa: S324 - Redis' script id
        for path in sorted(lua.glob("*.lua"))
    }
