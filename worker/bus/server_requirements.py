"""The nats-server releases this project accepts, checked from the server's INFO.

Why a minimum: Jepsen's analysis of NATS 2.12.1 (https://jepsen.io/analyses/nats-2.12.1,
2025-12-08, section "a belated note" on 2.10.22) found that process crashes in nats-server
2.10.20 to 2.10.22 could delete a stream for good; Synadia's answer to the report says the
fix shipped in 2.10.23 with further clustering fixes in 2.11 and 2.12. The same analysis lost
acknowledged writes on 2.12.1 under OS crashes with the default `sync_interval` (an fsync
every two minutes): a setting, not a release, which the shipped `compose/nats/nats.conf`
sets to `always` (docs/operations.md, "Durability contract"). So every release from 2.10.23
on is accepted, and none before it.

`provision` refuses a server below the minimum unless told otherwise (its
`--allow-nats-below-minimum` flag); `run` logs a warning at start-up and serves, since
refusing would only take away the workers of a deployment that must upgrade anyway.
"""

from __future__ import annotations

from typing import Protocol

#: The oldest nats-server release accepted (see the module docstring for the source).
MINIMUM_NATS_SERVER = (2, 10, 23)
SOURCE = (
    "Jepsen, NATS 2.12.1 (https://jepsen.io/analyses/nats-2.12.1): 2.10.20-2.10.22 lose streams"
)


class _Version(Protocol):
    """nats-py's `ServerVersion` (what `Client.connected_server_version` returns)."""

    @property
    def major(self) -> int: ...
    @property
    def minor(self) -> int: ...
    @property
    def patch(self) -> int: ...


def as_tuple(version: _Version) -> tuple[int, int, int]:
    return (int(version.major), int(version.minor), int(version.patch))


def version_problem(version: _Version) -> str | None:
    """None for an accepted release; else one line naming the version, the minimum and why."""
    found = as_tuple(version)
    if found >= MINIMUM_NATS_SERVER:
        return None
    minimum = ".".join(map(str, MINIMUM_NATS_SERVER))
    return (
        f"nats-server {'.'.join(map(str, found))} is older than {minimum}, the oldest release "
        f"this project accepts ({SOURCE}); upgrade nats-server"
    )
