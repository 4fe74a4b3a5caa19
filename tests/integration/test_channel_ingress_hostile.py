"""Channel ingress against a hostile provider (issue 27, item 2): real worker processes, NATS
and Redis, the fake Hermes as the provider.

- Messages without an id are refused at every poll (there is no cursor to move past
  them): 192 KB each wrote 190 MB of DLQ in 40 s before. Now they go through the DLQ's
  per-subject rate and keep-bytes cap like refused envelopes, so the DLQ stays small.
- A credential in tool output (or anywhere in a message) is redacted before it is
  published, and before a refused message is kept on the DLQ.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from schemas.channel import ChannelRole
from tests.integration.stack import ENDPOINT, Stack

from .test_channel_ingress import fake_session, ingress_env, published, turn, wait_published

KEEP_BYTES = 1_024
RATE_PER_S = 2.0
BURST = 5


async def test_id_less_floods_are_rate_limited_and_cut_on_the_dlq(stack: Stack) -> None:
    session = fake_session(stack)
    turn(stack, "hello")
    for n in range(20):  # each poll returns all twenty again
        session.messages.append({"role": "assistant", "content": f"{n}" + "x" * 192_000})
    await stack.spawn(
        "w1",
        AIPD_DLQ_KEEP_BYTES=str(KEEP_BYTES),
        AIPD_DLQ_RATE_PER_S=str(RATE_PER_S),
        AIPD_DLQ_BURST=str(BURST),
        **ingress_env(stack),  # a poll every 200 ms
    )
    await wait_published(stack, 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    # The provider changes them all the time (so no duplicate window folds them either).
    for tick in range(60):
        flood = [m for m in session.messages if "id" not in m]
        for n, message in enumerate(flood):
            message["content"] = f"{tick}:{n}:" + "x" * 192_000
        await asyncio.sleep(0.1)
    elapsed = loop.time() - started + 2.0  # the start-up polls before `started`, generously
    dead = await stack.dlq()
    info = await stack.nc.jetstream().stream_info(stack.subjects.stream_name("dlq"))
    # Unbounded, 6 s of polls would have kept ~30 polls x 20 x 192 KB = 115 MB.
    assert 1 <= len(dead) <= BURST + RATE_PER_S * elapsed + 1, len(dead)
    for body, headers in dead:
        assert len(body) <= KEEP_BYTES
        assert int(headers["size"]) > 192_000
        assert "id" in headers["reason"]
    assert info.state.bytes < 64 * 1024, info.state.bytes
    # Nothing after the flood is lost: the next good message still goes through.
    turn(stack, "after the flood")
    await wait_published(stack, 2)
    print(f"id-less flood: {len(dead)} DLQ entries, {info.state.bytes} bytes in {elapsed:.0f} s")


@pytest.mark.aip_family("audit_redaction", assertions=["sensitive_fields_redacted"])
async def test_credentials_in_tool_output_are_redacted_before_they_reach_the_bus(
    stack: Stack,
) -> None:
    fake_session(stack)
    turn(
        stack,
        "run the deploy",
        {
            "role": "tool",
            "tool_name": "terminal",
            "content": json.dumps({"api_key": "sk-live-0123456789abcdef", "result": "ok"}),
        },
        {
            "role": "tool",
            "tool_name": "terminal",
            "content": "HTTP 200\nAuthorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload\n"
            "export DB_PASSWORD=hunter2-correct-horse\ndone",
        },
        {"role": "assistant", "content": "deployed; token: tok_abcdef123456 was used"},
        # Refused (unknown role) and kept on the DLQ: redacted there too.
        {"role": "wizard", "content": "my password=s3cr3t-value", "tool_name": "x"},
    )
    await stack.spawn("w1", **ingress_env(stack))
    await wait_published(stack, 4)
    found = [m for m, _ in await published(stack)]
    assert [m.role for m in found] == [
        ChannelRole.USER,
        ChannelRole.TOOL,
        ChannelRole.TOOL,
        ChannelRole.ASSISTANT,
    ]
    everything = "\n".join(m.content for m in found)
    for secret in (
        "sk-live-0123456789abcdef",
        "eyJhbGciOiJIUzI1NiJ9.payload",
        "hunter2-correct-horse",
        "tok_abcdef123456",
    ):
        assert secret not in everything
    assert json.loads(found[1].content) == {"api_key": "[redacted]", "result": "ok"}
    assert "HTTP 200" in found[2].content
    assert "done" in found[2].content
    assert "deployed" in found[3].content
    dead = await stack.dlq()
    assert len(dead) == 1
    assert b"s3cr3t-value" not in dead[0][0]
    assert b"[redacted]" in dead[0][0]
    assert ENDPOINT in stack.subjects.dlq(ENDPOINT)
