"""The Lua scripts, loaded once and registered with redis-py.

redis-py's `Script` sends EVALSHA and falls back to loading the script on NOSCRIPT, so a
Redis restart or failover (which empties the script cache) costs one extra round trip and
nothing else. Each script's guarantee is written at the top of its `.lua` file.

A single call goes through `Script` below rather than redis-py's `AsyncScript`: the same
EVALSHA and the same reload on NOSCRIPT, without the per-call `isinstance` test against a
typing Protocol and the keyword plumbing of `evalsha()` (together ~0.1 ms of CPU per call
on the benchmark machine, with ~10 script calls per operator Action).

Pipelines are the exception: redis-py refuses `Script` calls inside a Redis Cluster pipeline
(EVALSHA is on its blocked list) and never reloads scripts for one, so `Scripts.pipeline`
sends raw EVALSHA commands and does the NOSCRIPT reload itself, the same way on a single
server and on a cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from worker import tracing
from worker.store.connection import is_transient, multiplexed
from worker.store.reask import reask

_LUA = resources.files("worker.store") / "lua"

SCRIPT_NAMES = (
    "lease_acquire",
    "lease_renew",
    "lease_release",
    "mark_attempt",
    "chunk_record",
    "chunk_chain",
    "settle",
    "cancel_request",
    "cancel_promote",
)


def script_source(name: str) -> str:
    return (_LUA / f"{name}.lua").read_text(encoding="utf-8")


def all_script_names() -> list[str]:
    """Every `.lua` file shipped (so a test can prove each one runs on Redis Cluster)."""
    return sorted(
        entry.name.removesuffix(".lua") for entry in _LUA.iterdir() if entry.name.endswith(".lua")
    )


def reply_text(value: Any) -> str:
    """A Redis reply as text: redis-py hands script replies and hash fields back as bytes
    unless the client decodes them, and the stores read them either way."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One script invocation for `Scripts.pipeline`."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]


class Script:
    """One Lua script bound to one client: `await script(keys=..., args=...)`.

    EVALSHA through the client's shared connection when it has one (`multiplexed`), else
    its `execute_command` (which routes by key on a cluster); on
    NOSCRIPT (a restarted or promoted node) the source is loaded and the call sent once
    more. Every script here answers a repeat with what its first run did. Callers that meet
    NOSCRIPT together share one SCRIPT LOAD: a worker holding 10,000 runs (bench figure 4)
    otherwise sent one each, every one on a pooled connection of its own.
    """

    __slots__ = (
        "_command", "_loading", "_owner", "_send", "_span_name", "cancel_safe", "name", "redis",
        "script", "sha",
    )  # fmt: skip

    def __init__(
        self,
        redis: Any,
        source: str,
        owner: Scripts | None = None,
        *,
        read_only: bool = False,
        name: str = "script",
    ) -> None:
        """`name`: the script's file name, what its trace span is called by (never the raw
        EVALSHA). `read_only`: sent as EVALSHA_RO (Redis 7+), which an ACL user holding only read
        access (`%R~`) to the script's keys may run: Redis checks EVALSHA's keys as
        read-write whatever the script does (compose/redis/users.acl: the workers read
        approval records and may not write them)."""
        self.redis = redis
        self.name = name
        self._command = "EVALSHA_RO" if read_only else "EVALSHA"
        self._span_name = f"{self._command} {name}"
        shared = multiplexed(redis)
        #: Where EVALSHA goes: the client's shared connection when it has one
        #: (`worker.store.multiplexed`), else redis-py's `execute_command`.
        self._send = shared.execute if shared is not None else redis.execute_command
        #: A cancelled call leaves nothing half-read on a connection (the shared one drops
        #: an abandoned reply), so a caller needs no shield around it.
        self.cancel_safe = shared is not None
        self.script = source
        # The script cache key Redis itself uses (SHA1 names the script, it protects nothing).
        self.sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        self._owner = owner
        self._loading: asyncio.Future[None] | None = None

    async def __call__(self, keys: Sequence[Any] = (), args: Iterable[Any] = ()) -> Any:
        if tracing.enabled():
            with tracing.span(
                self._span_name,
                kind="client",
                attributes={
                    "db.system.name": "redis",
                    "db.operation.name": self._command,
                    "db.query.summary": self._span_name,
                },
            ):
                return await self._call(keys, args)
        return await self._call(keys, args)

    async def _call(self, keys: Sequence[Any], args: Iterable[Any]) -> Any:
        owner = self._owner
        if owner is not None and not owner.preloaded:
            await owner.preload()
        try:
            return await self._send(self._command, self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._load()
            return await self._send(self._command, self.sha, len(keys), *keys, *args)

    async def reasked(
        self,
        keys: Sequence[Any],
        args: Sequence[Any] = (),
        *,
        budget_s: float,
        retry_if: Callable[[BaseException], bool] = is_transient,
        give_up_if: Callable[[BaseException], bool] | None = None,
    ) -> Any:
        """This script, asked again after an ambiguous failure within `budget_s`
        (`worker.store.reask`): the one place a script call decides whether it needs a
        shield against cancellation (only off the shared connection, `cancel_safe`)."""
        return await reask(
            lambda: self(keys=keys, args=args),
            budget_s=budget_s,
            retry_if=retry_if,
            give_up_if=give_up_if,
            shield=not self.cancel_safe,
        )

    async def _load(self) -> None:
        """SCRIPT LOAD once for every caller waiting on it (a failed load is not kept)."""
        loading = self._loading
        if loading is None or loading.get_loop() is not asyncio.get_running_loop():
            loading = self._loading = asyncio.ensure_future(self.redis.script_load(self.script))
            loading.add_done_callback(self._loaded)
        await asyncio.shield(loading)

    def _loaded(self, loading: asyncio.Future[None]) -> None:
        if self._loading is loading:
            self._loading = None
        if not loading.cancelled():
            loading.exception()  # read here too, in case every waiter was cancelled


class Scripts:
    """Every script of one Redis client, by name."""

    def __init__(
        self,
        redis: Any,
        names: tuple[str, ...] = SCRIPT_NAMES,
        *,
        read_only: frozenset[str] = frozenset(),
    ) -> None:
        """`read_only`: the scripts (each of which only reads) sent as EVALSHA_RO, for a
        client whose ACL user holds read-only key patterns (`%R~`) for their keys."""
        self.redis = redis
        self._scripts = {
            name: Script(redis, script_source(name), self, read_only=name in read_only, name=name)
            for name in names
        }
        #: Every script of this client is `Script.cancel_safe` (they share one client).
        self.cancel_safe = multiplexed(redis) is not None
        self._loaded: set[str] = set()
        #: Every script loaded once before the first call, so a process that starts with
        #: 100 deliveries in flight does not answer 100 NOSCRIPTs with 100 SCRIPT LOADs
        #: per script. After a Redis restart the per-call NOSCRIPT reload takes over.
        self.preloaded = False
        self._preloading: asyncio.Future[None] | None = None

    async def preload(self) -> None:
        """Load every script of this client once; concurrent first callers share one load."""
        loading = self._preloading
        if loading is None or loading.get_loop() is not asyncio.get_running_loop():
            loading = self._preloading = asyncio.ensure_future(
                self._load([name for name in self._scripts if name not in self._loaded])
            )
        try:
            await asyncio.shield(loading)
        except Exception:
            self._preloading = None  # the next call tries again (its own error decides)
            raise
        self.preloaded = True

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    async def pipeline(
        self, calls: Sequence[ScriptCall], trailer: Callable[[Any], None] | None = None
    ) -> list[Any]:
        """Run `calls` in one pipelined round trip per Redis node, in order.

        `trailer` may queue more commands after the scripts (the write confirmation does:
        WAIT must follow the write on the same connection). After a NOSCRIPT (a restarted or
        promoted node) the scripts are loaded on every master and the pipeline is sent once
        more; every script answers a repeat with what its first run did, so that is safe.
        """
        if tracing.enabled():
            names = list(dict.fromkeys(call.name for call in calls))
            with tracing.span(
                "pipeline " + " ".join(names),
                kind="client",
                attributes={
                    "db.system.name": "redis",
                    "db.operation.name": "PIPELINE",
                    "db.operation.batch.size": len(calls),
                },
            ):
                return await self._pipeline(calls, trailer)
        return await self._pipeline(calls, trailer)

    async def _pipeline(
        self, calls: Sequence[ScriptCall], trailer: Callable[[Any], None] | None
    ) -> list[Any]:
        names = list(dict.fromkeys(call.name for call in calls))
        # Loaded up front once per client, so the first pipeline is not wasted on NOSCRIPT.
        await self._load([name for name in names if name not in self._loaded])
        commands = [
            ("EVALSHA", self._scripts[call.name].sha, len(call.keys), *call.keys, *call.args)
            for call in calls
        ]
        # On the client's shared connection: one write, and one wake-up when the last reply
        # is in (`Multiplexed.execute_many`), where redis-py's pipeline takes a pass of the
        # event loop per socket read. A trailer needs redis-py's pipeline (WAIT must follow
        # the write on its connection), and a cluster client has no shared connection.
        shared = multiplexed(self.redis) if trailer is None else None
        for attempt in (0, 1):
            try:
                if shared is not None:
                    return await shared.execute_many(commands)
                return await self._on_redis_py(commands, trailer)
            except NoScriptError:
                if attempt:
                    raise
                await self._load(names)  # a restarted or promoted server lost them
        raise AssertionError("unreachable")

    async def _on_redis_py(
        self, commands: list[tuple[Any, ...]], trailer: Callable[[Any], None] | None
    ) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        if trailer is not None:
            trailer(pipe)
        return list(await pipe.execute())

    async def _load(self, names: list[str]) -> None:
        for name in names:
            # On a cluster client SCRIPT LOAD goes to every master.
            await self.redis.script_load(self._scripts[name].script)
            self._loaded.add(name)
