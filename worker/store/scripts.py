"""The Lua scripts, loaded once and registered with redis-py.

redis-py's `Script` sends EVALSHA and falls back to loading the script on NOSCRIPT, so a
Redis restart or failover (which empties the script cache) costs one extra round trip and
nothing else. Each script's guarantee is written at the top of its `.lua` file.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

_LUA = resources.files("worker.store") / "lua"

SCRIPT_NAMES = (
    "lease_acquire",
    "lease_renew",
    "lease_release",
    "mark_attempt",
    "settle",
    "cancel_request",
)


def script_source(name: str) -> str:
    return (_LUA / f"{name}.lua").read_text(encoding="utf-8")


class Scripts:
    """Every registered script of one Redis client, by name."""

    def __init__(self, redis: Any, names: tuple[str, ...] = SCRIPT_NAMES) -> None:
        self._scripts = {name: redis.register_script(script_source(name)) for name in names}

    def __getitem__(self, name: str) -> Any:
        return self._scripts[name]
