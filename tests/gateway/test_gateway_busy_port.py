"""A gateway whose port another process holds says which setting to change (issue 28).

Before: "a service is unreachable ([Errno 98] ...); check AIPD_NATS_URL", which sent the
operator to the wrong setting.
"""

from __future__ import annotations

import asyncio
import socket

from tests.gateway.conftest import GatewayStack
from worker.testing.gateway import gateway_process


async def test_a_busy_gateway_port_names_its_setting(gstack: GatewayStack) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = gateway_process(
            "g-busy", {**gstack.env, "AIPD_GATEWAY_PORT": str(port)}, gstack.stack.root
        )
        gstack.gateways.append(proc)
        await asyncio.to_thread(proc.start, wait_ready_s=0)
        code = await asyncio.to_thread(proc.wait_exit, 30)
    text = proc.log_text()
    assert code == 2, text
    assert f"port {port} on 127.0.0.1 is already in use" in text, text
    assert "AIPD_GATEWAY_PORT" in text
    assert "AIPD_NATS_URL" not in text
    assert "Traceback" not in text
