"""The six MCP tools' bodies: reference-shaped arguments in, reference-shaped answers out.

Each body checks its arguments against the tool's input schema (worker/gateway/facade.py),
runs the `GatewayService` call for the transport-authenticated principal and maps the
record onto the AIP object the reference facade answers with. The caller names its Actions
by its own ids; the service resolves them to the namespaced bus ids, which only the
receipts see (`Outcome.bus_action_id`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.gateway.facade import (
    EVENTS_TYPE,
    META_KEY,
    RESULT_TYPE,
    STATUS_TYPE,
    action_result,
    action_status,
    call_answer,
    check_arguments,
    invalid,
    read_answer,
    summary_text,
)
from worker.gateway.principals import Principal
from worker.gateway.service import CAPABILITIES_PAGE, GatewayService, not_found

#: How long `aip_action_cancel` waits, after asking, for the cancel to settle the Action.
CANCEL_SETTLE_MS = 2_000


@dataclass(frozen=True, slots=True)
class Outcome:
    """One tool's answer: the MCP result's parts and what its receipt names."""

    structured: dict[str, Any] | None
    is_error: bool = False
    meta: dict[str, Any] | None = None
    text: str = ""
    bus_action_id: str | None = None
    capability: str | None = None

    @classmethod
    def read(
        cls, structured: dict[str, Any], *, bus_action_id: str | None, capability: str | None
    ) -> Outcome:
        return cls(
            structured=structured,
            text=summary_text(structured),
            bus_action_id=bus_action_id,
            capability=capability,
        )


class FacadeTools:
    """The tool bodies over one `GatewayService`."""

    def __init__(self, service: GatewayService) -> None:
        self.service = service

    async def run(self, tool: str, principal: Principal, arguments: dict[str, Any]) -> Outcome:
        if tool == "aip_call":
            # The service checks the contract (its size first, then the schema).
            return await self.call(principal, arguments)
        checked = check_arguments(tool, arguments)
        tenant = checked.get("tenant_id")
        if tenant is not None and tenant != principal.tenant_id:
            # Another tenant's Action is answered exactly like an unknown one.
            raise not_found(str(checked.get("action_id")))
        if tool == "aip_capabilities":
            return await self.capabilities(principal, checked)
        if tool == "aip_action_status":
            return await self.status(principal, checked)
        if tool == "aip_action_result":
            return await self.result(principal, checked)
        if tool == "aip_action_events":
            return await self.events(principal, checked)
        return await self.cancel(principal, checked)

    async def capabilities(self, principal: Principal, arguments: dict[str, Any]) -> Outcome:
        page = await self.service.capabilities(
            principal,
            cursor=int(arguments.get("cursor", "0")),
            limit=arguments.get("limit", CAPABILITIES_PAGE),
            capability_id=arguments.get("capability_id"),
            profile=arguments.get("profile"),
            query=arguments.get("query"),
            include_schemas=arguments.get("include_schemas", False),
            include_contracts=arguments.get("include_contracts", False),
            include_bindings=arguments.get("include_bindings", True),
        )
        return Outcome.read(page, bus_action_id=None, capability=None)

    async def call(self, principal: Principal, arguments: dict[str, Any]) -> Outcome:
        view = await self.service.call(principal, arguments)
        answer = call_answer(
            view["aip_action_id"],
            view.get("result"),
            state=view["state"],
            duplicate=bool(view.get("duplicate")),
        )
        return Outcome(
            structured=answer["structured"],
            is_error=answer["is_error"],
            meta=answer["meta"],
            text=answer["text"],
            bus_action_id=view["action_id"],
            capability=view["capability"],
        )

    async def status(self, principal: Principal, arguments: dict[str, Any]) -> Outcome:
        _refuse_unserved(arguments, "include_receipts")
        action_id = arguments["action_id"]
        view = await self.service.result(principal, action_id, arguments.get("wait_ms", 0))
        chunks: list[dict[str, Any]] = []
        if arguments.get("include_chunks"):
            page, _ = await self.service.events(principal, action_id, 0, 1000, include_chunks=True)
            chunks = page.get("chunks", [])
        status = action_status(
            action_id, view, with_result=bool(arguments.get("include_result")), chunks=chunks
        )
        return Outcome.read(
            read_answer(STATUS_TYPE, "action_status", status),
            bus_action_id=view["action_id"],
            capability=view["capability"],
        )

    async def result(self, principal: Principal, arguments: dict[str, Any]) -> Outcome:
        _refuse_unserved(arguments, "include_receipt", "include_terminal_events")
        action_id = arguments["action_id"]
        view = await self.service.result(principal, action_id, arguments.get("wait_ms", 0))
        return Outcome.read(
            _result_or_status(action_id, view),
            bus_action_id=view["action_id"],
            capability=view["capability"],
        )

    async def events(self, principal: Principal, arguments: dict[str, Any]) -> Outcome:
        kinds = set(arguments.get("kinds", []))
        if "kind" in arguments:
            kinds.add(arguments["kind"])
        page, record = await self.service.events(
            principal,
            arguments["action_id"],
            int(arguments.get("cursor", "0")),
            arguments.get("limit", 100),
            kinds=frozenset(kinds),
            include_chunks=bool(arguments.get("include_chunks")),
            follow=bool(arguments.get("follow")),
        )
        return Outcome.read(
            read_answer(EVENTS_TYPE, "action_events", page),
            bus_action_id=record.action.id,
            capability=record.action.capability,
        )

    async def cancel(self, principal: Principal, arguments: dict[str, Any]) -> Outcome:
        """The reference answers a Cancel with the Action's ActionResult: the executor is
        asked to cancel, and the answer is the terminal result once the cancel settles it
        (or how it had already ended), else its ActionStatus with what the executor said
        under `_meta["org.getaip/aip"].cancel`."""
        action_id = arguments["action_id"]
        view = await self.service.result(principal, action_id)
        meta: dict[str, Any] | None = None
        if view["result"] is None:
            said = await self.service.cancel(principal, action_id, arguments.get("reason", ""))
            facts = {
                key: said[key]
                for key in ("accepted", "executor_state", "executor_status", "error")
                if key in said
            }
            meta = {META_KEY: {"cancel": facts}}
            view = await self.service.result(principal, action_id, CANCEL_SETTLE_MS)
        structured = _result_or_status(action_id, view)
        return Outcome(
            structured=structured,
            meta=meta,
            text=summary_text(structured),
            bus_action_id=view["action_id"],
            capability=view["capability"],
        )


def _result_or_status(action_id: str, view: dict[str, Any]) -> dict[str, Any]:
    """The ActionResult once the Action ended, else its ActionStatus (the pairing the
    native binding answers a result request with)."""
    result = view.get("result")
    if result is not None:
        return read_answer(RESULT_TYPE, "action_result", action_result(action_id, result))
    return read_answer(
        STATUS_TYPE, "action_status", action_status(action_id, view, with_result=False)
    )


def _refuse_unserved(arguments: dict[str, Any], *flags: str) -> None:
    for flag in flags:
        if arguments.get(flag):
            raise invalid(f"{flag} is not served by this gateway (its receipts are audit-only)")
