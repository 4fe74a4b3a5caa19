"""The qualification list as code: what an item is, how it passes, fails or skips.

The connector overview ("Qualification Requirements") names ten items; each is one async
function here that either returns a one-line summary (pass), raises `QualifyFailed` with
what was observed instead (fail), or raises `QualifySkipped` with why it cannot run against
this deployment (skip). Evidence (Action ids, run ids, receipt sequence numbers) is collected
as the item goes, so a failure cites what it saw too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NoReturn

from worker.errors import ConnectorError, QualifyFailed, QualifyNotConfigured, QualifySkipped
from worker.qualify.broken import BrokenHermes
from worker.qualify.control import ProcessControl
from worker.qualify.deployment import Deployment, Evidence


class Status(StrEnum):
    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    SKIP = "skip"


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise QualifyFailed(message)


def fail(message: str) -> NoReturn:
    raise QualifyFailed(message)


@dataclass(frozen=True, slots=True)
class Broken:
    """The deliberately broken endpoint: its id in the deployment and the server behind it."""

    endpoint_id: str
    server: BrokenHermes


@dataclass
class Context:
    deployment: Deployment
    #: The `--endpoint-id` values, in order (the Hermes instances under qualification).
    endpoint_ids: list[str]
    #: Why an endpoint cannot be used (unreachable, key refused, no worker), by id.
    problems: dict[str, str] = field(default_factory=dict)
    control: ProcessControl | None = None
    broken: Broken | None = None
    #: The gateway's MCP URL and the driver's token, when both are configured and accepted.
    gateway_url: str | None = None
    mcp_token: str | None = field(default=None, repr=False)
    #: Why the gateway cannot be used, when it cannot.
    gateway_problem: str | None = None

    def endpoints(self, count: int) -> list[str]:
        """The first `count` endpoints under qualification; skip when fewer were named,
        fail when one of them cannot be used (that is the deployment's fault)."""
        if len(self.endpoint_ids) < count:
            raise QualifySkipped(
                f"needs {count} Hermes endpoints (--endpoint-id given {count} times), "
                f"got {len(self.endpoint_ids)}"
            )
        chosen = self.endpoint_ids[:count]
        for endpoint_id in chosen:
            if endpoint_id in self.problems:
                raise QualifyFailed(f"endpoint {endpoint_id}: {self.problems[endpoint_id]}")
        return chosen

    def owned(self) -> ProcessControl:
        if self.control is None:
            raise QualifySkipped(
                "the driver does not own the deployment's processes; "
                "run it through `python -m worker.testing.qualify_local`, which does"
            )
        return self.control

    def gateway(self) -> tuple[str, str]:
        if self.gateway_problem is not None:
            raise QualifyFailed(f"gateway: {self.gateway_problem}")
        if self.gateway_url is None or self.mcp_token is None:
            raise QualifySkipped(
                "no gateway to call: set AIPD_QUALIFY_GATEWAY_URL and AIPD_MCP_ACCESS_TOKEN_FILE"
            )
        return self.gateway_url, self.mcp_token

    def broken_endpoint(self) -> Broken:
        if self.broken is None:
            raise QualifySkipped("no broken endpoint: pass --broken-endpoint ID=HOST:PORT")
        if self.broken.endpoint_id in self.problems:
            raise QualifyFailed(
                f"broken endpoint {self.broken.endpoint_id}: "
                f"{self.problems[self.broken.endpoint_id]}"
            )
        return self.broken


ItemBody = Callable[[Context, Evidence], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Item:
    number: int
    title: str
    body: ItemBody


@dataclass(frozen=True, slots=True)
class ItemResult:
    number: int
    title: str
    status: Status
    detail: str
    evidence: Evidence
    seconds: float

    def line(self) -> str:
        ids = ", ".join(self.evidence.action_ids[:6])
        more = len(self.evidence.action_ids) - 6
        if more > 0:
            ids += f" (+{more})"
        tail = f" [actions: {ids}]" if ids else ""
        return f"{self.number:>2} {self.status.value:<4} {self.title}: {self.detail}{tail}"


async def run_item(item: Item, ctx: Context, timeout_s: float) -> ItemResult:
    """Run one item; whatever happens, it ends as a result (never an exception)."""
    evidence = Evidence()
    started = time.monotonic()
    status, detail = Status.PASS, ""
    try:
        async with asyncio.timeout(timeout_s):
            detail = await item.body(ctx, evidence)
    except QualifyFailed as exc:
        status, detail = Status.FAIL, str(exc)
    except QualifySkipped as exc:
        status, detail = Status.SKIP, str(exc)
    except QualifyNotConfigured as exc:
        status, detail = Status.SKIP, str(exc)
    except TimeoutError:
        status, detail = Status.FAIL, f"no answer within {timeout_s:g} s"
    except ConnectorError as exc:
        status, detail = Status.FAIL, f"{exc.code.value}: {exc.message}"
    except Exception as exc:
        status, detail = Status.FAIL, f"{type(exc).__name__}: {exc}"
    return ItemResult(item.number, item.title, status, detail, evidence, time.monotonic() - started)
