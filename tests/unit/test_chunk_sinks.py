"""Which callback targets the `aip.native.nats.v1` chunk sink accepts (no server needed:
the checks run before anything is published)."""

from __future__ import annotations

from typing import Any

import pytest

from worker.errors import NativeRefusal
from worker.gateway.chunk_sinks import NatsCallbackSinks

BINDING = "aip.v1.example_com.aip-hermes-worker.v1"


def sinks() -> NatsCallbackSinks:
    nc: Any = None  # never used: only the target checks run
    return NatsCallbackSinks(
        nc, bus_prefix="aip", route_prefixes=["aip.hermes.h1", "tools.x"], binding_subject=BINDING
    )


@pytest.mark.parametrize(
    ("target", "subject"),
    [
        ("client.callbacks.one", "client.callbacks.one"),
        ("_INBOX.abc.def", "_INBOX.abc.def"),
        ("nats:///client/cb/x", "client.cb.x"),
        (f"{BINDING}.stream.corr_1", f"{BINDING}.stream.corr_1"),
        ("aip.v1.other_td.other-service.v1.stream.c", "aip.v1.other_td.other-service.v1.stream.c"),
    ],
)
def test_accepted_targets(target: str, subject: str) -> None:
    assert sinks().subject_of(target) == subject


@pytest.mark.parametrize(
    "target",
    [
        "",
        "a..b",
        "a.*.b",
        "a.>",
        "with space",
        "nats://elsewhere:4222/a/b",
        "nats://a/b",
        "$JS.API.STREAM.LIST",
        "$SYS.REQ.X",
        "aip.hermes.h1.actions",
        "aip.runtime.queue.act_0",
        "aip",
        "tools.x.actions",
        f"{BINDING}.aip_core_v1_action",
        BINDING,
        "x" * 513,
    ],
)
def test_refused_targets(target: str) -> None:
    with pytest.raises(NativeRefusal) as refused:
        sinks().subject_of(target)
    assert refused.value.code == "action.invalid_input"
