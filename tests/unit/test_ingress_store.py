"""Channel ingress's session lease and cursor (`worker.store.ingress_store`, the guarantees
in `ingress_*.lua`), against a real Redis over both of the client's paths."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from schemas.ids import new_action_id
from worker.store.ingress_store import IngressStore
from worker.store.keys import CHANNEL_NAMESPACE, IngressKeys


def _session() -> IngressKeys:
    return IngressKeys.of("h1", "sess-" + new_action_id()[4:20])


async def test_one_follower_holds_a_session_and_only_it_moves_the_cursor_forward(
    store_client: Any,
) -> None:
    store = IngressStore(store_client)
    keys = _session()
    assert await store.cursor(keys) == -1
    assert await store.hold(keys, "w1#a", 5_000)
    assert await store.hold(keys, "w1#a", 5_000)  # its own lease is renewed
    assert not await store.hold(keys, "w2#b", 5_000)
    assert await store.advance(keys, "w1#a", 5)
    assert await store.advance(keys, "w1#a", 3)  # held, but never backwards
    assert await store.cursor(keys) == 5
    assert not await store.advance(keys, "w2#b", 9)  # not the holder: nothing written
    assert await store.cursor(keys) == 5
    assert not await store.release(keys, "w2#b")
    assert await store.release(keys, "w1#a")
    assert await store.hold(keys, "w2#b", 5_000)  # a released session is taken at once


async def test_an_expired_lease_is_taken_over(store_client: Any) -> None:
    store = IngressStore(store_client)
    keys = _session()
    assert await store.hold(keys, "w1#a", 100)
    await asyncio.sleep(0.2)
    assert await store.hold(keys, "w2#b", 5_000)
    assert not await store.advance(keys, "w1#a", 1)


def test_the_keys_share_one_slot_and_refuse_what_the_grammar_does() -> None:
    keys = IngressKeys.of("h1", "sess_1")
    assert keys.lease == f"{CHANNEL_NAMESPACE}:{{h1:sess_1}}:lease"
    assert keys.cursor == f"{CHANNEL_NAMESPACE}:{{h1:sess_1}}:cursor"
    with pytest.raises(ValueError, match="endpoint"):
        IngressKeys.of("H 1", "sess_1")
    with pytest.raises(ValueError, match="session"):
        IngressKeys.of("h1", "a}b")
